"""Which retrieved text answers a question: a fitted scorer over candidate answer windows.

A question is answered by copying a few windows of the retrieved passages (a sentence,
or in Markdown the blocks it touches: :func:`candidate_windows`). Which windows, and
whether any answers at all, is decided by one logistic model over a handful of
features every window has in any corpus (:data:`FEATURES`, :func:`window_features`):
how close the question's embedding is to the window's (with the titles of the
sections it sits under, and for a follow-up to the last question alone), how many of
the question's rarer words the window and its section title hold, how close the
question is to the window's passage and to its section title, and where the first
stage ranked that passage. :class:`AnswerSelector` turns them into the probability
that a window holds the answer (:meth:`AnswerSelector.probabilities`) and keeps the best
non-overlapping ones (:meth:`AnswerSelector.select`).

Its weights are fitted on documentation question sets by ``benchmarks/fit_selector.py``
(labels: the window, with the title copied before it, holds a gold answer) and
checked on sets it was not fitted on; the fit and its measurements are in
docs/method.md (Choosing what to copy). Nothing in it names a project, a language or
a kind of question, so it carries to documentation nobody fitted it on as well as
the embedder and the first stage do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.markdown_structure import copy_layout, parse_blocks, section_title, shows_text
from nest_integrations.corpus.passages import Passage
from .conversation import question_asked_now
from .copy_policy import Window, document_range, sentence_windows, whole_blocks, within_section
from .relevance import content_words, opening_words, text_stems
from .words import stem

__all__ = [
    "DEFAULT_SELECTOR",
    "FEATURES",
    "AnswerSelector",
    "CandidateWindow",
    "candidate_windows",
    "choose_windows",
    "window_features",
]

_CAPITALISED = re.compile(r"(?<=\s)[A-Z][\w'’.-]*")
"""A capitalised word after a question's first: how it gives a name."""

FEATURES: tuple[str, ...] = (
    "cosine", "last_question_cosine", "overlap", "coverage", "passage_cosine", "first_stage_rank", "title_cosine",
    "title_coverage",
)
"""The columns of :func:`window_features`, each in [0, 1] or a cosine in [-1, 1]:

* ``cosine``: the question's cosine to the window's text under the titles of the sections
  it sits under (``"Reply / Methods"``): documentation names the subject in its headings;
* ``last_question_cosine``: the same for the conversation's last question alone (a
  follow-up's retrieval query holds the earlier ones too; equal to ``cosine`` otherwise);
* ``overlap``: the question's content words the window holds, each weighted by how few
  windows hold it (``log(1 + N / n_w)``), over the best window's weight; the names the
  question gives that the window's passage opens with are left out (:func:`_topical_words`);
* ``coverage``: the share of those content words the window holds;
* ``passage_cosine``: the question's cosine to the window's whole passage;
* ``first_stage_rank``: ``1 / (1 + rank)`` of the passage in the first stage's order;
* ``title_cosine``: the question's cosine to the window's section title (0 without one);
* ``title_coverage``: the share of the question's content words its section title holds.
"""


@dataclass(frozen=True)
class CandidateWindow:
    """One candidate answer window: characters ``[start, end)`` of ``passage``, the title of the
    section it sits under (``""`` for none) and the headings' path (outermost first)."""

    passage: Passage
    rank: int
    start: int
    end: int
    title: str
    heading_path: tuple[str, ...]
    words: frozenset[str]
    """Stems of the window's scored sentence (:func:`~.relevance.text_stems`)."""

    def titled_text(self) -> str:
        """The window's text below the titles of the sections it sits under, one line
        (``"Reply / Methods\n..."``): what the ``cosine`` feature compares with the question."""
        return " / ".join(self.heading_path) + "\n" + self.passage.text[self.start : self.end]


