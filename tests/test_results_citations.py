"""Every ``results/...`` path the README and the documentation pages cite is in the repository.

The pages' Markdown links into ``results/`` are checked by the strict site build
(``docs/hooks/results_files.py``), but most citations are not links: the ``--out`` folder of a
command, an output folder named in prose ("outputs in ``results/...``"). A folder renamed or
removed under ``results/`` must break here, not in the hands of a reader looking for the evidence
of a number. A cited path may be a pattern: ``*`` matches within a name
(``results/unseen-docs/whole-windows-*``) and ``{a,b}`` names alternatives
(``results/x/markdown-docs-{splitter,sentence}-128``); each must match something. A path
ending in ``...`` names the ``results/`` folder itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"(?<![\w/.-])(?:\.\./)*(?P<path>results/(?:[\w./*{},-]*[\w/*}])?)")
BRACES = re.compile(r"\{(?P<options>[^{}]*)\}")


def cited_paths(text: str) -> list[tuple[int, str]]:
    """``(line, path)`` for every ``results/...`` path in ``text``, the ``../`` of a link dropped."""
    return [(text.count("\n", 0, m.start()) + 1, m["path"]) for m in CITED.finditer(text)]


def alternatives(pattern: str) -> list[str]:
    """``pattern`` with each ``{a,b}`` expanded, left to right: ``x-{a,b}`` -> ``[x-a, x-b]``."""
    m = BRACES.search(pattern)
    if m is None:
        return [pattern]
    return [
        expanded
        for option in m["options"].split(",")
        for expanded in alternatives(pattern[: m.start()] + option + pattern[m.end() :])
    ]


def resolves(pattern: str, root: Path = ROOT) -> bool:
    """Whether every alternative of ``pattern`` names at least one file or folder under ``root``."""
    return all(any(root.glob(path.rstrip("/"))) if "*" in path else (root / path).exists() for path in alternatives(pattern))


def test_citations_are_read_with_their_patterns() -> None:
    text = (
        "Outputs in `results/a/` and [`b`](../results/b/summary.md);\n"
        "`--out results/c-{x,y}-128`, `results/d-*`, `../results/...`, results/e."
    )
    assert cited_paths(text) == [
        (1, "results/a/"),
        (1, "results/b/summary.md"),
        (2, "results/c-{x,y}-128"),
        (2, "results/d-*"),
        (2, "results/"),
        (2, "results/e"),
    ]
    assert alternatives("results/c-{x,y}-{1,2}") == ["results/c-x-1", "results/c-x-2", "results/c-y-1", "results/c-y-2"]


def test_a_missing_path_or_alternative_does_not_resolve(tmp_path: Path) -> None:
    (tmp_path / "results" / "c-x-128").mkdir(parents=True)
    assert resolves("results/c-x-128", tmp_path)
    assert resolves("results/c-*", tmp_path)
    assert not resolves("results/c-{x,y}-128", tmp_path)
    assert not resolves("results/d-*", tmp_path)
    assert not resolves("results/c-x-128/summary.md", tmp_path)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_cited_results_paths_exist(page: Path) -> None:
    missing = [
        f"{page.relative_to(ROOT)}:{line}: {path}"
        for line, path in cited_paths(page.read_text(encoding="utf-8"))
        if not resolves(path)
    ]
    assert not missing, "cited results/ paths that are not in the repository:\n" + "\n".join(missing)
