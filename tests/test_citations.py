"""Citations a reader can follow: the document, its character and line range, numbered sources,
and markers that rendered Markdown shows.

The Markdown tests build outputs by hand (spans whose copied text opens fences or sits in inline
code) and render them with markdown-it-py; the store tests run the tiny random Llama of
conftest.py over files on disk, through LangChain and LlamaIndex, where retrieval dominates
(alpha=5, delta=1, gamma=1e-6) so spans get copied.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Optional

import pytest
from markdown_it import MarkdownIt

from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.locations import locate
from nest_integrations.decoding.output import NestOutput, SourceLocation, Span, SpanSource, chunk_offsets
from nest_integrations.decoding.rendering import cited_documents, render_html, render_markdown
from nest_integrations.decoding.spans import merge_spans, shift_spans

KNOBS = dict(alpha=5.0, delta=1.0, gamma=1e-6, max_new_tokens=24, min_passage_relevance=-1.0)
KEEPER = (
    "# The keeper\n"
    "\n"
    "The lighthouse keeper logged every ship that passed the northern cape.\n"
    "Her notebooks record storms, fog banks and the slow return of the seals.\n"
    "\n"
    "In spring she repainted the lamp room and counted the gulls on the rocks.\n"
    "Visitors came by boat on Sundays to hear her stories of the winter gales.\n"
)


def lines_of(text: str, start: int, end: int) -> tuple[int, int]:
    """The 1-based lines ``text[start:end]`` sits on, counted the plain way."""
    return text[:start].count("\n") + 1, text[: end - 1].count("\n") + 1


# --------------------------------------------------------------------------- locate
def test_whole_document_passage_gives_lines_from_its_own_text():
    passage = Passage(id="notes.md", text=KEEPER, metadata={"source": "no/such/dir/notes.md"})
    start = KEEPER.index("Her notebooks")
    location = locate(passage, start, start + 40)
    assert location.document == "no/such/dir/notes.md" and location.document_id == "notes.md"
    assert (location.char_start, location.char_end) == (start, start + 40)
    assert (location.line_start, location.line_end) == (4, 4)
    assert location.label() == "no/such/dir/notes.md:4"


def test_chunk_offsets_come_from_the_file_and_lines_are_counted_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("keeper.md").write_text(KEEPER, encoding="utf-8")
    cut = KEEPER.index("In spring")
    chunk = Passage(id="c1", text=KEEPER[cut:], metadata={"source": "keeper.md"}, doc_id="keeper.md", doc_char_start=cut)
    location = locate(chunk, 0, len(chunk.text))
    assert (location.char_start, location.char_end) == (cut, len(KEEPER))
    assert (location.line_start, location.line_end) == (6, 7) == lines_of(KEEPER, cut, len(KEEPER))
    assert location.describe() == f"lines 6-7, chars {cut}-{len(KEEPER)}"
    # A chunk split without start_index claims offset 0; its only occurrence in the file fixes it.
    unplaced = Passage(id="c2", text=KEEPER[cut:], metadata={"source": "keeper.md"})
    assert locate(unplaced, 3, 10).model_dump() == {
        "document": "keeper.md", "document_id": "keeper.md", "char_start": cut + 3, "char_end": cut + 10,
        "line_start": 6, "line_end": 6,
    }


def test_a_compressed_document_is_read_for_its_lines(tmp_path, monkeypatch):
    import gzip

    monkeypatch.chdir(tmp_path)
    Path("keeper.md.gz").write_bytes(gzip.compress(KEEPER.replace("\n", "\r\n").encode("utf-8")))  # as Debian ships docs
    cut = KEEPER.index("In spring")
    chunk = Passage(id="c1", text=KEEPER[cut:], metadata={"path": "keeper.md.gz"}, doc_id="keeper.md.gz", doc_char_start=cut)
    location = locate(chunk, 0, len(chunk.text))
    assert (location.line_start, location.line_end) == (6, 7) == lines_of(KEEPER, cut, len(KEEPER))


def test_without_the_document_text_lines_come_from_start_line_or_are_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cut = KEEPER.index("In spring")
    hinted = Passage(id="c1", text=KEEPER[cut:], metadata={"source": "gone.md", "start_line": 6}, doc_id="gone.md", doc_char_start=cut)
    location = locate(hinted, KEEPER[cut:].index("Visitors"), len(KEEPER) - cut)
    assert (location.line_start, location.line_end) == (7, 7)
    bare = Passage(id="c1", text=KEEPER[cut:], metadata={"source": "gone.md"}, doc_id="gone.md", doc_char_start=cut)
    unknown = locate(bare, 0, 9)
    assert (unknown.char_start, unknown.char_end, unknown.line_start, unknown.line_end) == (cut, cut + 9, None, None)
    assert unknown.describe() == f"chars {cut}-{cut + 9}, lines unknown (document text not available)"
    assert unknown.label() == "gone.md"
    # A file that no longer holds the chunk is not trusted for lines.
    Path("gone.md").write_text("rewritten since\n", encoding="utf-8")
    assert locate(bare, 0, 9) == unknown


def test_cut_and_merged_spans_keep_their_locations():
    passage = Passage(id="notes", text=KEEPER)
    start = KEEPER.index("logged")
    end = KEEPER.index("In spring") + 9
    whole = Span(
        text=KEEPER[start:end], start=0, end=end - start, copied=True,
        source=SpanSource(id="notes", chunk_char_start=start, chunk_char_end=end, location=locate(passage, start, end)),
    )
    pieces = shift_spans([whole], 0, 20) + shift_spans([whole], 20, 75) + shift_spans([whole], 75, end - start)
    for piece in pieces:
        lo, hi = piece.source.chunk_char_start, piece.source.chunk_char_end
        assert piece.source.location == locate(passage, lo, hi)
    assert merge_spans(pieces) == [whole]


def test_outputs_saved_without_locations_still_read():
    span = {"text": "x", "start": 0, "end": 1, "copied": True,
            "source": {"id": "p1", "metadata": {"file_name": "a.md"}, "char_start": 4, "char_end": 5}}
    output = NestOutput.model_validate({"text": "x", "mode": "nest", "spans": [span]})
    location = output.spans[0].source.location
    assert (location.document, location.char_start, location.line_start) == ("a.md", None, None)
    assert (output.spans[0].source.chunk_char_start, output.spans[0].source.chunk_char_end) == (4, 5)
    assert "position in the document unknown" in render_markdown(output)


def chunk_span(cut: int, start: int, end: int) -> Span:
    """A span copied from ``KEEPER[start:end]`` through the chunk ``KEEPER[cut:]`` of keeper.md."""
    chunk = Passage(id="c1", text=KEEPER[cut:], metadata={"source": "keeper.md"}, doc_id="keeper.md", doc_char_start=cut)
    lo, hi = start - cut, end - cut
    return Span(
        text=KEEPER[start:end], start=0, end=end - start, copied=True,
        source=SpanSource(id="c1", chunk_char_start=lo, chunk_char_end=hi, location=locate(chunk, lo, hi)),
    )


def test_chunk_offsets_are_named_apart_from_document_offsets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keeper.md").write_text(KEEPER, encoding="utf-8")
    cut, start = KEEPER.index("Her notebooks"), KEEPER.index("storms")
    span = chunk_span(cut, start, start + len("storms, fog banks"))
    source = span.source
    assert KEEPER[cut:][source.chunk_char_start : source.chunk_char_end] == span.text
    assert KEEPER[source.location.char_start : source.location.char_end] == span.text
    assert source.chunk_char_start != source.location.char_start
    assert not hasattr(source, "char_start") and not hasattr(source, "char_end")  # removed in 0.2.0
    dumped = NestOutput(text=span.text, mode="nest", spans=[span]).to_dict()
    saved = dumped["spans"][0]["source"]
    assert "char_start" not in saved and "char_end" not in saved
    assert (saved["chunk_char_start"], saved["location"]["char_start"]) == (source.chunk_char_start, source.location.char_start)
    assert NestOutput.model_validate(dumped).spans == [span]
    assert NestOutput.model_validate_json(json.dumps(dumped)).spans == [span]
    assert chunk_offsets(saved) == (source.chunk_char_start, source.chunk_char_end)


SAVED_BY_0_1 = """{"text": "storms, fog banks", "mode": "nest", "spans": [{"text": "storms, fog banks", "start": 0,
  "end": 17, "copied": true, "source": {"id": "c1", "title": "", "metadata": {"source": "keeper.md"},
  "chunk_char_start": 24, "chunk_char_end": 41, "location": {"document": "keeper.md", "document_id": "keeper.md",
  "char_start": 60, "char_end": 77, "line_start": 3, "line_end": 3}, "char_start": 24, "char_end": 41}}]}"""
"""An output as 0.1 saved it: the span source's chunk offsets under their new keys and again under
the old ones, ``char_start`` / ``char_end`` (its location's char_start / char_end are document offsets)."""


@pytest.mark.parametrize("keys", ["both, as 0.1 wrote them", "the old ones alone"])
def test_an_output_saved_by_0_1_still_loads_into_the_chunk_offsets(keys):
    saved = json.loads(SAVED_BY_0_1)
    source = saved["spans"][0]["source"]
    if keys == "the old ones alone":
        del source["chunk_char_start"], source["chunk_char_end"]
    loaded = NestOutput.model_validate(saved).spans[0].source
    assert (loaded.chunk_char_start, loaded.chunk_char_end) == (24, 41)
    assert (loaded.location.char_start, loaded.location.char_end) == (60, 77)
    assert chunk_offsets(source) == (24, 41)
    rewritten = loaded.model_dump(mode="json")
    assert "char_start" not in rewritten and rewritten["location"]["char_start"] == 60


def test_an_old_chunk_offset_that_disagrees_with_the_new_one_is_refused_naming_both():
    saved = json.loads(SAVED_BY_0_1)
    saved["spans"][0]["source"]["char_end"] = 40
    with pytest.raises(ValueError, match="char_end=40 .*disagrees with chunk_char_end=41"):
        NestOutput.model_validate(saved)


def test_negative_chunk_offsets_are_refused_by_name():
    with pytest.raises(ValueError, match="chunk_char_start"):
        SpanSource(id="c1", chunk_char_start=-1, chunk_char_end=3, location=SourceLocation(document="a", document_id="a"))


# --------------------------------------------------------------------------- Markdown
def output_of(pieces: list[tuple[str, Optional[str]]]) -> NestOutput:
    """An output whose spans are ``pieces``: ``(text, document)``, document None for LM text."""
    spans, at = [], 0
    for text, document in pieces:
        source = None
        if document is not None:
            location = SourceLocation(document=document, document_id=document, char_start=100, char_end=100 + len(text), line_start=3, line_end=3 + text[:-1].count("\n"))
            source = SpanSource(id=f"{document}#0", title="", chunk_char_start=0, chunk_char_end=len(text), location=location)
        spans.append(Span(text=text, start=at, end=at + len(text), copied=document is not None, source=source))
        at += len(text)
    return NestOutput(text="".join(text for text, _ in pieces), mode="nest", spans=spans)


CODE_ANSWERS = {
    "span opens a fence and stops": [
        ("Install it first:\n\n```bash\npip install quill-site", "install.md"),
        ("\n\nThen run quill build in the project folder.", None),
    ],
    "span ends inside inline code": [
        ("Call ", None), ("`quill.build(drafts", "api.md"), ("=True)` to render drafts.", None),
        (" Pages are written to the out folder.", "configuration.md"),
    ],
    "span inside a fence the LM opened and closed": [
        ("Example:\n\n```toml\n", None), ('output_dir = "site"', "configuration.md"),
        ("\n```\n\nThe folder is created on the first build.", None),
    ],
    "fence in a list item, left open": [
        ("1. Install:\n\n   ```bash\n   pip install quill-site", "install.md"),
        ("\n2. Build the site with quill build.", None),
    ],
    "span ends with the fence closing the answer": [
        ("Use this:\n\n", None), ("```python\nimport quill\nquill.build()\n```", "api.md"),
    ],
    "two documents cited in one code block": [
        ("```toml\n", None), ('output_dir = "site"\n', "configuration.md"), ('theme = "plain"', "themes.txt"),
        ("\n```\nBoth settings live in quill.toml.", None),
    ],
    "fence in a block quote, left open": [
        ("> Run:\n>\n> ```bash\n> quill serve", "commands.txt"), ("\n\nIt serves on port 8040.", None),
    ],
    "inline code run left unclosed": [
        ("The flag ``--drafts", "commands.txt"), (" renders draft pages too.", None),
    ],
}


def visible_text(rendered: str) -> str:
    """What a reader sees as prose: the HTML without code blocks and code spans, tags stripped."""
    text = re.sub(r"<pre>.*?</pre>|<code>.*?</code>", " ", rendered, flags=re.DOTALL)
    return html.unescape(re.sub(r"<[^>]+>", "", text))


@pytest.mark.parametrize("name", sorted(CODE_ANSWERS))
def test_markdown_markers_are_visible_and_nothing_is_swallowed(name):
    from nest_integrations.langchain import cite_text

    output = output_of(CODE_ANSWERS[name])
    documents = cited_documents(output.spans)
    prose = [re.sub(r"^\d+\.\s+", "", text.strip()) for text, document in CODE_ANSWERS[name] if document is None and "`" not in text]
    for markdown in (render_markdown(output), cite_text(output)):
        rendered = MarkdownIt("commonmark").render(markdown)
        shown = visible_text(rendered)
        copied = [span for span in output.spans if span.copied]
        assert len(re.findall(r"\[\d\]", shown.split("Sources:")[0])) >= len({s.source.location.document for s in copied}), markdown
        for doc in documents:
            assert f"[{doc.number}]" in shown.split("Sources:")[0], (name, markdown)
            listing = html.unescape(re.sub(r"<[^>]+>", "", rendered.split("Sources:")[1]))
            assert f"[{doc.number}] {doc.document}: line" in listing, (name, markdown)
        for sentence in prose:
            # An LM sentence after a copied span is prose, not code, and whole.
            assert re.sub(r"\s+", " ", sentence.rstrip(".")) in re.sub(r"\s+", " ", shown), (name, markdown)
        assert rendered.count("<pre>") == rendered.count("</pre>")


def test_sources_are_listed_once_per_document_in_order_of_first_use():
    output = output_of([
        ("Pages go to the out folder.", "configuration.md"), (" Then ", None),
        ("quill serve starts a preview server.", "commands.txt"), (" Also ", None),
        ("The cache_dir setting names the theme folder.", "configuration.md"),
    ])
    documents = cited_documents(output.spans)
    assert [(d.number, d.document, len(d.locations)) for d in documents] == [(1, "configuration.md", 2), (2, "commands.txt", 1)]
    markdown = render_markdown(output)
    body, sources = markdown.split("Sources:")
    assert [int(n) for n in re.findall(r"\\\[(\d)\\\]", body)] == [1, 2, 1]
    assert sources.count("configuration.md") == 1 and "line 3, chars 100-127; line 3, chars 100-145" in sources
    page = render_html(output)
    assert page.count("<li>") == 2 and "configuration.md: line 3" in page


# --------------------------------------------------------------------------- stores
def write_manual(folder: Path) -> dict[str, str]:
    """Two Markdown files under ``folder``; returns their texts by path."""
    texts = {
        str(folder / "keeper.md"): KEEPER,
        str(folder / "gulls.md"): "# Gulls\n\nThe gulls nest on the rocks below the lamp room every spring.\nThey leave in autumn.\n",
    }
    for path, text in texts.items():
        Path(path).write_text(text, encoding="utf-8")
    return texts


def assert_located(document: str, char_start: int, char_end: int, line_start: int, line_end: int, cited: str, texts: dict[str, str]) -> None:
    """A citation's document range is the cited text in the file, on the lines it names."""
    text = texts[document]
    assert text[char_start:char_end] == cited
    assert (line_start, line_end) == lines_of(text, char_start, char_end)


def test_langchain_citations_name_the_file_characters_and_lines(tiny_lm, tmp_path):
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    from nest_integrations.langchain import ChatNest, NestVectorStore, cite_text

    texts = write_manual(tmp_path)
    docs = [Document(page_content=text, metadata={"source": path}) for path, text in texts.items()]
    chunks = RecursiveCharacterTextSplitter(chunk_size=80, chunk_overlap=0, add_start_index=True).split_documents(docs)
    store = NestVectorStore.from_documents(chunks, DeterministicFakeEmbedding(size=16), lm=tiny_lm)
    chat = ChatNest.from_lm(tiny_lm, retriever=store, passage_k=8, **KNOBS)
    message = chat.invoke("Tell me about the lighthouse keeper.")
    citations = [c for block in message.content_blocks for c in block.get("annotations", [])]
    assert citations
    for citation in citations:
        extras = citation["extras"]
        assert_located(extras["document"], extras["doc_char_start"], extras["doc_char_end"], extras["line_start"], extras["line_end"], citation["cited_text"], texts)
    rendered = cite_text(message)
    first = citations[0]["extras"]
    assert f"[1] {first['document']}: " in rendered and f"chars {first['doc_char_start']}-{first['doc_char_end']}" in rendered


def test_langchain_markdown_splitter_lines_without_the_file(tiny_lm):
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from nest_integrations.langchain import ChatNest, MarkdownSectionSplitter, NestVectorStore

    chunks = MarkdownSectionSplitter(chunk_size=80).split_documents([Document(page_content=KEEPER, metadata={"source": "not-on-disk/keeper.md"})])
    assert [c.metadata["start_line"] for c in chunks] == [KEEPER[: c.metadata["start_index"]].count("\n") + 1 for c in chunks]
    store = NestVectorStore.from_documents(chunks, DeterministicFakeEmbedding(size=16), lm=tiny_lm)
    message = ChatNest.from_lm(tiny_lm, retriever=store, passage_k=8, **KNOBS).invoke("Tell me about the lighthouse keeper.")
    citations = [c for block in message.content_blocks for c in block.get("annotations", [])]
    assert citations
    for citation in citations:
        extras = citation["extras"]
        assert extras["document"] == "not-on-disk/keeper.md"
        assert_located("k", extras["doc_char_start"], extras["doc_char_end"], extras["line_start"], extras["line_end"], citation["cited_text"], {"k": KEEPER})


def test_llama_index_citations_name_the_file_characters_and_lines(tiny_lm, tmp_path):
    from llama_index.core import Document, MockEmbedding, StorageContext, VectorStoreIndex
    from llama_index.core.base.llms.types import ChatMessage, CitationBlock
    from llama_index.core.node_parser import SentenceSplitter

    from nest_integrations.llama_index import NestLLM, NestQueryEngine, NestVectorStore

    texts = write_manual(tmp_path)
    documents = [Document(text=text, metadata={"file_path": path}) for path, text in texts.items()]
    storage = StorageContext.from_defaults(vector_store=NestVectorStore())
    embed = MockEmbedding(embed_dim=8)
    index = VectorStoreIndex.from_documents(
        documents, storage_context=storage, embed_model=embed, transformations=[SentenceSplitter(chunk_size=40, chunk_overlap=0)]
    )
    llm = NestLLM(tiny_lm, retriever=index, embed_model=embed, config={**KNOBS, "passage_k": 8})
    response = NestQueryEngine.from_index(index, llm, similarity_top_k=8).query("Tell me about the lighthouse keeper.")
    citations = response.metadata["citations"]
    assert citations
    for c in citations:
        assert_located(c["document"], c["doc_char_start"], c["doc_char_end"], c["line_start"], c["line_end"], c["text"], texts)
    sources = response.metadata["sources"]
    assert [s["document"] for s in sources] == list(dict.fromkeys(c["document"] for c in citations))
    assert [s["number"] for s in sources] == list(range(1, len(sources) + 1))

    answer = llm.chat([ChatMessage(role="user", content="Tell me about the lighthouse keeper.")]).message
    blocks = [b for b in answer.blocks if isinstance(b, CitationBlock)]
    assert blocks
    for block in blocks:
        where = block.additional_location_info
        assert_located(block.source, where["start_char_index"], where["end_char_index"], where["start_line"], where["end_line"], block.cited_content.text, texts)
