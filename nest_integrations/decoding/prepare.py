"""Where an answer opens: the copy plan a generation starts with, made before its first step.

:func:`plan_opening` sets a chat request's :class:`~nest_integrations.decoding.generation.Generation`
``opening`` (the first copy proposed), ``window_end`` and ``next_windows`` (the answer
windows to copy, in order), and masks the candidate entries outside the windows;
:class:`~nest_integrations.decoding.step.StepRules` consumes the plan step by step
(``propose`` takes the opening, ``commit`` moves from one window to the next and
ends the answer after the last). :meth:`~nest_integrations.decoding.decoder.NestDecoder.prepare_row`
calls it once the candidate set is built.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.markdown_structure import first_copyable
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.copy_policy import Window, closes_answer, focus_windows, wants_focus
from nest_integrations.policy.relevance import subject_name
from nest_integrations.store.datastore import CandidateSet, TokenDatastore
from .generation import Generation

__all__ = ["plan_opening", "plan_windows", "token_range", "window_token_plan"]


def token_range(char_spans: np.ndarray, char_start: int, char_end: int) -> tuple[int, int]:
    """First and last token (of int (L, 2) ``char_spans``, L >= 1) overlapping characters ``[char_start, char_end)``."""
    first = int(np.searchsorted(char_spans[:, 1], char_start, side="right"))
    last = int(np.searchsorted(char_spans[:, 0], char_end, side="left")) - 1
    return min(first, len(char_spans) - 1), max(last, first)


def window_token_plan(
    windows: Sequence[Window], tokens_of: Callable[[str], tuple[str, np.ndarray]]
) -> list[tuple[Window, int, int, bool]]:
    """``(window, first, last, stops)`` for each answer window to copy, in order: its first and
    last token positions in its passage and whether the answer ends after ``last``.

    ``tokens_of(passage_id)`` gives the passage's text and its int (L, 2) token ``char_spans``.
    A window that holds none of the question's own words only says where to open, and one
    that ends mid-sentence ("(e.g.") would stop unfinished: it does not stop (the copy goes on
    past it) and no window follows it. A later window opens at its first copyable token and at
    the line breaks before it when they are tokens of their own, so it does not run into the
    text before it. Pure: the decoder (:func:`plan_windows`) and ``nest bench windows`` share it."""
    planned: list[tuple[Window, int, int, bool]] = []
    for window in windows:
        text, spans = tokens_of(window.passage_id)
        if not len(spans):
            continue
        first, last = token_range(spans, window.start, window.end)
        if planned:
            first = first_copyable(text, spans, first)
            while 0 < first < len(spans) and not text[slice(*spans[first - 1])].strip():
                first -= 1
        stops = window.answers and closes_answer(text, window.end)
        planned.append((window, first, last, stops))
        if not stops:
            break
    return planned


def plan_windows(
    datastore: TokenDatastore, candidates: CandidateSet, windows: Sequence[Window]
) -> list[tuple[tuple[int, int], Optional[tuple[int, int]]]]:
    """``(opening, window_end)`` token positions of each answer window to copy, in order
    (:func:`window_token_plan`): ``(passage index, first token)`` and ``(passage index, last
    token)``, or None for a window the copy goes on past."""

    def tokens_of(passage_id: str) -> tuple[str, np.ndarray]:
        pidx = datastore.index_of(passage_id)
        assert pidx is not None
        return datastore.passages[pidx].text, candidates.passage(pidx).char_spans

    planned: list[tuple[tuple[int, int], Optional[tuple[int, int]]]] = []
    for window, first, last, stops in window_token_plan(windows, tokens_of):
        pidx = datastore.index_of(window.passage_id)
        assert pidx is not None
        planned.append(((pidx, first), (pidx, last) if stops else None))
    return planned


def plan_opening(gen: Generation, query: str, kept: list[Passage], datastore: TokenDatastore, relevance: Optional[Relevance]) -> None:
    """Where the answer's first copy is proposed (checked by the LM like any span).

    A question (:func:`wants_focus`) opens at its best answer window
    (:func:`focus_windows` asked with ``relevance``, ``config.answer_windows`` of them):
    entries outside the windows are masked, copying a window's last token moves on to the
    next window, and copying the last window's last token ends the answer. A request about
    someone or something by name (:func:`subject_name`) opens at the start of the best
    kept passage, so a biography opens with its subject's own first
    sentence instead of a copy that starts mid-way. Other requests open
    wherever the kNN search leads (within the seam rules).

    Args:
        gen: a generation whose candidate set is built (``gen.candidates``).
        query: the retrieval query.
        kept: the passages the relevance gate kept, best first.
    """
    assert gen.candidates is not None
    candidates = gen.candidates
    if gen.config.answer_focus and wants_focus(query):
        planned = plan_windows(datastore, candidates, focus_windows(query, kept, relevance, count=gen.config.answer_windows))
        if not planned:
            return
        for other in candidates.passage_indices:  # mask all but the windows (and what follows an open one)
            length = len(candidates.passage(other).token_ids)
            position = 0
            for first, last in sorted((first, end[1] if end else length - 1) for (pidx, first), end in planned if pidx == other):
                candidates.mark_used(other, position, first - 1)
                position = max(position, last + 1)
            candidates.mark_used(other, position, length - 1)
        (gen.opening, gen.window_end), *gen.next_windows = planned
    elif subject_name(query) is not None:
        pidx = datastore.index_of(kept[0].id)
        if pidx is not None and len(candidates.passage(pidx).token_ids):
            gen.opening = (pidx, 0)
