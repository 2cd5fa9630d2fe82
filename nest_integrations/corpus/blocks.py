"""The blocks of a structured text (Markdown, reStructuredText) in character offsets.

The two readers (:mod:`nest_integrations.corpus.markdown_structure`,
:mod:`nest_integrations.corpus.rst_structure`) return the same :class:`Block`\\ s, so
chunking and the copy rules do not ask which markup a passage is written in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

BlockKind = Literal[
    "front_matter", "heading", "paragraph", "list_item", "table", "code", "comment", "html", "link_definition", "rule",
    "directive",
]

HIDDEN_KINDS: frozenset[str] = frozenset(
    {"front_matter", "heading", "comment", "html", "link_definition", "rule", "directive"}
)
"""Block kinds a reader does not see as text: never copied (a heading stays in its passage as context)."""

ADORNMENT_CHARACTER = r"[!-/:-@\[-`{-~]"
"""Regex class of the characters a title's underline or overline repeats: any printable ASCII
punctuation (reStructuredText's adornments; Markdown's Setext ``=`` and ``-`` among them)."""


@dataclass(frozen=True)
class Block:
    """One block of a structured text.

    Attributes:
        kind: what the block is (see :data:`BlockKind`); a paragraph inside a
            list item is ``"list_item"``; ``"directive"`` is a reStructuredText
            directive's own lines (``.. code-block:: python`` and its options),
            not its body.
        start: offset of the block's first non-blank character in the text.
        end: offset just past its last non-blank character, so
            ``text[start:end]`` is the block without surrounding whitespace
            (a heading's ``#`` marks or underline, a fence's backticks and a list
            item's marker included).
        heading_path: titles of the headings the block sits under, outermost
            first, e.g. ``("Reply", "Methods", ".send(data)")``; a heading's
            path ends with its own title.
        level: a heading's level (1-6); 0 for other blocks.
    """

    kind: BlockKind
    start: int
    end: int
    heading_path: tuple[str, ...] = ()
    level: int = 0

    @property
    def copyable(self) -> bool:
        """Whether a reader sees the block as text (see :data:`HIDDEN_KINDS`)."""
        return self.kind not in HIDDEN_KINDS


def line_starts(text: str) -> list[int]:
    """Offset of the first character of every line of ``text``, plus ``len(text)`` at the end: int list (lines + 1,)."""
    return [0, *(m.end() for m in re.finditer(r"\n", text)), len(text)] if text else [0]


def trimmed_range(text: str, lines: list[int], first: int, stop: int) -> tuple[int, int] | None:
    """``(start, end)`` of lines ``[first, stop)`` (``lines`` from :func:`line_starts`) without
    surrounding whitespace; None when blank."""
    lo, hi = lines[min(first, len(lines) - 1)], lines[min(stop, len(lines) - 1)]
    piece = text[lo:hi]
    stripped = piece.strip()
    if not stripped:
        return None
    start = lo + len(piece) - len(piece.lstrip())
    return start, start + len(stripped)
