"""A generation made ready before its first step: retrieval, gate, candidates and the copy plan.

:class:`Preparer` runs the first stage of every generation in the caller's thread
(:meth:`~nest_integrations.decoding.decoder.NestDecoder.prepare_row` and ``score`` call it):

* retrieval, then the relevance gate: which retrieved passages may be copied at all
  (:class:`~nest_integrations.policy.relevance.RelevanceGate`; none left: ``stats.fallback_reason``
  says why, and a chat prompt gets a plain abstention, :mod:`~nest_integrations.decoding.abstention`,
  or with ``fallback="lm"`` the LM's own answer);
* for a question, when the gate kept anything, the answer windows of the retrieved passages that
  the fitted selector ranks best (:func:`choose_answer_windows`);
* the candidate set of the kept passages' (and the windows' passages') datastore entries, and
  where the answer opens (:func:`plan_opening`).

:func:`plan_opening` gives a chat request's :class:`~nest_integrations.decoding.generation.Generation`
its :class:`~nest_integrations.decoding.copy_plan.CopyPlan` (the first copy proposed, the answer
windows to copy, in order) and masks the candidate entries outside the windows; the
:class:`~nest_integrations.decoding.proposer.SpanProposer` takes the openings and the
:class:`~nest_integrations.decoding.verifier.SpanVerifier` moves from one window to the next and
ends the answer after the last.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from nest_integrations.corpus.markdown_structure import first_copyable, label_start, section_title
from nest_integrations.corpus.rst_structure import announces_code
from nest_integrations.core.config import NestConfig
from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.conversation import asked_sentences
from nest_integrations.policy.copy_policy import Window, closes_answer, wants_focus
from nest_integrations.policy.mentions import CorpusTerms
from nest_integrations.policy.selection import DEFAULT_SELECTOR
from nest_integrations.policy.relevance import GateDecision, RelevanceGate, naming_passages, subject_name
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.datastore import EncodeStats, TokenDatastore
from .abstention import abstention_text
from .chunk_chain import next_chunk
from .copy_plan import CopyPlan, PlannedOpening
from .generation import Generation
from .output import GenerationStats
from .prompts import PromptLike, default_query, is_chat
from .spans import TokenRecord
from .verifier import SpanVerifier

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.retrieval.base import PassageRetriever

logger = logging.getLogger(__name__)

__all__ = [
    "PlannedCopy", "PlannedOpening", "Preparer", "ScoredPassages", "choose_answer_windows", "fitting_windows", "join_touching", "plan_opening",
    "plan_windows", "planned_tokens", "run_on_window", "token_range", "window_token_plan",
]

ScoredPassages = Sequence[tuple[Passage, float]]
"""Pre-retrieved ``(Passage, score)`` pairs, best first."""


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


def join_touching(windows: Sequence[Window], text_of: Callable[[str], str]) -> list[Window]:
    """``windows`` (ranked, none overlapping another) with each one that starts where a better-ranked
    one of its passage ends, nothing but white space between them, joined to the end of that one.

    The selector ranks sentences, so an answer's third window is often the sentence right after
    its first; copied in rank order the answer would jump from the first sentence to the second
    window and then back. Joined, it reads on in the source's order. A window that ends where a
    better one starts stays in its own place: joined, it would put weaker text before the best
    answer. A window that does not close an answer (:func:`closes_answer`) is not joined after
    another: the joined window would not close one either, and the windows planned after it would
    be dropped. But one that announces a better one's example ("... run it in the following way"
    over ``::`` and the command) is joined before it: ranked below the example, it would run on
    into what was already copied and end the answer on the announcement.
    ``text_of(passage_id)`` gives a passage's text; a joined window keeps the better score."""
    joined: list[Window] = []
    for window in windows:
        text = text_of(window.passage_id)
        if closes_answer(text, window.end):
            before = next((i for i, kept in enumerate(joined) if _goes_on_from(kept, window, text)), None)
            if before is not None:
                kept = joined[before]
                joined[before] = Window(kept.passage_id, kept.start, window.end, max(kept.score, window.score))
                continue
        else:
            announced = next((i for i, kept in enumerate(joined) if _announces(window, kept, text)), None)
            if announced is not None:
                kept = joined[announced]
                joined[announced] = Window(kept.passage_id, window.start, kept.end, max(kept.score, window.score))
                continue
        joined.append(window)
    return joined


