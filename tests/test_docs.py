"""The documentation site builds in strict mode, reads offline, documents every field, and the
README's links land on it.

``mkdocs build --strict`` fails on a broken link or anchor, a page missing from the nav, an
API reference to a name that no longer exists, a snippet of the README that is not there, or a
link to a ``results/`` file that is not there (``docs/hooks/results_files.py``). The README is
not part of the site, so its links to ``docs/`` pages and their anchors are checked against the
built pages here. The site is read from ``file://`` too: its links name ``.html`` files and it
loads no script from the network. Every pydantic model on an API page lists its fields with
their descriptions, and every integration class its constructor parameters.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from test_readme_quickstart import quickstart_blocks

ROOT = Path(__file__).resolve().parent.parent
README_LINK = re.compile(r"\]\((?!https?://|#)(?P<path>[^)#\s]+)(?:#(?P<anchor>[^)\s]+))?\)")
NAV_LINK = re.compile(r'<a href="(?P<href>[^"]*)" class="md-nav__link')
DIRECTIVE = re.compile(r"^::: (?P<identifier>[\w.]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built by ``mkdocs build --strict`` into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _plain(markup: str) -> str:
    """Text as a reader sees it: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", markup)).split())


def _as_shown(description: str) -> str:
    """A field description as the page should show it: its text, the backticks of its code
    names rendered away, whitespace collapsed (``<`` and ``&`` shown as they are)."""
    return " ".join(description.replace("`", "").split())


def _section(page: str, identifier: str) -> str:
    """The part of ``page`` documenting ``identifier``: from its heading to the next top-level one."""
    start = page.find(f'id="{identifier}"')
    assert start >= 0, f"{identifier} has no heading on its page"
    end = page.find("<h2 ", start + 1)
    return page[start : end if end >= 0 else len(page)]


def _documented(site: Path) -> list[tuple[Path, str, Any]]:
    """``(built page, identifier, object)`` of every ``::: identifier`` on the API pages."""
    found = []
    for source in sorted((ROOT / "docs" / "api").glob("*.md")):
        for m in DIRECTIVE.finditer(source.read_text(encoding="utf-8")):
            module, _, name = m["identifier"].rpartition(".")
            found.append((site / "api" / f"{source.stem}.html", m["identifier"], getattr(importlib.import_module(module), name)))
    return found


