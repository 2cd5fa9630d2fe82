"""What a copying mode answers when no retrieved passage answers: a plain abstention.

A small LM answering a question on its own invents ("connect the circuit breaker to
your power supply"), and its text reads like an answer. When the first stage returns
nothing, the relevance gate keeps nothing, or the question names something the corpus
never mentions (:mod:`~nest_integrations.policy.mentions`), ``nest`` and ``ra_nest`` answer a chat
prompt with :func:`abstention_text` instead (``NestConfig.fallback = "abstain"``, the
default; ``finish_reason`` ``"not_covered"``): it says the documents do not cover the
question and names the sections the first stage found nearest, so a reader knows
where to look. Nothing of it is copied, so it cites nothing.
"""

from __future__ import annotations

import os
from typing import Sequence

from nest_integrations.corpus.markdown_structure import copy_layout, parse_blocks
from nest_integrations.corpus.passages import Passage
from .output import document_name

__all__ = ["NOT_COVERED", "SEE_ALSO_SECTIONS", "abstention_text", "see_also"]

NOT_COVERED = "The documents do not cover this question."
"""The abstention's first sentence: what the reader needs to know first."""

SEE_ALSO_SECTIONS = 3
"""Nearest sections named after the abstention: enough to look further, few enough to read."""


def _section(passage: Passage) -> tuple[str, str]:
    """The passage's document name (:func:`~nest_integrations.decoding.output.document_name`)
    and, for a Markdown passage, the innermost heading its first block sits under (``""`` for none)."""
    name = document_name(passage.metadata, passage.doc_id or passage.id)
    if copy_layout(passage.text) is None:
        return name, ""
    blocks = parse_blocks(passage.text)
    path = blocks[0].heading_path if blocks else ()
    return name, path[-1] if path else ""


def _without_common_folder(names: Sequence[str]) -> list[str]:
    """File paths less the folder all of them share (``/srv/docs/api.md`` -> ``api.md``): the
    reader knows which documents they asked; other names as they are."""
    paths = [name for name in names if os.sep in name]
    folders = {os.path.isabs(name) for name in paths}
    if not paths or len(folders) > 1:
        return list(names)
    common = os.path.commonpath([os.path.dirname(name) or "." for name in paths])
    return [os.path.relpath(name, common) if name in paths and common else name for name in names]


def see_also(passages: Sequence[Passage], limit: int = SEE_ALSO_SECTIONS) -> list[str]:
    """The first ``limit`` distinct sections among ``passages`` (retrieval order, best first), one
    entry a document: ``document`` or ``document (title; title)`` with its sections' titles in
    that order, the documents' common folder left out. A document named once reads as a list of
    places to look, where three sections of one file read as the file three times."""
    sections: list[tuple[str, str]] = []
    for passage in passages:
        section = _section(passage)
        if section not in sections:
            sections.append(section)
        if len(sections) == limit:
            break
    titles: dict[str, list[str]] = {}
    for name, title in sections:
        titles.setdefault(name, [])
        if title:
            titles[name].append(title)
    names = _without_common_folder(list(titles))
    return [f"{shown} ({'; '.join(titles[name])})" if titles[name] else shown for shown, name in zip(names, titles)]


def abstention_text(passages: Sequence[Passage], unmentioned: Sequence[str] = ()) -> str:
    """:data:`NOT_COVERED`; ``They never mention X, Y.`` for the names of the question the corpus
    never mentions (:mod:`~nest_integrations.policy.mentions`), when that is why; then ``See also:
    a; b; c.`` naming the nearest sections of the retrieved ``passages`` (:func:`see_also`;
    nothing when none was retrieved)."""
    nearest = see_also(passages)
    never = f" They never mention {', '.join(unmentioned)}." if unmentioned else ""
    return NOT_COVERED + never + (f"\nSee also: {'; '.join(nearest)}." if nearest else "")