def _goes_on_from(earlier: Window, window: Window, text: str) -> bool:
    """Whether ``window`` starts where ``earlier`` ends in their passage (its ``text``), nothing but white space between."""
    return earlier.passage_id == window.passage_id and earlier.end <= window.start and not text[earlier.end : window.start].strip()


def _announces(window: Window, example: Window, text: str) -> bool:
    """Whether ``window``, which does not close an answer, announces ``example`` of their passage
    (its ``text``): ``example`` starts where ``window`` ends, nothing between but white space and
    lines that announce code (a code directive, a lone ``::``)."""
    if window.passage_id != example.passage_id or not window.end <= example.start:
        return False
    return all(not line.strip() or announces_code(line) for line in text[window.end : example.start].split("\n"))


def run_on_window(windows: Sequence[Window], text_of: Callable[[str], str]) -> Optional[Window]:
    """The window an answer planned from ``windows`` (ranked) ends with when it does not close
    the answer (:func:`~nest_integrations.policy.copy_policy.closes_answer`): the first that does
    not, as :func:`window_token_plan` stops there and lets the copy run on; None when every
    window closes one. ``text_of(passage_id)`` gives a passage's text."""
    return next((w for w in windows if not closes_answer(text_of(w.passage_id), w.end)), None)


def window_token_plan(windows: Sequence[Window], tokens_of: Callable[[str], tuple[str, np.ndarray]]) -> list[PlannedCopy]:
    """The copies that answer with ``windows``, in order (:class:`PlannedCopy`).

    ``tokens_of(passage_id)`` gives the passage's text and its int (L, 2) token ``char_spans``.
    A window in a Markdown section whose heading the passage holds is preceded by that
    section's title (:func:`~nest_integrations.corpus.markdown_structure.section_title`), once
    per title: documentation names an option or a function in its heading and nowhere else
    ("### ignoreTrailingSlash" over "By default, Fastify will take into account the trailing
    slashes"). A window that holds none of the question's own words only says where to open,
    and one that ends mid-sentence ("(e.g.") would stop unfinished: it does not stop (it is
    copied whole, then the copy runs on past it: ``runs_on`` of its :data:`PlannedOpening`) and
    no window follows it. A window after another copy opens at its first
    copyable token and at the line breaks before it when they are tokens of their own, so it
    does not run into the text before it. Windows that touch in their passage are copied as one
    (:func:`join_touching`). Pure: the decoder (:func:`plan_windows`) and ``nest bench windows``
    share it."""
    tokenized = {window.passage_id: tokens_of(window.passage_id) for window in windows}  # once per passage
    planned: list[PlannedCopy] = []
    titles: set[str] = set()
    for window in join_touching(windows, lambda passage_id: tokenized[passage_id][0]):
        text, spans = tokenized[window.passage_id]
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


def planned_tokens(planned: Sequence[PlannedCopy]) -> int:
    """Tokens an answer spends on ``planned`` copies, at most: each copy's ``first..last`` and a
    break before each copy after the first (the decoder's paragraph or line break)."""
    return sum(copy.last - copy.first + 1 for copy in planned) + max(len(planned) - 1, 0)


def fitting_windows(
    windows: Sequence[Window], answer_windows: int, budget: int, tokens_of: Callable[[str], tuple[str, np.ndarray]]
) -> list[Window]:
    """The first ``answer_windows`` of ``windows`` (ranked), then each further one while the plan
    with it (:func:`window_token_plan`) closes the answer and fits in ``budget`` tokens
    (:func:`planned_tokens`).

    The best windows are copied even when ``max_new_tokens`` cuts the last one: the answer often
    sits early in a long window. A window ranked below them holds the answer less often, and cut
    it would end the answer mid-sentence, so it is copied only whole (a fill window:
    ``NestConfig.fill_windows``). ``tokens_of(passage_id)`` as for :func:`window_token_plan`."""
    kept = list(windows[:answer_windows])
    for window in windows[answer_windows:]:
        planned = window_token_plan([*kept, window], tokens_of)
        if not planned or not planned[-1].stops or planned_tokens(planned) > budget:
            break
        kept.append(window)
    return kept