def _heading_path(text: str, pos: int) -> tuple[str, ...]:
    """Titles of the headings character ``pos`` of Markdown ``text`` sits under; () for prose."""
    if copy_layout(text) is None:
        return ()
    before = [block for block in parse_blocks(text) if block.start <= pos]
    return before[-1].heading_path if before else ()


def candidate_windows(passages: Sequence[Passage]) -> list[CandidateWindow]:
    """Every passage's sentence windows (:func:`~.copy_policy.sentence_windows`) that hold text a
    reader sees, in Markdown widened to the blocks they touch (:func:`~.copy_policy.whole_blocks`)
    and kept to one section (:func:`~.copy_policy.within_section`), in passage order (``passages`` best first: ``rank`` is the index)."""
    candidates = []
    for rank, passage in enumerate(passages):
        text = passage.text
        for start, core_end, end in sentence_windows(passage):
            wide_start, wide_end = within_section(text, *whole_blocks(text, start, end))
            if wide_start >= wide_end or not shows_text(text, wide_start, wide_end):
                continue  # a heading and nothing under it, or markup alone (a label, a directive)
            title = section_title(text, wide_start)
            candidates.append(CandidateWindow(
                passage, rank, wide_start, wide_end, text[title[0] : title[1]] if title else "",
                _heading_path(text, wide_start), frozenset(text_stems(text[start:core_end])),
            ))
    return candidates


def _topical_words(query: str, wanted: set[str], passage: Passage) -> set[str]:
    """The question's content words ``wanted`` less the names it gives that ``passage`` opens
    with (its subject: "Galileo Galilei" in "In which city was Galileo Galilei born?"); all of
    them when that leaves none. Those names say which passage answers, not where in it: every
    sentence of Galileo's summary is about him, and the opening one, which names him in full,
    would otherwise win over "He was born in Pisa"."""
    names = content_words(" ".join(_CAPITALISED.findall(query)))
    subject = names & {stem(word) for word in opening_words(passage.text)}
    return (wanted - subject) or wanted


def _share(wanted: set[str], held: frozenset[str] | set[str]) -> float:
    return len(wanted & held) / len(wanted) if wanted else 0.0


def window_features(query: str, candidates: Sequence[CandidateWindow], passages: Sequence[Passage], relevance: Relevance) -> np.ndarray:
    """float32 (N, len(FEATURES)) features of N ``candidates`` for ``query`` (see :data:`FEATURES`).

    ``passages`` are the retrieved passages the candidates come from, best first; a follow-up's
    ``query`` is its conversation's questions one a line, the last the one asked now. The
    embedder reads each text once per call: the titled windows, the passages and the titles."""
    if not candidates:
        return np.zeros((0, len(FEATURES)), dtype=np.float32)
    wanted = content_words(query)
    last_question = question_asked_now(query)
    counts = {w: sum(w in c.words for c in candidates) for w in wanted}
    weight = {w: math.log1p(len(candidates) / n) for w, n in counts.items() if n}
    by_passage = {c.passage.id: c.passage for c in candidates}
    topical_of = {pid: _topical_words(query, wanted, passage) for pid, passage in by_passage.items()}  # once a passage
    topical = [topical_of[c.passage.id] for c in candidates]
    overlap = np.array([sum(weight.get(w, 0.0) for w in words & c.words) for words, c in zip(topical, candidates)])
    overlap = overlap / overlap.max() if overlap.max() > 0 else overlap
    titled = [c.titled_text() for c in candidates]
    cosine = np.asarray(relevance(query, titled), dtype=np.float32)
    last = cosine if last_question == query.strip() else np.asarray(relevance(last_question, titled), dtype=np.float32)
    passage_cosine = np.asarray(relevance(query, [p.text for p in passages]), dtype=np.float32)
    titles = sorted({c.title for c in candidates if c.title})
    title_cosines: Mapping[str, float] = dict(zip(titles, (float(x) for x in relevance(query, titles)))) if titles else {}
    return np.array([
        [
            cosine[i], last[i], overlap[i], _share(topical[i], c.words), passage_cosine[c.rank], 1.0 / (1 + c.rank),
            title_cosines.get(c.title, 0.0), _share(wanted, text_stems(c.title)) if c.title else 0.0,
        ]
        for i, c in enumerate(candidates)
    ], dtype=np.float32)


