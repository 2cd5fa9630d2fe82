"""The README's LangChain and LlamaIndex quick starts run as they are written.

The fenced ``python`` blocks that follow a ``<!-- quickstart:NAME -->`` comment
in README.md are executed in order, in one namespace per NAME, with the working
directory a temporary folder holding ``my_docs/``: four short files about a
made-up CLI tool (quill). The real default model and embedder answer; the
citations must be verbatim text of those files, and the lines the quick starts
print must say where: the printed character range, applied to the printed file,
gives the cited text, on the printed lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- quickstart:(?P<name>[\w-]+) -->\s*\n```python\n(?P<code>.*?)\n```", re.DOTALL)

MY_DOCS = {
    "configuration.md": (
        "# Configuring quill\n\n"
        "quill reads its settings from quill.toml in the project root. The cache_dir setting names the folder "
        "where quill keeps downloaded templates; it defaults to ~/.cache/quill. Set QUILL_CACHE_DIR in the "
        "environment to override it for one run.\n"
    ),
    "commands.txt": (
        "quill build renders every page of the site into the out folder. quill serve starts a local preview "
        "server on port 8040 and rebuilds pages when their sources change. quill clean removes the out folder "
        "and the cache.\n"
    ),
    "plugins.txt": (
        "Plugins are Python packages that register a quill.plugins entry point. A plugin is enabled by adding "
        "its name to the plugins list in quill.toml, and it receives every page after rendering and before "
        "writing.\n"
    ),
    "guides/troubleshooting.md": (
        "If quill serve reports that the port is in use, pass --port with another number. A build that stops "
        'with "template not found" usually means the cache is stale: run quill clean and build again.\n'
    ),
}


_CITED = re.compile(
    r"^(?P<text>'.*'|\".*\") <- (?P<file>.+) lines (?P<first>\d+)-(?P<last>\d+), chars (?P<start>\d+)-(?P<end>\d+)$",
    re.MULTILINE,
)


def assert_printed_citations_point_into_files(out: str) -> int:
    """Every ``'text' <- FILE lines A-B, chars S-E`` line of ``out`` names a file whose characters
    ``S:E`` are the cited text, on lines ``A`` to ``B``; returns how many lines there were."""
    printed = list(_CITED.finditer(out))
    for m in printed:
        cited, start, end = ast.literal_eval(m["text"]), int(m["start"]), int(m["end"])
        text = Path(m["file"]).read_text(encoding="utf-8")
        assert text[start:end] == cited, f"{m[0]}: the file holds {text[start:end]!r} there"
        lines = (text.count("\n", 0, start) + 1, text.count("\n", 0, max(end - 1, start)) + 1)
        assert (int(m["first"]), int(m["last"])) == lines, f"{m[0]}: the text sits on lines {lines}"
    return len(printed)


def quickstart_blocks(name: str) -> list[str]:
    """The README's ``quickstart:<name>`` code blocks, in order."""
    return [m["code"] for m in _BLOCK.finditer(README.read_text(encoding="utf-8")) if m["name"] == name]


def test_readme_marks_every_quick_start():
    for name in ("python", "langchain", "llama_index", "qdrant"):
        assert quickstart_blocks(name), f"README.md has no <!-- quickstart:{name} --> block"
    for name in ("langchain", "llama_index"):
        blocks = quickstart_blocks(name)
        assert blocks, f"README.md has no <!-- quickstart:{name} --> block"
        assert '"my_docs"' in blocks[0], "the quick start starts from the user's folder"


@pytest.fixture
def my_docs(tmp_path, monkeypatch) -> str:
    for relative, text in MY_DOCS.items():
        path = tmp_path / "my_docs" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return "\n".join(MY_DOCS.values())


def _run(name: str) -> dict:
    namespace: dict = {"__name__": f"readme_quickstart_{name}"}
    for n, code in enumerate(quickstart_blocks(name)):
        exec(compile(code, f"README.md:quickstart:{name}[{n}]", "exec"), namespace)
    return namespace


def test_python_quickstart(tmp_path, monkeypatch, capsys):
    """The Python quick start as written, over four of the bundled summaries instead of the whole
    People topic (encoding 1,894 summaries takes minutes): each printed range is where the copied
    text sits in its summary."""
    import nest_integrations

    people = nest_integrations.load_wikipedia_summaries(topic="People")
    few = [p for p in people if p.title in {"Ada Lovelace", "Charles Babbage", "Alan Turing", "Marie Curie"}]
    assert len(few) == 4
    monkeypatch.setattr(nest_integrations, "load_wikipedia_summaries", lambda topic=None, limit=None: few)
    monkeypatch.chdir(tmp_path)
    ns = _run("python")
    out, printed = ns["out"], capsys.readouterr().out
    assert out.copied_spans, "the answer copies from Ada Lovelace's summary"
    summaries = {p.title: p.text for p in few}
    for span in out.copied_spans:
        where = span.source.location
        assert summaries[span.source.title][where.char_start : where.char_end] == span.text
        assert f"<- {span.source.title} {where.describe()}" in printed
    assert (tmp_path / "idx" / "people").is_dir()


def test_langchain_quickstart(my_docs, capsys):
    pytest.importorskip("langchain_text_splitters")
    ns = _run("langchain")
    citations = [c for block in ns["message"].content_blocks for c in block.get("annotations", [])]
    assert citations, "the answer copies from the user's files"
    for c in citations:
        assert c["cited_text"] in my_docs
        assert ns["message"].text[c["start_index"] : c["end_index"]] == c["cited_text"]
    out = capsys.readouterr().out
    assert "Sources:" in out and "my_docs/" in out
    assert assert_printed_citations_point_into_files(out) == len(citations), out


def test_llama_index_quickstart(my_docs, capsys):
    pytest.importorskip("llama_index.core")
    ns = _run("llama_index")
    response = ns["response"]
    citations = response.metadata["citations"]
    assert citations and response.source_nodes, "the answer copies from the user's files"
    for c in citations:
        assert c["text"] in my_docs
        assert response.response[c["answer_start"] : c["answer_end"]] == c["text"]
    assert len(ns["chat_engine"].chat_history) == 4
    assert assert_printed_citations_point_into_files(capsys.readouterr().out) == len(citations)


def test_qdrant_first_stage_snippet(my_docs, capsys):
    pytest.importorskip("langchain_qdrant")
    ns = _run("qdrant")
    output = ns["output"]
    assert output.copied_spans, "the answer copies from the Qdrant collection's documents"
    for span in output.copied_spans:
        assert span.text in my_docs and span.source.metadata["passage_id"]
    assert "my_docs/" in capsys.readouterr().out
    ns["store"].client.close()