def choose_answer_windows(
    query: str,
    retrieved: Sequence[Passage],
    relevance: Optional[Relevance],
    config: NestConfig,
    tokens_of: Callable[[str], tuple[str, np.ndarray]],
) -> list[Window]:
    """The windows of the ``retrieved`` passages (best first) a question's answer copies:
    ``config.answer_windows`` of them, best first, chosen by
    :data:`~nest_integrations.policy.selection.DEFAULT_SELECTOR` among the windows of passages that
    mention every multi-word name the question gives, as the gate's names rule asks, or any of
    them when none mentions all (:func:`~nest_integrations.policy.relevance.naming_passages`: no
    other person's sentence in an answer about someone), then up to
    ``config.fill_windows`` more that fit whole in ``config.max_new_tokens``
    (:func:`fitting_windows`, ``tokens_of`` as there); none with ``answer_focus`` off, without a
    relevance function, or for a query that is no question
    (:func:`~nest_integrations.policy.copy_policy.wants_focus`)."""
    if not config.answer_focus or relevance is None or not wants_focus(query):
        return []
    named = {passage.id for passage in naming_passages(query, retrieved)}
    ranked = DEFAULT_SELECTOR.select(
        query, retrieved, relevance, count=config.answer_windows + config.fill_windows, eligible=lambda passage: passage.id in named
    )
    return fitting_windows(ranked, config.answer_windows, config.max_new_tokens, tokens_of)


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
        planned.append(((pidx, copy.first), (pidx, copy.last), copy.title, not (copy.stops or copy.title)))
    return planned


