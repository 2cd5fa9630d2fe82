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

from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from nest_integrations.corpus.markdown_structure import first_copyable, label_start, section_title
from nest_integrations.core.config import NestConfig
from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.copy_policy import Window, closes_answer, wants_focus
from nest_integrations.policy.selection import DEFAULT_SELECTOR
from nest_integrations.policy.relevance import subject_name
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.datastore import TokenDatastore
from .generation import Generation

__all__ = ["PlannedCopy", "PlannedOpening", "choose_answer_windows", "plan_opening", "plan_windows", "token_range", "window_token_plan"]


def token_range(char_spans: np.ndarray, char_start: int, char_end: int) -> tuple[int, int]:
    """First and last token (of int (L, 2) ``char_spans``, L >= 1) overlapping characters ``[char_start, char_end)``."""
    first = int(np.searchsorted(char_spans[:, 1], char_start, side="right"))
    last = int(np.searchsorted(char_spans[:, 0], char_end, side="left")) - 1
    return min(first, len(char_spans) - 1), max(last, first)


class PlannedCopy(NamedTuple):
    """One piece of an answer's copy plan: tokens ``first..last`` (inclusive) of the passage of
    ``window``, copied in turn.

    ``title``: the title of the section ``window`` sits in, copied before it as its label (a
    Markdown heading without its ``#`` marks: ``ignoreTrailingSlash``); the answer goes on to the
    window after it. A title after another copy starts at the line breaks before its heading
    (:func:`~nest_integrations.corpus.markdown_structure.label_start`): of ``first..last`` only
    those and the title's own tokens are copied
    (:func:`~nest_integrations.corpus.markdown_structure.title_tokens`). ``stops``: a window that closes an answer (the answer ends after ``last``,
    or moves on to the next window); a window that does not is the plan's last and the copy
    goes on past it."""

    window: Window
    first: int
    last: int
    stops: bool
    title: bool = False


def window_token_plan(windows: Sequence[Window], tokens_of: Callable[[str], tuple[str, np.ndarray]]) -> list[PlannedCopy]:
    """The copies that answer with ``windows``, in order (:class:`PlannedCopy`).

    ``tokens_of(passage_id)`` gives the passage's text and its int (L, 2) token ``char_spans``.
    A window in a Markdown section whose heading the passage holds is preceded by that
    section's title (:func:`~nest_integrations.corpus.markdown_structure.section_title`), once
    per title: documentation names an option or a function in its heading and nowhere else
    ("### ignoreTrailingSlash" over "By default, Fastify will take into account the trailing
    slashes"). A window that holds none of the question's own words only says where to open,
    and one that ends mid-sentence ("(e.g.") would stop unfinished: it does not stop (the copy
    goes on past it) and no window follows it. A window after another copy opens at its first
    copyable token and at the line breaks before it when they are tokens of their own, so it
    does not run into the text before it. Pure: the decoder (:func:`plan_windows`) and ``nest
    bench windows`` share it."""
    planned: list[PlannedCopy] = []
    titles: set[str] = set()
    for window in windows:
        text, spans = tokens_of(window.passage_id)
        if not len(spans):
            continue
        first, last = token_range(spans, window.start, window.end)
        title = section_title(text, window.start)
        if title is not None and text[slice(*title)] not in titles:
            title_first, title_last = token_range(spans, *title)
            if title_last < first:
                if planned:  # after another copy: from the line breaks before the heading
                    title_first = label_start(text, spans, title_first)
                planned.append(PlannedCopy(window, title_first, title_last, False, True))
                titles.add(text[slice(*title)])
        if planned:
            first = first_copyable(text, spans, first)
            while 0 < first < len(spans) and not text[slice(*spans[first - 1])].strip():
                first -= 1
        stops = closes_answer(text, window.end)
        planned.append(PlannedCopy(window, first, last, stops))
        if not stops:
            break
    return planned


PlannedOpening = tuple[tuple[int, int], Optional[tuple[int, int]], bool]
"""``(opening, end, title)`` of one planned copy in the decoder's terms: ``(passage index, first
token)``, ``(passage index, last token)`` where copying moves on to the next one or ends the
answer (None: the copy goes on past it), and whether it is a section's title
(:class:`PlannedCopy`)."""


def choose_answer_windows(query: str, retrieved: Sequence[Passage], relevance: Optional[Relevance], config: NestConfig) -> list[Window]:
    """The windows of the ``retrieved`` passages (best first) a question's answer copies:
    ``config.answer_windows`` of them, best first, chosen by
    :data:`~nest_integrations.policy.selection.DEFAULT_SELECTOR`; none with ``answer_focus`` off,
    without a relevance function, or for a query that is no question
    (:func:`~nest_integrations.policy.copy_policy.wants_focus`)."""
    if not config.answer_focus or relevance is None or not wants_focus(query):
        return []
    return DEFAULT_SELECTOR.select(query, retrieved, relevance, count=config.answer_windows)


def plan_windows(datastore: TokenDatastore, candidates: CandidateSet, windows: Sequence[Window]) -> list[PlannedOpening]:
    """The :data:`PlannedOpening` of each copy of :func:`window_token_plan`, in order."""

    def tokens_of(passage_id: str) -> tuple[str, np.ndarray]:
        pidx = datastore.index_of(passage_id)
        assert pidx is not None
        return datastore.passages[pidx].text, candidates.passage(pidx).char_spans

    planned: list[PlannedOpening] = []
    for copy in window_token_plan(windows, tokens_of):
        pidx = datastore.index_of(copy.window.passage_id)
        assert pidx is not None
        planned.append(((pidx, copy.first), (pidx, copy.last) if copy.stops or copy.title else None, copy.title))
    return planned


def plan_opening(gen: Generation, query: str, kept: list[Passage], datastore: TokenDatastore, windows: Sequence[Window]) -> None:
    """Where the answer's first copy is proposed (checked by the LM like any span).

    A question's answer opens at its best answer window (``windows``, best first, chosen by
    the decoder's :class:`~nest_integrations.policy.selection.AnswerSelector`): entries outside
    the windows are masked, copying a window's last token moves on to the next window, and
    copying the last window's last token ends the answer; the model writes nothing in such an
    answer (``gen.planned``, unless ``check_answer_windows``). Without windows, a request about
    someone or something by name (:func:`subject_name`) opens at the start of the best kept
    passage, so a biography opens with its subject's own first sentence instead of a copy that
    starts mid-way. Other requests open wherever the kNN search leads (within the seam rules).

    Args:
        gen: a generation whose candidate set is built (``gen.candidates``).
        query: the retrieval query.
        kept: the passages the relevance gate kept, best first.
        windows: the answer windows to copy, in order; empty for a prompt that is no question.
    """
    assert gen.candidates is not None
    candidates = gen.candidates
    if windows:
        planned = plan_windows(datastore, candidates, windows)
        if not planned:
            return
        for other in candidates.passage_indices:  # mask all but the windows (and what follows an open one)
            length = len(candidates.passage(other).token_ids)
            position = 0
            for first, last in sorted((first, end[1] if end else length - 1) for (pidx, first), end, _ in planned if pidx == other):
                candidates.mark_used(other, position, first - 1)
                position = max(position, last + 1)
            candidates.mark_used(other, position, length - 1)
        (gen.opening, gen.window_end, gen.copying_title), *gen.next_windows = planned
        gen.planned = not gen.config.check_answer_windows
    elif subject_name(query) is not None:
        pidx = datastore.index_of(kept[0].id)
        if pidx is not None and len(candidates.passage(pidx).token_ids):
            gen.opening = (pidx, 0)
