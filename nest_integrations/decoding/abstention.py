"""What a copying mode answers when no retrieved passage answers: a plain abstention.

A small LM answering a question on its own invents ("connect the circuit breaker to
your power supply"), and its text reads like an answer. When the first stage returns
nothing, or the relevance gate keeps nothing, ``nest`` and ``ra_nest`` answer a chat
prompt with :func:`abstention_text` instead (``NestConfig.fallback = "abstain"``, the
default; ``finish_reason`` ``"not_covered"``): it says the documents do not cover the
question and names the sections the first stage found nearest, so a reader knows
where to look. Nothing of it is copied, so it cites nothing.
"""

from __future__ import annotations

from typing import Sequence

from nest_integrations.corpus.markdown_structure import copy_layout, parse_blocks
from nest_integrations.corpus.passages import Passage
from .attribution import document_name

__all__ = ["NOT_COVERED", "SEE_ALSO_SECTIONS", "abstention_text", "see_also"]

NOT_COVERED = "The documents do not cover this question."
"""The abstention's first sentence: what the reader needs to know first."""

SEE_ALSO_SECTIONS = 3
"""Nearest sections named after the abstention: enough to look further, few enough to read."""


def _section_label(passage: Passage) -> str:
    """``document`` or ``document (section title)``: the passage's document name
    (:func:`~nest_integrations.decoding.attribution.document_name`) and, for a Markdown
    passage, the innermost heading its first block sits under."""
    name = document_name(passage.metadata, passage.doc_id or passage.id)
    if copy_layout(passage.text) is None:
        return name
    blocks = parse_blocks(passage.text)
    path = blocks[0].heading_path if blocks else ()
    return f"{name} ({path[-1]})" if path else name


def see_also(passages: Sequence[Passage], limit: int = SEE_ALSO_SECTIONS) -> list[str]:
    """Labels of the first ``limit`` distinct sections among ``passages`` (retrieval order,
    best first; :func:`_section_label`)."""
    labels: list[str] = []
    for passage in passages:
        label = _section_label(passage)
        if label not in labels:
            labels.append(label)
        if len(labels) == limit:
            break
    return labels


def abstention_text(passages: Sequence[Passage]) -> str:
    """:data:`NOT_COVERED`, then ``See also: a; b; c.`` naming the nearest sections of the
    retrieved ``passages`` (:func:`see_also`; nothing when none was retrieved)."""
    nearest = see_also(passages)
    return NOT_COVERED + (f"\nSee also: {'; '.join(nearest)}." if nearest else "")