@dataclass(frozen=True)
class AnswerSelector:
    """The fitted window scorer (see the module docstring): one logistic weight per name of
    :data:`FEATURES`, and the intercept."""

    weights: tuple[float, ...]
    bias: float

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURES):
            raise ValueError(f"weights: expected {len(FEATURES)} ({', '.join(FEATURES)}), got {len(self.weights)}")

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """float64 (N,) probability that each window holds the answer, from (N, F) ``features``."""
        logits = np.asarray(features, dtype=np.float64) @ np.asarray(self.weights) + self.bias
        return 1.0 / (1.0 + np.exp(-logits))

    def select(
        self,
        query: str,
        passages: Sequence[Passage],
        relevance: Relevance,
        *,
        count: int = 2,
        eligible: Optional[Callable[[Passage], bool]] = None,
    ) -> list[Window]:
        """Up to ``count`` windows of ``passages`` (retrieved, best first: their order is a feature)
        that best answer ``query``, best first (:func:`choose_windows`: none overlapping another in
        its document, none whose text another holds). With ``eligible``, only windows of the passages it accepts
        are chosen; every passage's windows are still read, so a window's features (its passage's
        rank, its overlap against the best) are those the selector was fitted on."""
        candidates = candidate_windows(passages)
        if not candidates or not query.strip():
            return []
        probability = self.probabilities(window_features(query, candidates, passages, relevance))
        chosen = choose_windows(candidates, probability, count, eligible)
        return [Window(candidates[i].passage.id, candidates[i].start, candidates[i].end, float(probability[i])) for i in chosen]


def choose_windows(
    candidates: Sequence[CandidateWindow], probability: np.ndarray, count: int, eligible: Optional[Callable[[Passage], bool]] = None
) -> list[int]:
    """Indices into ``candidates`` of up to ``count`` windows, best first by ``probability``
    (float (N,), one per candidate): the choice of :meth:`AnswerSelector.select`, which a
    benchmark scoring another window scorer makes the same way. A window is skipped when
    ``eligible`` refuses its passage, when it overlaps a chosen one in its document
    (:func:`~.copy_policy.document_range`: chunk splitters overlap their chunks), or when its
    text (white space aside) holds a chosen one's or is held by it (documentation repeats an
    example on two pages: copied twice, it reads as a loop)."""
    chosen: list[int] = []
    taken: list[tuple[str, int, int]] = []
    texts: list[str] = []  # each chosen window's words, one space between them
    for i in np.argsort(-np.asarray(probability), kind="stable"):
        c = candidates[int(i)]
        if eligible is not None and not eligible(c.passage):
            continue
        here = document_range(c.passage, c.start, c.end)
        if any(doc == here[0] and s < here[2] and here[1] < e for doc, s, e in taken):
            continue
        words = " ".join(c.passage.text[c.start : c.end].split())
        if any(words in other or other in words for other in texts):
            continue
        chosen.append(int(i))
        taken.append(here)
        texts.append(words)
        if len(chosen) == count:
            break
    return chosen

DEFAULT_SELECTOR = AnswerSelector(
    weights=(0.4479, 2.6096, 0.9975, 2.4447, 2.3071, 0.8502, -0.2578, -0.342),  # in the order of FEATURES
    bias=-5.6313,
)
"""The selector the decoder uses: ``benchmarks/fit_selector.py`` over seven question sets (the attrs,
yargs, click, Fastify and Pino documentation, the standard-library docstrings and the factual
questions over the Wikipedia summaries); its measurements are in docs/method.md (Choosing what to copy)."""
