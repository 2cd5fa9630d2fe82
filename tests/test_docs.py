"""The documentation site builds in strict mode, and the README's links land on it.

``mkdocs build --strict`` fails on a broken link or anchor, a page missing from the nav, an
API reference to a name that no longer exists, or a link to a ``results/`` file that is not
there (``docs/hooks/results_files.py``). The README is not part of the site, so its links to
``docs/`` pages and their anchors are checked against the built pages here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LINK = re.compile(r"\]\((?!https?://|#)(?P<path>[^)#\s]+)(?:#(?P<anchor>[^)\s]+))?\)")


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


def test_api_reference_renders_docstrings(site):
    config = _text(site / "api" / "config" / "index.html")
    assert "min_passage_relevance" in config and "Relevance gate" in config
    decoder = _text(site / "api" / "decoder" / "index.html")
    assert "generate_batch" in decoder and "Generate one attributed continuation" in decoder
    for page in ("langchain", "llama_index"):
        assert "NestVectorStore" in _text(site / "api" / page / "index.html")


def test_results_are_part_of_the_site(site):
    assert (site / "results" / "scale" / "scale.png").is_file()
    assert "ROUGE-1" in _text(site / "results" / "bio" / "summary" / "index.html")


def test_readme_links_resolve(site):
    links = [m for m in README_LINK.finditer((ROOT / "README.md").read_text(encoding="utf-8"))]
    assert any(m["path"].startswith("docs/") for m in links), "the README links to the documentation"
    for m in links:
        path = ROOT / m["path"]
        assert path.exists(), f"README links to {m['path']}, which does not exist"
        if m["anchor"] and m["path"].startswith("docs/") and m["path"].endswith(".md"):
            page = site / Path(m["path"]).relative_to("docs").with_suffix("")
            page = site / "index.html" if page.name == "index" else page / "index.html"
            assert f'id="{m["anchor"]}"' in _text(page), f"README links to {m['path']}#{m['anchor']}: no such heading"