def _own_fields(model: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``model`` that this package declares and no base class of LangChain, LlamaIndex
    or pydantic does (those document their own, e.g. a vector store's ``stores_text``):
    name -> FieldInfo."""
    own = {}
    for name, info in model.model_fields.items():
        declared_in = [k.__module__ for k in model.__mro__ if name in vars(k).get("__annotations__", {})]
        if all(module.startswith("nest_integrations.") for module in declared_in):
            own[name] = info
    return own


def _parameter_rows(section: str) -> dict[str, str]:
    """The rows of the Parameters tables in ``section``: parameter name -> its description as text."""
    rows = re.findall(
        r'<tr class="doc-section-item">\s*<td>\s*<code>(\w+)</code>.*?<div class="doc-md-description">(.*?)</div>',
        section, re.DOTALL,
    )
    return {name: _plain(description) for name, description in rows}


def test_api_reference_renders_docstrings(site):
    config = _text(site / "api" / "config.html")
    assert "min_passage_relevance" in config and "Relevance gate" in config
    decoder = _text(site / "api" / "decoder.html")
    assert "generate_batch" in decoder and "Generate one attributed continuation" in decoder
    for page in ("langchain", "llama_index"):
        assert "NestVectorStore" in _text(site / "api" / f"{page}.html")
    # One docstring style: Google sections, code after a "::" paragraph, shown as Sphinx shows it.
    for page in (site / "api").glob("*.html"):
        assert ".. code-block::" not in _text(page), f"{page.name} shows reStructuredText directives"
        assert "::</p>" not in _text(page), f"{page.name} shows a literal block's '::'"


def test_guides_show_the_readme_quick_starts(site):
    """The guides' quick starts are the README's blocks, included from it (the copy
    tests/test_readme_quickstart.py runs), not copies that could drift."""
    guides = {"python": "index", "langchain": "langchain", "llama_index": "llama_index", "qdrant": "scale"}
    for name, guide in guides.items():
        page = _plain(_text(site / f"{guide}.html"))
        for block in quickstart_blocks(name):
            assert " ".join(block.split()) in page, f"{guide}.html lacks the README's {name} quick start"
        assert '--8<-- "README.md:' in (ROOT / "docs" / f"{guide}.md").read_text(encoding="utf-8")


def test_output_contract_page_lists_every_field_with_its_description(site):
    page = _text(site / "api" / "output.html")
    shown = {obj.__name__: (identifier, obj) for path, identifier, obj in _documented(site) if path.name == "output.html"}
    for name in ("NestOutput", "Span", "SourceLocation", "GenerationStats"):
        identifier, model = shown[name]
        for field, info in model.model_fields.items():
            assert info.description, f"{name}.{field} has no description"
            section = _section(page, f"{identifier}.{field}")
            assert _as_shown(info.description) in _plain(section), f"{name}.{field}: its description is not shown"


def test_every_model_and_integration_class_documents_its_constructor(site):
    """Each pydantic model on an API page shows its own fields with their descriptions; each
    class of the integrations shows its constructor's named parameters with a description."""
    missing = []
    for page_path, identifier, obj in _documented(site):
        if not inspect.isclass(obj):
            continue
        page = _text(page_path)
        section = _section(page, identifier)
        if issubclass(obj, BaseModel):
            for field, info in _own_fields(obj).items():
                if f'id="{identifier}.{field}"' not in section:
                    missing.append(f"{identifier}.{field}: not listed")
                elif not info.description or _as_shown(info.description) not in _plain(_section(page, f"{identifier}.{field}")):
                    missing.append(f"{identifier}.{field}: no description shown")
        if obj.__module__.startswith(("nest_integrations.langchain", "nest_integrations.llama_index")) and "__init__" in vars(obj):
            named = inspect.signature(obj.__init__).parameters.values()
            arguments = [p.name for p in named if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            rows = _parameter_rows(section)
            missing += [f"{identifier}({name}=...): no description" for name in arguments if not rows.get(name)]
    assert not missing, "\n".join(missing)


def test_results_are_part_of_the_site(site):
    assert (site / "results" / "scale" / "scale.png").is_file()
    assert "ROUGE-1" in _text(site / "results" / "bio" / "summary.html")


def test_site_reads_from_the_file_system(site):
    """Opened as file://, a link to a folder shows a directory listing, and scripts from the
    network do not load: every nav link names an .html file of the site, the search index is
    inlined into a script, and the file:// worker shim is a file of the site."""
    for page in (site / "index.html", site / "api" / "output.html", site / "results" / "bio" / "summary.html"):
        links = [m["href"] for m in NAV_LINK.finditer(_text(page)) if not m["href"].startswith("#")]
        assert len(links) > 20, f"{page.name}: the navigation is missing"
        for href in links:
            target = href.split("#", 1)[0]
            assert target.endswith(".html"), f"{page.relative_to(site)} links to {href!r}, not a file"
            assert (page.parent / target).resolve().is_file(), f"{page.relative_to(site)} links to {href!r}: no such file"
    index = _text(site / "index.html")
    assert not re.search(r'<script[^>]+src="https?://', index), "a script would come from the network"
    assert (site / "search" / "search_index.js").read_text(encoding="utf-8").startswith("var __index = ")
    shim = re.search(r'<script src="(?P<src>[^"]*iframe-worker[^"]*)"', index)
    assert shim and (site / shim["src"]).is_file()


def test_readme_links_resolve(site):
    links = [m for m in README_LINK.finditer((ROOT / "README.md").read_text(encoding="utf-8"))]
    assert any(m["path"].startswith("docs/") for m in links), "the README links to the documentation"
    for m in links:
        path = ROOT / m["path"]
        assert path.exists(), f"README links to {m['path']}, which does not exist"
        if m["anchor"] and m["path"].startswith("docs/") and m["path"].endswith(".md"):
            page = site / Path(m["path"]).relative_to("docs").with_suffix(".html")
            assert f'id="{m["anchor"]}"' in _text(page), f"README links to {m['path']}#{m['anchor']}: no such heading"