def plan_opening(gen: Generation, query: str, kept: list[Passage], datastore: TokenDatastore, windows: Sequence[Window]) -> None:
    """Where the answer's first copy is proposed (checked by the LM like any span).

    A question's answer opens at its best answer window (``windows``, best first, chosen by
    the decoder's :class:`~nest_integrations.policy.selection.AnswerSelector`): entries outside
    the windows are masked, copying a window's last token moves on to the next window, and
    copying the last window's last token ends the answer; the model writes nothing in such an
    answer (``gen.plan.whole``, unless ``check_answer_windows``). Without windows, a request about
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
        copied = [(pidx, first, None if runs_on else end[1]) for (pidx, first), end, _, runs_on in planned]
        run_on = next((pidx for pidx, _, last in copied if last is None), None)
        following = next_chunk(datastore.passages, candidates, run_on) if run_on is not None else None
        if following is not None:  # a copy that runs on goes on into the next chunk of its document
            copied.append((following[0], following[1], None))
        for other in candidates.passage_indices:  # mask all but the windows (and what a copy runs on into)
            length = len(candidates.passage(other).token_ids)
            position = 0
            for first, last in sorted((first, length - 1 if last is None else last) for pidx, first, last in copied if pidx == other):
                candidates.mark_used(other, position, first - 1)
                position = max(position, last + 1)
            candidates.mark_used(other, position, length - 1)
        gen.plan = CopyPlan.of_copies(planned, whole=not gen.config.check_answer_windows)
    elif subject_name(query) is not None:
        pidx = datastore.index_of(kept[0].id)
        if pidx is not None and len(candidates.passage(pidx).token_ids):
            gen.plan = CopyPlan(opening=(pidx, 0))


class Preparer:
    """The first stage of a decoder's generations: retrieval, gate, candidates, copy plan or abstention.

    Args:
        tokenizer: the LM's tokenizer (encodes an abstention's text).
        datastore: the token datastore the kept passages enter; None: nothing is copied.
        retriever: the first stage, when passages are not given per call.
        relevance: cosine of texts to a query, for the gate and the answer windows; None turns both off.
        corpus_terms: the words of the whole corpus, for questions naming what it never mentions.
        verifier: commits an abstention's tokens.
        ensure_calibration: ``config -> seconds`` waited for the RRC calibration a config needs
            (:meth:`~nest_integrations.decoding.decoder.NestDecoder.ensure_calibration`).
    """

    def __init__(
        self, tokenizer: Any, datastore: Optional[TokenDatastore], retriever: Optional["PassageRetriever"], relevance: Optional[Relevance],
        corpus_terms: Optional[CorpusTerms], verifier: SpanVerifier, ensure_calibration: Callable[[NestConfig], float],
    ):
        self.tokenizer = tokenizer
        self.datastore = datastore
        self.retriever = retriever
        self.relevance = relevance
        self.corpus_terms = corpus_terms
        self.verifier = verifier
        self.ensure_calibration = ensure_calibration

    def prepare(self, gen: Generation, prompt: PromptLike, query: Optional[str], passages: Optional[ScoredPassages]) -> list[Passage]:
        """First stage: retrieve, gate, build the candidate set and plan the opening
        (:func:`plan_opening`); returns the prompt passages (rag modes). A datastore mode without
        entries records why in ``stats.fallback_reason`` and abstains (:meth:`_abstains`) or
        generates with the LM alone."""
        config = gen.config
        stats = gen.stats
        context: list[Passage] = []
        if config.mode == "base":
            return context
        t0 = time.perf_counter()
        q = query if query is not None else default_query(prompt)
        hits = self._retrieve(q, passages, config)
        stats.retrieval_s = time.perf_counter() - t0
        if config.uses_prompt_passages:
            context = [p for p, _ in hits[: config.rag_passages]]
        if not config.uses_datastore:
            return context
        stats.calibration_s = self.ensure_calibration(config)
        unmentioned = self._unmentioned(prompt, q, config)
        decision = GateDecision([]) if unmentioned else self._gate(q, hits, config)
        windows = self._answer_windows(prompt, q, hits, config) if decision.kept else []
        kept_ids = {p.id for p in decision.kept}
        answering = {w.passage_id for w in windows} - kept_ids
        gated = decision.kept + [p for p, _ in hits if p.id in answering]
        gated += self._run_on_chunk(windows, gated)
        stats.retrieval_s = time.perf_counter() - t0 - stats.calibration_s
        stats.gate_retrieved, stats.gate_kept = len(hits), len(decision.kept)
        gen.candidates = self._candidates(gated, stats)
        if gen.candidates is None or len(gen.candidates) == 0:
            gen.candidates = None
            if passages is None and self.retriever is None:
                stats.fallback_reason = "no_retriever"
            elif not hits:
                stats.fallback_reason = "nothing_retrieved"
            elif unmentioned:
                stats.fallback_reason = "not_mentioned"
            elif decision.reason is not None:
                stats.fallback_reason = decision.reason
            else:
                stats.fallback_reason = "empty_datastore"
            if self._abstains(prompt, config, stats.fallback_reason):
                self._abstain(gen, [p for p, _ in hits], unmentioned)
            else:
                logger.info("no datastore entries for this prompt (%s): generating with the LM alone", stats.fallback_reason)
            return context
        stats.copied_from_datastore = True
        if config.mode not in ("nest", "ra_nest"):
            return context
        if is_chat(prompt, config):
            plan_opening(gen, q, gated, self.datastore, windows)  # type: ignore[arg-type]
        else:
            gen.lead_in = str(prompt)
        return context

    def _retrieve(self, query: str, passages: Optional[ScoredPassages], config: NestConfig) -> list[tuple[Passage, float]]:
        if passages is not None:
            return list(passages)[: config.passage_k]
        if self.retriever is None or not query.strip():
            return []
        return list(self.retriever.retrieve(query, config.passage_k))

    def _gate(self, query: str, hits: list[tuple[Passage, float]], config: NestConfig) -> GateDecision:
        """Passages allowed into the token datastore: those relevant to the query (:class:`RelevanceGate`),
        or all of them when the gate is off (no relevance function, an empty query)."""
        passages = [p for p, _ in hits]
        if config.min_passage_relevance <= -1.0 or self.relevance is None or not hits or not query.strip():
            return GateDecision(passages)
        decision = RelevanceGate.from_config(config).decide(query, passages, self.relevance)
        if len(decision.kept) < len(hits):
            logger.info("relevance gate kept %d of %d passages", len(decision.kept), len(hits))
        return decision

    def _answer_windows(self, prompt: PromptLike, query: str, hits: ScoredPassages, config: NestConfig) -> list[Window]:
        """The windows a question's answer copies in nest and ra_nest (``config.answer_windows`` of
        them, best first, and the fill windows that fit), chosen among the retrieved passages
        (``hits``, best first) by :func:`choose_answer_windows`; none for a prompt that is no chat
        request, or without a datastore to copy from."""
        if self.datastore is None or config.mode not in ("nest", "ra_nest") or not is_chat(prompt, config):
            return []
        datastore = self.datastore
        retrieved = [p for p, _ in hits]
        by_id = {p.id: p for p in retrieved}

        def tokens_of(passage_id: str) -> tuple[str, np.ndarray]:
            text = by_id[passage_id].text
            return text, datastore.encoder.tokenize(text)[1]

        return choose_answer_windows(query, retrieved, self.relevance, config, tokens_of)

    def _run_on_chunk(self, windows: Sequence[Window], gated: Sequence[Passage]) -> list[Passage]:
        """The chunk that goes on from the passage of the plan's last window when that window does
        not close an answer (:func:`run_on_window`) and the chunk is not among ``gated`` already:
        the copy runs on past its passage's end into it (to its section's end, or the token budget),
        as into a retrieved next chunk. A sentence that announces what follows ("... and to fail
        in a callback:") is often the last of its chunk, the example it announces the first of the
        next one. Empty when there is none, or the datastore does not know the passage."""
        if self.datastore is None:
            return []
        by_id = {p.id: p for p in gated}
        window = run_on_window(windows, lambda passage_id: by_id[passage_id].text)
        here = self.datastore.index_of(window.passage_id) if window is not None else None
        following = self.datastore.following_chunk(here) if here is not None else None
        if following is None or self.datastore.passages[following].id in by_id:
            return []
        return [self.datastore.passages[following]]

    def _unmentioned(self, prompt: PromptLike, query: str, config: NestConfig) -> list[str]:
        """The names the sentences that ask give (:func:`~nest_integrations.policy.conversation.asked_sentences`:
        of the question asked now, a follow-up's ``query`` holding the earlier questions above it;
        a statement of the user's setting left out) that the corpus never mentions
        (:meth:`~nest_integrations.policy.mentions.CorpusTerms.unmentioned`); none for a prompt
        that is no chat question, in a mode that copies nothing, or when the decoder does not know
        its whole corpus."""
        if self.corpus_terms is None or config.mode not in ("nest", "ra_nest") or not is_chat(prompt, config):
            return []
        return self.corpus_terms.unmentioned(asked_sentences(query))

    @staticmethod
    def _abstains(prompt: PromptLike, config: NestConfig, reason: Optional[str]) -> bool:
        """Whether a generation with nothing to copy answers with a plain abstention
        (:mod:`~nest_integrations.decoding.abstention`): a chat prompt in nest or ra_nest whose
        retrieval found nothing, whose gate kept nothing, or that names something the corpus never
        mentions, unless ``config.fallback`` is ``"lm"``."""
        return (
            config.fallback == "abstain" and config.mode in ("nest", "ra_nest") and is_chat(prompt, config)
            and reason in ("nothing_retrieved", "nothing_relevant", "not_mentioned")
        )

    def _abstain(self, gen: Generation, retrieved: Sequence[Passage], unmentioned: Sequence[str] = ()) -> None:
        """Finish ``gen`` before its first step with :func:`~nest_integrations.decoding.abstention.abstention_text`
        of the ``retrieved`` passages and the ``unmentioned`` names (``finish_reason`` ``"not_covered"``,
        nothing copied)."""
        text = abstention_text(retrieved, unmentioned)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        self.verifier.commit(gen, [TokenRecord(int(token)) for token in ids])
        gen.finish("not_covered")
        logger.info("nothing answers this prompt (%s): the answer says so", gen.stats.fallback_reason)

    def _candidates(self, passages: list[Passage], stats: GenerationStats) -> Optional[CandidateSet]:
        if self.datastore is None or not passages:
            return None
        encode = EncodeStats()
        indices = [self.datastore.add(p) for p in passages]
        candidates = self.datastore.candidates(indices, stats=encode)
        stats.encode_passes += encode.encode_passes
        stats.encoded_passages += encode.encoded_passages
        stats.encode_s += encode.encode_s
        return candidates
