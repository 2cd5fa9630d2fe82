"""The per-step rules of NEST decoding: :class:`StepRules`, what a row does at each step.

The row scheduler (:mod:`~nest_integrations.decoding.batching`) runs one forward per
step over every row's fed tokens and hands each row's logits and query vectors to
its rules, through the :class:`~nest_integrations.decoding.generation.RowDecoder`
protocol; :class:`~nest_integrations.decoding.decoder.NestDecoder` makes one
:class:`StepRules` per decoder (``decoder.rules``) and keeps the entry points.
The rules read and write only the public
:class:`~nest_integrations.decoding.generation.Generation` state.

Each step has the LM's next-token distribution p_LM and its query vector q
(the hidden state at the datastore's key layer). In the datastore modes the
kNN search over the generation's :class:`~nest_integrations.store.candidates.CandidateSet`
gives p_kNN and the RRC weight lambda; p_M mixes them (docs/method.md, Decoder):
:meth:`StepRules.mixture`.

Then, in ``nest`` / ``ra_nest``, proposal and verification are
separate, as a draft proposer and a verifier are in speculative decoding:

* **Propose** (:meth:`StepRules.propose`, from the p_M of the last accepted
  position): lambda > delta: emit one token from p_M; otherwise propose the
  passage continuation that starts at the neighbour value with the highest p_M
  (at most ``span_length`` tokens, never past the passage end). Its first token
  is checked against the current p_M; the rest is the draft. A fully accepted
  span is continued from the same passage without a new span selection, and
  copied entries are masked so a span is not copied twice.
* **Verify** (:meth:`StepRules.verify`, from the p_M at each fed position): the
  scheduler feeds the first token and the draft to the LM in **one** forward,
  their kNN lookups done as one batched search, and the draft is accepted while
  ``min(1, p_M(x_i) / (gamma * max p_M)) > 0.5``. The p_M at the first rejected
  position is the next step's distribution, so every forward advances by at
  least one token (the scheduler crops the row's KV columns back to it).
* **Commit** (:meth:`StepRules.commit`): accepted tokens join the text and the
  stop rules apply.

Beyond the paper, each decision is a small rule of its own:

* where a copy may start: :func:`~nest_integrations.policy.copy_policy.acceptable_start`
  (``seams``), preferring a source that continues the text so far;
* where a copy ends: at most ``span_length`` tokens, never into Markdown a reader
  does not see, never into a token already copied, never completing a repeated n-gram;
* when the answer ends: copying the last answer window's last token (``answered``),
  or the last token of a passage whose document's next chunk was not retrieved
  (``stop_at_source_end``): what a small LM writes after a fully copied source is
  its own, and mostly invented. A copy reaching a chunk's end goes on into the next
  chunk of its document when that was retrieved.

Where the answer opens (the answer windows, a named subject's passage) is planned
before the first step, by :mod:`~nest_integrations.decoding.prepare`; the rules
consume that plan (``Generation.opening``, ``window_end``, ``next_windows``). A planned
window is copied whole, without the relaxed check (``config.check_answer_windows`` off), and
the model writes nothing in a planned answer (``Generation.planned``): its token ends it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np
import torch

from nest_integrations.core.config import NestConfig
from nest_integrations.core.mixture import accepted_prefix_length, distance_ratio, knn_distribution, mix, relaxed_accept_ratio, rrc_lambda
from nest_integrations.corpus.markdown_structure import (
    closing_fence, copyable_end, copyable_tokens, first_copyable, open_code_block, section_ends_at, title_tokens,
)
from nest_integrations.policy.copy_policy import acceptable_start, continues, sentence_starts
from nest_integrations.policy.repetition import repeat_free_length, repeating_tokens
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import EncodedPassage
from .generation import Generation, Step
from .output import NestOutput, Span
from .spans import TokenRecord, build_spans, summarize

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.key_reader import KeyReader
    from nest_integrations.model.lm import LoadedLM

__all__ = ["StepRules"]

_SEAM_TRIES = 32
"""Neighbours tried, best p_M first, for one where a copy may start; beyond, the LM writes a token."""


class StepRules:
    """The rules of one decoding step over a :class:`Generation`; implements
    :class:`~nest_integrations.decoding.generation.RowDecoder`.

    Stateless between calls: everything a generation carries from step to step
    lives in its :class:`Generation`, so one object serves every row of a decoder,
    from any thread the scheduler runs in.

    Positions are token indices into a candidate passage's ``token_ids``; a
    ``(passage index, position)`` pair names one datastore entry. ``T`` is the
    number of positions one forward fed a row, ``V`` the vocabulary size.

    Args:
        lm: the LM (its tokenizer decodes the accepted tokens).
        datastore: the token datastore the candidate passages index into; None
            when the decoder has none (then no generation has candidates).
        reader: reads the query vectors at the datastore's key layer in a forward.
        cache_arg: the keyword under which the model's forward takes its KV cache.
        eos_ids: token ids that end a generation.
        rrc_parameters: ``config -> (alpha, tau)`` of the RRC mixture weight;
            called per step, so a calibration fitted after these rules were made
            applies (:meth:`~nest_integrations.decoding.decoder.NestDecoder.rrc_parameters`).
    """

    def __init__(
        self,
        lm: "LoadedLM",
        datastore: Optional[TokenDatastore],
        reader: "KeyReader",
        cache_arg: str,
        eos_ids: set[int],
        rrc_parameters: Callable[[NestConfig], tuple[float, float]],
    ):
        self.lm = lm
        self.datastore = datastore
        self.reader = reader
        self.cache_arg = cache_arg
        self.eos_ids = eos_ids
        self.rrc_parameters = rrc_parameters

    # ------------------------------------------------------------------ the mixture
    def mixture(self, logits: torch.Tensor, queries: torch.Tensor, gen: Generation) -> Step:
        """p_M, lambda and neighbours at each of T positions (one batched search).

        Args:
            logits: float32 (T, V), the LM's next-token logits at the fed positions.
            queries: float32 (T, d), the query vectors at the datastore's key layer.
            gen: the row's generation (its config and candidate set).

        Returns a :class:`Step`: p_M (T, V) and lambda (T,); without candidates
        p_M is p_LM, lambda 1 and there are no neighbours (r = 0).
        """
        config = gen.config
        p_lm = torch.softmax(logits, dim=-1)
        t = p_lm.shape[0]
        no_neighbours = torch.full((t, 0), -1, dtype=torch.long)
        if gen.candidates is None:
            return Step(p_lm, torch.ones(t), no_neighbours, no_neighbours, torch.ones(t))
        nb = gen.candidates.search(queries, config.token_k)
        p_knn = knn_distribution(nb.scores, nb.values, p_lm.shape[1], config.knn_temperature)
        if config.mode == "knnlm":
            lam = torch.full((t,), config.knnlm_lambda)
        else:
            lam = rrc_lambda(nb.scores, *self.rrc_parameters(config))
        has = torch.isfinite(nb.scores).any(-1)
        lam = torch.where(has, lam, torch.ones_like(lam))
        values = nb.values.masked_fill(~torch.isfinite(nb.scores), -1)
        return Step(mix(p_lm, p_knn, lam), lam, values, nb.entries, distance_ratio(nb.scores))

    # ------------------------------------------------------------------ propose: next token and draft
    def propose(
        self,
        gen: Generation,
        step: Step,
        row: int,
        continuation: Optional[tuple[int, int]],
        generator: Optional[torch.Generator],
    ) -> tuple[TokenRecord, list[TokenRecord]]:
        """The next token and the draft that follows it, from the p_M at position ``row`` of ``step``.

        A copy is proposed (in ``nest`` / ``ra_nest`` with candidates) from, in this
        order: the planned opening (``gen.opening``, used once); ``continuation``, where
        the last copy goes on; the best neighbour when lambda <= delta
        (:meth:`_select_span`). The copy's first token must pass the relaxed check
        against this p_M (a section's title, and the line break that opens its window
        after it, need not: ``gen.copying_title``, ``gen.after_title``); then it is the
        next token and the rest of the copy, up to :meth:`_copy_end`, the draft (to be
        verified by :meth:`verify` after the next forward). Otherwise the next token is
        drawn from p_M (:meth:`_pick`, with tokens that would repeat an n-gram masked)
        and the draft is empty.

        Args:
            continuation: ``(passage index, position)`` a copy goes on at, from
                :meth:`verify`; None after an LM token or a rejected draft.
            generator: the row's sampling generator (``config.seed``), or None.
        """
        config = gen.config
        p_m = step.p_m[row]
        proposal = None
        unchecked = False  # the opening line break under a copied title, or a planned window copied whole
        whole = False  # a planned window: its whole draft goes unchecked, not its first token alone
        if config.mode in ("nest", "ra_nest") and gen.candidates is not None:
            if gen.opening is not None and gen.copying_title and gen.window_end is not None:
                (pidx, pos), gen.opening = gen.opening, None
                encoded = gen.candidates.passage(pidx)
                positions = title_tokens(self.datastore.passages[pidx].text, encoded.char_spans, pos, gen.window_end[1])  # type: ignore[union-attr]
                title = [TokenRecord(int(encoded.token_ids[i]), pidx, i) for i in positions]
                gen.unchecked_draft = True  # a label a reader sees above the section, not a continuation to judge
                return title[0], title[1:]
            if gen.opening is not None:
                (pidx, pos), gen.opening = gen.opening, None
                text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)  # type: ignore[union-attr]
                proposal = (pidx, self._opening_token(encoded, text, pos))
                line_break = not text[slice(*encoded.char_spans[proposal[1]])].strip()
                whole = self._whole_window(gen, *proposal)
                unchecked, gen.after_title = (gen.after_title and line_break) or whole, False
            elif continuation is not None and (resumed := self._continue_at(gen.candidates, *continuation)) is not None:
                proposal = resumed
                if whole := self._whole_window(gen, *proposal):
                    unchecked = True
                    proposal = self._past_hidden(gen, *proposal)
                    if proposal is None:  # the rest of the window is markup a reader does not see
                        self._end_window(gen)
                        if gen.finished:  # commit takes nothing more
                            return TokenRecord(next(iter(self.eos_ids), 0)), []
                        return self.propose(gen, step, row, None, generator)
            elif float(step.lam[row]) <= config.delta:
                proposal = self._select_span(gen, p_m, step.values[row], step.entries[row])
        if proposal is not None:
            pidx, pos = proposal
            tokens = gen.candidates.passage(pidx).token_ids  # type: ignore[union-attr]
            end = self._copy_end(gen, pidx, pos)
            span = [TokenRecord(int(tokens[i]), pidx, i) for i in range(pos, end)]
            if span and unchecked:
                gen.unchecked_draft = whole
                return span[0], span[1:]
            first_ok = relaxed_accept_ratio(p_m[None], torch.tensor([span[0].token_id]), config.effective_gamma) if span else None
            if first_ok is not None and float(first_ok[0]) > config.accept_threshold:
                return span[0], span[1:]
        if config.mode in ("nest", "ra_nest") and (in_code := self._inside_copied_code(gen)) is not None:
            return in_code
        if config.mode in ("nest", "ra_nest") and (repeats := repeating_tokens(gen.ids, config.lm_repeat_ngram)):
            p_m = p_m.index_fill(0, torch.tensor(sorted(repeats)), 0.0)
        return TokenRecord(self._pick(p_m, config, generator)), []

    @staticmethod
    def _whole_window(gen: Generation, pidx: int, pos: int) -> bool:
        """Whether a copy from token ``pos`` of passage ``pidx`` goes on with the window of a planned
        answer being copied (``gen.window_end``), which is then copied without the LM's check
        (``gen.planned``: ``config.check_answer_windows`` off)."""
        end = gen.window_end
        return gen.planned and end is not None and pidx == end[0] and pos <= end[1]

    def _past_hidden(self, gen: Generation, pidx: int, pos: int) -> Optional[tuple[int, int]]:
        """Where the whole-window copy at token ``pos`` of passage ``pidx`` goes on: the first token
        from ``pos`` to the window's last that a reader sees (markup such as an inline HTML tag is
        skipped, not left for the LM to write around), or None when there is none."""
        assert gen.candidates is not None and gen.window_end is not None and self.datastore is not None
        visible = copyable_tokens(self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans)
        ahead = np.flatnonzero(visible[pos : gen.window_end[1] + 1])
        return (pidx, pos + int(ahead[0])) if len(ahead) else None

    def _inside_copied_code(self, gen: Generation) -> Optional[tuple[TokenRecord, list[TokenRecord]]]:
        """Where the LM would write next while the answer's last token was copied from inside a
        Markdown code block (:func:`~nest_integrations.corpus.markdown_structure.open_code_block`): the
        next token and draft that keep the code the source's, all unchecked, or None outside code.

        Model text spliced into copied code reads as the documentation's own (an option that
        does not exist inside a copied command), so: mid-line, the copy goes on to the line's
        end; at a line's end, the block's closing fence is copied and the answer ends there
        (``answered``); a block without one (indented, or cut by the chunking) ends the answer
        at the LM's token (``gen.between_windows``)."""
        last = gen.records[-1] if gen.records else None
        if last is None or last.passage_index is None or gen.candidates is None or self.datastore is None:
            return None
        pidx, pos = int(last.passage_index), int(last.position)  # type: ignore[arg-type]
        text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)
        copied_to = int(encoded.char_spans[pos, 1])
        block = open_code_block(text, copied_to)
        if block is None:
            return None
        line_end = text.find("\n", copied_to, block[1])
        if text[copied_to : line_end if line_end >= 0 else block[1]].strip():  # mid-line
            stop = int(np.searchsorted(encoded.char_spans[:, 0], line_end if line_end >= 0 else block[1], side="left"))
            positions = range(pos + 1, max(stop, pos + 2))
        elif (fence := closing_fence(text, block)) is not None:
            fence_start = fence[0] + 1 if gen.text.rstrip(" \t").endswith("\n") else fence[0]
            first = int(np.searchsorted(encoded.char_spans[:, 0], fence_start, side="left"))
            last_token = int(np.searchsorted(encoded.char_spans[:, 0], fence[1], side="left")) - 1
            positions = range(first, last_token + 1)
            gen.window_end, gen.next_windows, gen.copying_title = (pidx, last_token), [], False
        else:
            gen.between_windows = True  # the LM's token ends the answer where the copied code line does
            return None
        span = [TokenRecord(int(encoded.token_ids[i]), pidx, i) for i in positions if i < len(encoded.token_ids)]
        if not span:
            gen.between_windows = True
            return None
        gen.unchecked_draft = True
        return span[0], span[1:]

    def _select_span(self, gen: Generation, p_m: torch.Tensor, values: torch.Tensor, entries: torch.Tensor) -> Optional[tuple[int, int]]:
        """(passage index, start position) of the neighbour whose value has the highest p_M
        among those where a copy may start (:meth:`_seam_ok`; the first ``_SEAM_TRIES``),
        preferring one whose source continues the text so far (:meth:`_continues`)."""
        assert gen.candidates is not None
        live = values >= 0
        if not bool(live.any()):
            return None
        probs = torch.where(live, p_m[values.clamp_min(0)], torch.full_like(values, -1.0, dtype=p_m.dtype))
        order = probs.argsort(descending=True)[: int(live.sum())]
        allowed = [
            source for source in (gen.candidates.entry_source(int(entries[best])) for best in order[:_SEAM_TRIES].tolist())
            if self._seam_ok(gen, *source)
        ]
        # A neighbour where its source really continues the text so far beats a mere sentence start.
        return next((source for source in allowed if self._continues(gen, *source)), allowed[0] if allowed else None)

    def _seam_ok(self, gen: Generation, pidx: int, pos: int) -> bool:
        """Whether a copy from token ``pos`` of passage ``pidx`` may follow the text so far
        (:func:`acceptable_start`; always when ``config.seams`` is off)."""
        if not gen.config.seams:
            return True
        assert gen.candidates is not None and self.datastore is not None
        text = self.datastore.passages[pidx].text
        starts = gen.starts.setdefault(pidx, sentence_starts(text))
        return acceptable_start(gen.lead_in + gen.text, text, int(gen.candidates.passage(pidx).char_spans[pos, 0]), starts)

    def _continues(self, gen: Generation, pidx: int, pos: int) -> bool:
        """Whether token ``pos`` of passage ``pidx`` starts where its source continues the text so far."""
        assert gen.candidates is not None and self.datastore is not None
        char_pos = int(gen.candidates.passage(pidx).char_spans[pos, 0])
        return continues(gen.lead_in + gen.text, self.datastore.passages[pidx].text, char_pos)

    @staticmethod
    def _opening_token(encoded: EncodedPassage, text: str, pos: int) -> int:
        """Where a copy planned at token ``pos`` starts: ``pos`` when it is the line break
        before a later answer window, else the first token there a copy may start with (an
        opening planned at a Markdown heading starts below it: :func:`first_copyable`)."""
        if not text[slice(*encoded.char_spans[pos])].strip():
            return pos
        return first_copyable(text, encoded.char_spans, pos)

    def _copy_end(self, gen: Generation, pidx: int, pos: int) -> int:
        """Where a copy from token ``pos`` of passage ``pidx`` must end (exclusive): at most
        ``span_length`` tokens, never past the passage, never into Markdown a reader does not
        see (:func:`~nest_integrations.corpus.markdown_structure.copyable_end`), never into a token this
        answer has already copied (a used entry), never completing a run of ``repeat_ngram`` tokens the
        answer already holds (:func:`~nest_integrations.policy.repetition.repeat_free_length`)."""
        candidates, config = gen.candidates, gen.config
        assert candidates is not None
        tokens = candidates.passage(pidx).token_ids
        end = min(len(tokens), pos + config.span_length)
        end = copyable_end(self.datastore.passages[pidx].text, candidates.passage(pidx).char_spans, pos, end)  # type: ignore[union-attr]
        end = next((i for i in range(pos, end) if candidates.is_used(pidx, i)), end)
        if self._whole_window(gen, pidx, pos):
            return end  # the planned window is the source's text, repeats and all
        return pos + repeat_free_length(gen.ids, [int(t) for t in tokens[pos:end]], config.repeat_ngram)

    @staticmethod
    def _pick(p_m: torch.Tensor, config: NestConfig, generator: Optional[torch.Generator]) -> int:
        """A token id from p_M (V,): its argmax when greedy, else sampled at ``temperature`` within ``top_p``."""
        if not config.do_sample or config.temperature == 0:
            return int(p_m.argmax())
        probs = p_m.pow(1.0 / config.temperature)
        probs = probs / probs.sum()
        if config.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < config.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        return int(torch.multinomial(probs, 1, generator=generator))

    # ------------------------------------------------------------------ verify: relaxed acceptance of the draft
    def verify(
        self, gen: Generation, step: Step, first: TokenRecord, draft: Sequence[TokenRecord]
    ) -> tuple[int, Optional[tuple[int, int]]]:
        """Verify ``draft`` (fed after ``first``; ``step`` holds p_M at each fed position)
        by relaxed speculative acceptance and commit its longest acceptable prefix.

        Args:
            step: the mixture at the 1 + len(draft) positions fed for this row:
                position i holds p_M after ``first`` and ``draft[:i]``.
            first: the token :meth:`propose` returned (already committed).
            draft: the tokens fed after it, each checked against p_M at its position.

        Returns the accepted length (which is also where in ``step`` the next
        token's distribution sits) and where a copy goes on without a new span
        selection: after a fully accepted draft, or after a copied single token.
        """
        config = gen.config
        accepted = 0
        if draft and gen.unchecked_draft:
            accepted = len(draft)
            self.commit(gen, draft)
        elif draft:
            ratios = relaxed_accept_ratio(step.p_m[: len(draft)], torch.tensor([r.token_id for r in draft]), config.effective_gamma)
            accepted = accepted_prefix_length(ratios, config.accept_threshold)
            self.commit(gen, draft[:accepted])
        gen.unchecked_draft = False
        continuation = None
        if draft and accepted == len(draft) and draft[-1].passage_index is not None:
            continuation = (draft[-1].passage_index, draft[-1].position + 1)
        elif not draft and first.passage_index is not None:
            continuation = (first.passage_index, first.position + 1)
        return accepted, continuation  # type: ignore[return-value]

    # ------------------------------------------------------------------ commit and the stop rules
    def commit(self, gen: Generation, records: Sequence[TokenRecord]) -> None:
        """Append accepted tokens; stop at EOS, a stop string, max_new_tokens, the end of the source,
        the last answer window's end, or an LM token where the next answer window should open."""
        tokenizer = self.lm.tokenizer
        if gen.finished:
            return
        for record in records:
            if record.token_id in self.eos_ids:
                gen.finish("eos")
                return
            if record.passage_index is None and (gen.between_windows or (gen.planned and gen.records)):
                gen.finish("answered")  # the LM refused the next window, or would write in a planned answer
                return
            gen.between_windows = False
            gen.records.append(record)
            gen.ids.append(record.token_id)
            text = tokenizer.decode(gen.ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            # A token ending inside a multi-byte character decodes to U+FFFD until
            # the next token completes it; it owns no characters until then.
            partial = text.endswith("\ufffd")
            gen.boundaries.append((gen.boundaries[-1] if gen.boundaries else 0) if partial else len(text))
            gen.text = text
            copied = record.passage_index is not None and gen.candidates is not None
            if copied:
                gen.candidates.mark_used(record.passage_index, record.position, record.position)  # type: ignore[union-attr, arg-type]
            if any(s in gen.text for s in gen.config.stop):
                gen.finish("stop")
            elif len(gen.records) >= gen.config.max_new_tokens:
                gen.finish("length")
            elif copied and gen.window_end == (record.passage_index, record.position):
                self._end_window(gen)
            elif copied and gen.config.stop_at_source_end and self._source_exhausted(gen.candidates, record):  # type: ignore[arg-type]
                gen.finish("source_end")
            if gen.finished:
                return

    @staticmethod
    def _end_window(gen: Generation) -> None:
        """The planned copy ``gen.window_end`` names is done: the answer ends (``answered``), or the
        next planned copy opens."""
        if not gen.next_windows:
            gen.finish("answered")
            return
        gen.between_windows = not gen.copying_title  # a title is followed by its window, whatever the LM says
        gen.after_title = gen.copying_title
        (gen.opening, gen.window_end, gen.copying_title), *gen.next_windows = gen.next_windows

    def _source_exhausted(self, candidates: CandidateSet, record: TokenRecord) -> bool:
        """Whether ``record`` copied the last token of its passage and no candidate
        passage continues it (the next chunk of the same document), or the last token
        of a Markdown section (a heading follows: :func:`section_ends_at`)."""
        pidx, pos = int(record.passage_index), int(record.position)  # type: ignore[arg-type]
        text = self.datastore.passages[pidx].text  # type: ignore[union-attr]
        return self._continue_at(candidates, pidx, pos + 1) is None or section_ends_at(text, int(candidates.passage(pidx).char_spans[pos, 1]))

    # ------------------------------------------------------------------ where a source goes on
    def _continue_at(self, candidates: CandidateSet, pidx: int, pos: int) -> Optional[tuple[int, int]]:
        """Where a copy that reached token ``pos`` of passage ``pidx`` goes on: that token,
        or past a passage's end the first new token of the next chunk of its document
        (:meth:`next_chunk`); None when the source ends there."""
        return (pidx, pos) if self._passage_has(candidates, pidx, pos) else self.next_chunk(candidates, pidx)

    def next_chunk(self, candidates: CandidateSet, pidx: int) -> Optional[tuple[int, int]]:
        """(passage index, token position) where the chunk after passage ``pidx`` in its
        document starts anew, when that chunk is a candidate.

        Chunks chain by ``doc_id`` and ``doc_char_start`` (the CLI's chunking,
        LangChain's ``add_start_index``, LlamaIndex's ``start_char_idx``). The
        next chunk starts at most 2 characters (whitespace) after this one ends,
        or before it when the splitter overlaps chunks: its tokens that repeat
        this chunk's end are skipped.
        """
        passages = self.datastore.passages  # type: ignore[union-attr]
        here = passages[pidx]
        if not here.doc_id:
            return None
        following = [
            q for q in candidates.passage_indices
            if passages[q].doc_id == here.doc_id and here.doc_char_start < passages[q].doc_char_start <= here.doc_char_end + 2
        ]
        if not following:
            return None
        nxt = min(following, key=lambda q: passages[q].doc_char_start)
        token_ends = passages[nxt].doc_char_start + candidates.passage(nxt).char_spans[:, 1]
        pos = int(np.searchsorted(token_ends, here.doc_char_end, side="right"))
        return (nxt, pos) if self._passage_has(candidates, nxt, pos) else None

    @staticmethod
    def _passage_has(candidates: CandidateSet, pidx: int, pos: int) -> bool:
        """Whether passage ``pidx`` has a token at position ``pos``."""
        return pos < len(candidates.passage(pidx).token_ids)

    # ------------------------------------------------------------------ output
    def _final_text(self, gen: Generation) -> str:
        """``gen.text`` up to the first stop string it holds."""
        cut = min((gen.text.find(s) for s in gen.config.stop if s and s in gen.text), default=-1)
        return gen.text[:cut] if cut >= 0 else gen.text

    def stable_length(self, gen: Generation) -> int:
        """Characters that can be streamed: not past a possible stop-string start."""
        text = self._final_text(gen)
        if len(text) < len(gen.text) or gen.finished:
            return len(text)
        text = text[: gen.boundaries[-1] if gen.boundaries else 0]
        hold = 0
        for stop in gen.config.stop:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        return len(text) - hold

    def spans(self, gen: Generation) -> tuple[list[Span], list[int]]:
        """The spans tiling the text so far (up to a stop string), and each span's length in tokens."""
        text = self._final_text(gen)
        passages = self.datastore.passages if self.datastore is not None else []

        def char_spans_of(pidx: int) -> Any:
            assert gen.candidates is not None
            return gen.candidates.passage(pidx).char_spans

        # The last token owns whatever its decode left unassigned (a trailing partial character).
        boundaries = gen.boundaries[:-1] + [len(gen.text)] if gen.boundaries else []
        return build_spans(text, boundaries, gen.records, passages, char_spans_of)

    def build_output(self, gen: Generation) -> NestOutput:
        """The output contract of ``gen``: final text, spans, attribution and stats."""
        spans, lengths = self.spans(gen)
        ratio, mean_span, sources = summarize(spans, lengths)
        gen.stats.new_tokens = len(gen.records)
        return NestOutput(
            text=self._final_text(gen),
            mode=gen.config.mode,
            spans=spans,
            attribution_ratio=ratio,
            mean_copied_span_tokens=mean_span,
            sources=sources,
            stats=gen.stats,
        )
