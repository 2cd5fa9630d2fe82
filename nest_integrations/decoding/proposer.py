"""The proposer of NEST decoding: :class:`SpanProposer`, a row's next token and the draft after it.

In ``nest`` / ``ra_nest`` a proposal is made from the p_M of the last accepted position (the
last :class:`~nest_integrations.decoding.proposal.Verdict`), as a draft proposer makes one in
speculative decoding: lambda > delta: one token from p_M; otherwise the passage continuation
that starts at the neighbour value with the highest p_M (at most ``span_length`` tokens, never
past the passage end). Its first token is checked against the current p_M; the rest is the
draft, which the :class:`~nest_integrations.decoding.verifier.SpanVerifier` checks after the
next forward. A fully accepted span is continued from the same passage without a new span
selection, and copied entries are masked so a span is not copied twice.

Beyond the paper, each decision is a small rule of its own:

* where a copy may start: :func:`~nest_integrations.policy.copy_policy.acceptable_start`
  (``seams``), preferring a source that continues the text so far;
* where a copy ends: at most ``span_length`` tokens, never into Markdown a reader
  does not see, never into a token already copied, never completing a repeated n-gram;
* where the answer opens: the generation's :class:`~nest_integrations.decoding.copy_plan.CopyPlan`
  (made by :mod:`~nest_integrations.decoding.prepare`): a planned window is copied whole, without
  the relaxed check (``config.check_answer_windows`` off), a section's title unchecked above it;
* inside copied code the LM writes nothing: the copy goes on to the line's end, or to the
  block's closing fence; nor does the token budget end inside it: the copy stops at the last
  line end from which the budget can still close the block, and the closing fence ends the answer;
  in the prose of a chat answer, a copy the budget would cut mid-sentence stops at the last
  sentence end it reaches;
* two planned copies that would run into each other get a paragraph break between them, and so
  does a copy that goes on past a line of markup or across a chunker's cut.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

import numpy as np
import torch

from nest_integrations.core.config import NestConfig
from nest_integrations.core.mixture import relaxed_accept_ratio
from nest_integrations.corpus.markdown_structure import (
    below_hidden_line, closing_fence, closing_fence_line, code_block_at, copyable_end, copyable_tokens, ends_in_code, first_copyable,
    missing_indentation, open_code_block, opening_fence, past_markup_indent, shallow_code_block, shallow_code_entry, title_tokens, unclosed_fence,
    unfenced_code_block,
)
from nest_integrations.policy.copy_policy import acceptable_start, continues, ends_sentence, sentence_ends, sentence_starts, stops_whole
from nest_integrations.policy.repetition import repeat_free_length, repeating_tokens
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import EncodedPassage
from .chunk_chain import continue_at, cut_between, cut_width, next_chunk, text_read_before
from .generation import Generation
from .mixing import Mixture
from .proposal import Proposal, Verdict, WholeEnds
from .spans import TokenRecord

__all__ = ["SpanProposer", "line_break_id", "paragraph_break_id"]

_FENCE_ROOM = 8
"""Tokens a closing fence on a line of its own may take (three backticks and a line break take 2
with the default tokenizer): a copy in code that ends this far before the budget is not parsed."""

_SEAM_TRIES = 32
"""Neighbours tried, best p_M first, for one where a copy may start; beyond, the LM writes a token."""


class SpanProposer:
    """Proposes each row's next token and draft: copied spans of the candidate passages, or a token from p_M.

    Stateless between calls apart from the :class:`Generation` it is given (its copy plan and
    used-entry mask), so one object serves every row of a decoder, from any thread.
    Positions are token indices into a candidate passage's ``token_ids``; a
    ``(passage index, position)`` pair names one datastore entry.

    Args:
        datastore: the token datastore the candidate passages index into; None when the decoder
            has none (then no generation has candidates and every token is the LM's).
        eos_ids: token ids that end a generation (proposed when a planned answer ends on
            markup a reader does not see).
        break_id: the tokenizer's one token for a paragraph break (``"\n\n"``, else
            ``"\n"``; :func:`paragraph_break_id`), set between two planned copies that would
            run into each other; None: none is set.
        line_break_id: the tokenizer's one token for ``"\n"`` (:func:`line_break_id`), set where
            a copy crosses a chunker's cut of one character; None: the paragraph break is set.
    """

    def __init__(
        self, datastore: Optional[TokenDatastore], eos_ids: set[int], break_id: Optional[int] = None, line_break_id: Optional[int] = None,
    ):
        self.datastore = datastore
        self.eos_ids = eos_ids
        self.break_id = break_id
        self.line_break_id = line_break_id

    def propose(self, gen: Generation, verdict: Verdict, generator: Optional[torch.Generator]) -> Proposal:
        """The next token and the draft that follows it, from the p_M at the next token's position
        of ``verdict`` (``verdict.accepted``).

        A copy is proposed (in ``nest`` / ``ra_nest`` with candidates) from, in this order: the
        plan's opening (used once); ``verdict.resume_at``, where the last copy goes on; after a
        token copied from inside a code block, the rest of its line or the block's end
        (:meth:`_inside_copied_code`: no span from elsewhere inside copied code); the best
        neighbour when lambda <= delta (:meth:`_select_span`). The copy's first token must
        pass the relaxed check against this p_M (a section's title, and the line break that opens
        its window after it, need not: ``plan.copying_title``, ``plan.after_title``); then it is
        the next token and the rest of the copy, up to :meth:`_copy_end`, the draft. Otherwise the
        next token is drawn from p_M (:meth:`_pick`, with tokens that would repeat an n-gram
        masked) and the draft is empty.

        Args:
            generator: the row's sampling generator (``config.seed``), or None.
        """
        return self._propose(gen, verdict.mixture, verdict.accepted, verdict.resume_at, generator)

    def _propose(
        self, gen: Generation, mixture: Mixture, at: int, resume_at: Optional[tuple[int, int]], generator: Optional[torch.Generator]
    ) -> Proposal:
        """:meth:`propose` from position ``at`` of ``mixture``, a copy going on at ``resume_at``."""
        config, plan = gen.config, gen.plan
        p_m = mixture.p_m[at]
        proposal = None
        unchecked = False  # the opening line break under a copied title, or a planned window copied whole
        whole = False  # a planned window: its whole draft goes unchecked, not its first token alone
        announced = False  # a copy going on where the source does: its first line goes unchecked
        goes_on = False  # the copy goes on where the last one ended (its passage, or the next chunk of its document)
        if config.mode in ("nest", "ra_nest") and gen.candidates is not None:
            planned_opener = self._planned_opener(gen) if plan.opening is not None else None
            if self._fence_wanted(gen, planned_opener) and (first := self._first_text(gen, *plan.opening)) is not None:  # type: ignore[misc]
                # The copy opens at its first line's text, so the fence stands right above the code
                # (the break, the fence and the indentation set by the decoder), not a blank line.
                plan.opening = (plan.opening[0], first)  # type: ignore[index]
                planned_opener = self._planned_opener(gen)
            if plan.opening is not None and not plan.announced and (fence := self._closing_fence(gen, planned_opener)) is not None:
                return fence
            if plan.opening is not None and (separator := self._break_before_opening(gen, planned_opener)) is not None:
                return Proposal(TokenRecord(separator, separator=True))
            if plan.opening is not None and plan.copying_title and plan.window_end is not None:
                pidx, pos = plan.take_opening()  # type: ignore[misc]
                encoded = gen.candidates.passage(pidx)
                positions = title_tokens(self.datastore.passages[pidx].text, encoded.char_spans, pos, plan.window_end[1])  # type: ignore[union-attr]
                title = [TokenRecord(int(encoded.token_ids[i]), pidx, i) for i in positions]
                # A label a reader sees above the section, not a continuation to judge.
                return Proposal(title[0], title[1:], unchecked=True)
            if plan.opening is not None and (opener := self._opening_fence(gen, planned_opener)):
                return _set_by_decoder(opener)
            if plan.opening is not None and (indentation := self._indentation(gen)):
                return _set_by_decoder(indentation)
            if plan.opening is not None:
                pidx, pos = plan.take_opening()  # type: ignore[misc]
                text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)  # type: ignore[union-attr]
                proposal = (pidx, self._opening_token(encoded, text, pos))
                line_break = not text[slice(*encoded.char_spans[proposal[1]])].strip()
                whole, announced = plan.copies_whole(*proposal), plan.take_announced()
                unchecked, plan.after_title = (plan.after_title and line_break) or whole or announced, False
            elif resume_at is not None and (resumed := continue_at(self.datastore.passages, gen.candidates, *resume_at)) is not None:  # type: ignore[union-attr]
                goes_on = True
                if whole := plan.copies_whole(*resumed):
                    unchecked = True
                    proposal = self._past_hidden(gen, *resumed, gen.plan.window_end[1])  # type: ignore[index]
                    if proposal is None:  # the rest of the window is markup a reader does not see
                        gen.end_planned_copy()
                        if gen.finished:
                            return self._nothing_more()
                        # The next window opens, or this one runs on from here, past its markup.
                        return self._propose(gen, mixture, at, resume_at, generator)
                else:  # a copy running on: past a directive line or a comment, as a reader reads on
                    proposal = self._next_visible(gen, *resumed)
                    if proposal is not None and self._skips_a_lines_end(gen, resumed, proposal):
                        plan.announced = True  # the source's next line, as after a break
                if proposal is not None and (fenced := self._fence_going_on(gen, mixture, at, proposal, generator)) is not None:
                    return fenced
                if proposal is not None and (separator := self._break_before(gen, resume_at[0], resumed, proposal)) is not None:
                    plan.opening, plan.announced = proposal, True  # copied after the break, as a planned opening is
                    return Proposal(TokenRecord(separator, separator=True))
                announced = proposal is not None and plan.take_announced()
                unchecked = unchecked or announced
            elif (in_code := self._inside_copied_code(gen)) is not None:
                return in_code  # no span from elsewhere spliced into copied code
            elif float(mixture.lam[at]) <= config.delta:
                proposal = self._select_span(gen, p_m, mixture.values[at], mixture.entries[at])
        if proposal is not None:
            pidx, pos = proposal
            tokens = gen.candidates.passage(pidx).token_ids  # type: ignore[union-attr]
            # Past a planned answer's windows a copy that goes on where the last one ended is the
            # source's text, repeats and all, as a planned window is: an example that writes
            # `@click.command()` again was cut there, mid-example.
            end = self._copy_end(gen, pidx, pos, source_repeats=announced or (goes_on and plan.whole))
            span = [TokenRecord(int(tokens[i]), pidx, i) for i in range(pos, end)]
            if span and (fits := self._in_budget(gen, pidx, pos, len(span))) < len(span):
                if fits == 0:
                    return self._close_for_budget(gen)
                span = span[:fits]
            if span and announced and not whole:
                span = span[: self._first_line_length(gen, pidx, pos, end)]
                return Proposal(span[0], span[1:], unchecked=True)
            if span and unchecked:
                return Proposal(span[0], span[1:], unchecked=whole)
            first_ok = relaxed_accept_ratio(p_m[None], torch.tensor([span[0].token_id]), config.effective_gamma) if span else None
            if first_ok is not None and float(first_ok[0]) > config.accept_threshold:
                # Past a whole plan's windows the answer ends where the LM refuses the copy: at a whole sentence.
                return Proposal(span[0], span[1:], whole_ends=partial(self._whole_ends, gen, pidx, pos, len(span)) if plan.whole else None)
        if config.mode in ("nest", "ra_nest") and (in_code := self._inside_copied_code(gen)) is not None:
            return in_code
        if config.mode in ("nest", "ra_nest") and (repeats := repeating_tokens(gen.ids, config.lm_repeat_ngram)):
            p_m = p_m.index_fill(0, torch.tensor(sorted(repeats)), 0.0)
        return Proposal(TokenRecord(self._pick(p_m, config, generator)))

    def _closing_fence(self, gen: Generation, planned_opener: Optional[str]) -> Optional[Proposal]:
        """The fence that closes a code block the answer so far leaves open, on a line of its own,
        before a copy from elsewhere opens (:func:`~nest_integrations.corpus.markdown_structure.unclosed_fence`:
        a window ended where a chunker cut its code); None when no block is open or the budget
        cannot hold it, or when the open block is the one the decoder has just opened for the copy
        (:meth:`_opening_fence`; ``planned_opener`` is :meth:`_planned_opener`). Like a paragraph
        break between copies, it is set by the decoder: not copied, and no word of the model's own."""
        if planned_opener is not None and gen.text.rstrip(" \t").endswith(planned_opener):  # opened for it (and indented)
            return None
        return self._fence_closing(gen)

    def _decoder_tokens(self, text: Optional[str]) -> list[int]:
        """Token ids of ``text`` the decoder sets: the fence line that closes a fenced block
        (:func:`~nest_integrations.corpus.markdown_structure.closing_fence_line`), a code line's
        indentation (:meth:`_indentation`); [] for None or ""."""
        if not text or self.datastore is None:
            return []
        ids, _ = self.datastore.encoder.tokenize(text)
        return [int(i) for i in ids]

    def _opening_fence(self, gen: Generation, planned_opener: Optional[str]) -> list[int]:
        """Token ids of the fence that opens the fenced code block the planned copy about to open
        starts inside (:func:`~nest_integrations.corpus.markdown_structure.opening_fence`: a
        window opening at a line of code, its opener above it or in a chunk before), when the
        copy opens a line of the answer outside a fenced block; [] otherwise. Set by the decoder,
        as the fence that closes a block is: without it a reader sees the copied code as prose and
        the source's closing fence as opening a block. ``planned_opener``: :meth:`_planned_opener`."""
        if (gen.text and not gen.text.endswith("\n")) or not self._fence_wanted(gen, planned_opener):
            return []
        return self._decoder_tokens(planned_opener)

    def _fence_wanted(self, gen: Generation, planned_opener: Optional[str]) -> bool:
        """Whether the decoder sets a fence above the planned copy about to open: it opens inside a
        code block its opener is out of (``planned_opener``: :meth:`_planned_opener`), the answer
        holds no open block (:func:`~nest_integrations.corpus.markdown_structure.unclosed_fence`),
        and the budget holds the fence with a line of code under it (:meth:`_fence_fits`)."""
        if planned_opener is None or unclosed_fence(gen.text) is not None:
            return False
        pidx, pos = gen.plan.opening  # type: ignore[misc]
        text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)  # type: ignore[union-attr]
        return self._fence_fits(gen, pidx, self._opening_token(encoded, text, pos), planned_opener)

    def _fence_fits(self, gen: Generation, pidx: int, first: int, opener: str) -> bool:
        """Whether the budget holds a paragraph break, the fence ``opener``, the first line of a
        copy from token ``first`` of passage ``pidx`` and the fence that closes the block: a fence
        with no line of code under it would leave an empty block at the answer's end."""
        tokens = len(gen.candidates.passage(pidx).token_ids)  # type: ignore[union-attr]
        line = self._first_line_length(gen, pidx, first, tokens) if first < tokens else 0
        fences = len(self._decoder_tokens(opener)) + len(self._decoder_tokens("\n" + opener.strip()))
        return 1 + fences + line <= gen.tokens_left()

    def _fence_going_on(
        self, gen: Generation, mixture: Mixture, at: int, going_on: tuple[int, int], generator: Optional[torch.Generator]
    ) -> Optional[Proposal]:
        """What the decoder sets before a copy that goes on at ``going_on`` (a passage index and
        token position) crosses between code and prose: into code (:meth:`_fence_into_code`) while
        the answer holds no block open, out of it (:meth:`_fence_out_of_code`) while it holds one;
        None when it crosses neither way. Without them a Markdown reader shows the code as prose,
        or the prose as code."""
        if unclosed_fence(gen.text) is None:
            return self._fence_into_code(gen, mixture, at, going_on, generator)
        return self._fence_out_of_code(gen, going_on)

    def _fence_into_code(
        self, gen: Generation, mixture: Mixture, at: int, going_on: tuple[int, int], generator: Optional[torch.Generator]
    ) -> Optional[Proposal]:
        """A copy going on at ``going_on`` into code whose fence is out of the copy
        (:func:`~nest_integrations.corpus.markdown_structure.opening_fence`: past a ``::`` or a code
        directive's line, a reStructuredText body indented three spaces, or one indented four
        under a list item's text, which the answer would read as the item's): it opens as a planned
        copy does, with the break and the fence above it. None when the code needs no fence, when
        what it would copy is copied already, when the budget would leave the block empty, or when
        the text so far ends in code (:meth:`_text_ends_in_code`: a copy cut mid-line in a fence
        indented in a list item, which the answer shows as an indented block, goes on in it)."""
        pidx, pos = going_on
        text, start = self.datastore.passages[pidx].text, self._char_at(gen, pidx, pos)  # type: ignore[union-attr]
        opener = None if self._text_ends_in_code(gen) else opening_fence(text, start, self._lead(pidx), gen.text)
        first = self._first_text(gen, pidx, pos) if opener is not None else None
        if opener is None or first is None or not self._fence_fits(gen, pidx, first, opener):
            return None
        gen.plan.opening, gen.plan.announced = going_on, True
        return self._propose(gen, mixture, at, None, generator)

    def _fence_out_of_code(self, gen: Generation, going_on: tuple[int, int]) -> Optional[Proposal]:
        """A copy going on at ``going_on`` into prose out of a block the decoder fenced
        (:meth:`_left_decoder_fence`: its source has no closing fence to copy): the closing fence
        on a line of its own, the copy going on after it; None otherwise."""
        pidx, pos = going_on
        text, start = self.datastore.passages[pidx].text, self._char_at(gen, pidx, pos)  # type: ignore[union-attr]
        if not self._left_decoder_fence(gen) or code_block_at(text, start, self._lead(pidx)) is not None:
            return None
        if (fence := self._fence_closing(gen)) is not None:
            gen.plan.opening, gen.plan.announced = going_on, True
        return fence

    def _char_at(self, gen: Generation, pidx: int, pos: int) -> int:
        """The character of passage ``pidx`` its token ``pos`` starts at; the passage's length when
        ``pos`` is past its last token."""
        char_spans = gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        return int(char_spans[pos, 0]) if pos < len(char_spans) else len(self.datastore.passages[pidx].text)  # type: ignore[union-attr]

    def _skips_a_lines_end(self, gen: Generation, resumed: tuple[int, int], going_on: tuple[int, int]) -> bool:
        """Whether a copy that was to go on at ``resumed`` goes on at ``going_on`` past markup that
        ends a line of its passage: the skipped characters hold no line break, and only white
        space stands between ``going_on`` and the next one. A paragraph's closing ``::`` is such
        markup (shown as "try:" or, one token, not at all): the LM, judging the line the source
        goes on with after text the source never ends on ("... systems, try"), refuses it."""
        if going_on[0] != resumed[0] or going_on == resumed:
            return False
        text = self.datastore.passages[going_on[0]].text  # type: ignore[union-attr]
        from_char, to_char = self._char_at(gen, *resumed), self._char_at(gen, *going_on)
        line_end = text.find("\n", to_char)
        return "\n" not in text[from_char:to_char] and line_end >= 0 and not text[to_char:line_end].strip()

    def _first_text(self, gen: Generation, pidx: int, pos: int) -> Optional[int]:
        """The first token from ``pos`` of passage ``pidx`` that shows text and a copy may start with
        (:func:`~nest_integrations.corpus.markdown_structure.first_copyable`); None when there is
        none or this answer has copied it already."""
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        first = first_copyable(text, char_spans, pos)
        return None if first >= len(char_spans) or gen.candidates.is_used(pidx, first) else first  # type: ignore[union-attr]

    def _fence_closing(self, gen: Generation) -> Optional[Proposal]:
        """The fence that closes the block the answer so far leaves open, on a line of its own, set
        by the decoder (:func:`~nest_integrations.corpus.markdown_structure.closing_fence_line`); None
        when no block is open or the budget cannot hold it with a token after it."""
        ids = self._decoder_tokens(closing_fence_line(gen.text))
        return _set_by_decoder(ids) if ids and len(ids) < gen.tokens_left() else None

    def _planned_opener(self, gen: Generation) -> Optional[str]:
        """The fence that opens the block the planned copy about to open starts inside
        (:func:`~nest_integrations.corpus.markdown_structure.opening_fence`, read after the answer so
        far), with the line break after it unless the copy brings its own; None when it opens
        outside a block that needs one."""
        if (planned := self._planned_start(gen)) is None:
            return None
        pidx, text, start = planned
        opener = opening_fence(text, start, self._lead(pidx), gen.text)
        return None if opener is None else opener + ("" if text.startswith("\n", start) else "\n")

    def _planned_start(self, gen: Generation) -> Optional[tuple[int, str, int]]:
        """Where the planned copy about to open starts: its passage's index and text, and the
        character its first token starts at (:meth:`_opening_token`); None when that is past the
        passage's last token."""
        pidx, pos = gen.plan.opening  # type: ignore[misc]
        text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)  # type: ignore[union-attr]
        first = self._opening_token(encoded, text, pos)
        return None if first >= len(encoded.char_spans) else (pidx, text, int(encoded.char_spans[first, 0]))

    def _indentation(self, gen: Generation) -> list[int]:
        """Token ids of the indentation that the planned copy about to open at a line of code does
        not bring (:func:`~nest_integrations.corpus.markdown_structure.missing_indentation`), when
        it opens a line of the answer (its first, or after a break); [] otherwise. Set by the
        decoder, as a break is: the source's white space, not copied because its tokens hold the
        line break before it too. Without it the line keeps one space of its four and reads as a
        paragraph above the block's other lines."""
        if (gen.text and not gen.text.endswith("\n")) or (planned := self._planned_start(gen)) is None:
            return []
        pidx, text, start = planned
        ids = self._decoder_tokens(missing_indentation(text, start, self._lead(pidx)))
        return ids if len(ids) < gen.tokens_left() else []  # spaces the budget leaves no copy after are none

    def _nothing_more(self) -> Proposal:
        """What a generation that has just finished proposes: a token its commit does not take."""
        return Proposal(TokenRecord(next(iter(self.eos_ids), 0)))

    def _in_budget(self, gen: Generation, pidx: int, pos: int, count: int) -> int:
        """How many of the ``count`` tokens of a copy from token ``pos`` of passage ``pidx`` the
        answer takes so that the budget cuts neither a line of copied code
        (:meth:`_code_in_budget`) nor a copied sentence (:meth:`_sentence_in_budget`); 0: the
        answer ends now (:meth:`_close_for_budget`)."""
        fits = self._code_in_budget(gen, pidx, pos, count)
        return self._sentence_in_budget(gen, pidx, pos, count) if fits == count else fits

    def _sentence_in_budget(self, gen: Generation, pidx: int, pos: int, count: int) -> int:
        """How many of the ``count`` tokens of a copy from token ``pos`` of passage ``pidx`` the answer
        takes so that the budget (:meth:`~.generation.Generation.tokens_left`) does not end it
        inside a sentence of its source, in an answer to a chat request (a plain-text prompt's
        continuation takes them all). What the copy goes on to is read ahead: its planned
        window (:attr:`~.copy_plan.CopyPlan.window_end`), else its passage. All of them when
        that ends before the budget does, or the budget ends in a code block of the source
        (whose lines :meth:`_code_in_budget` keeps whole), or the last sentence end the budget
        reaches (:func:`~nest_integrations.policy.copy_policy.stops_whole`) lies past them (a
        copy after this one stops there); else the tokens up to that end, less the white space
        after it, the budget shrinking to end the answer there (``length``); 0 (end now) when
        that is none, or when the budget reaches no such end and the answer so far stops whole;
        else all of them (the budget cuts the sentence, as it would have).

        Cut mid-sentence, an answer ends on a fragment ("... and use the **combine** command.
        If you") that reads as the start of what it was about to say; the whole sentences
        before it stand on their own."""
        room = gen.tokens_left()
        if gen.lead_in:
            return count  # a plain-text prompt's continuation: the budget cuts it, as it cuts a completion
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        in_window = gen.plan.in_planned_copy(pidx, pos) and not gen.plan.runs_on
        goes_on = gen.plan.window_end[1] + 1 - pos if in_window else len(char_spans) - pos  # type: ignore[index]
        if goes_on < room or self._open_code_block(pidx, int(char_spans[pos + room - 1, 1])) is not None:
            return count  # the copy ends before the budget does (a planned window, its passage), or in code
        taken = next((t for t in range(room, 0, -1) if stops_whole(text, int(char_spans[pos + t - 1, 1]))), None)
        if taken is None:
            return 0 if self._stops_whole_so_far(gen) else count
        while taken and not text[slice(*char_spans[pos + taken - 1])].strip():
            taken -= 1  # the white space after the sentence: nothing follows it
        if taken >= count:
            return count  # the copy after this one stops there
        gen.budget = len(gen.records) + taken
        return taken

    def _whole_ends(self, gen: Generation, pidx: int, pos: int, count: int) -> WholeEnds:
        """Where a copy of the ``count`` tokens from token ``pos`` of passage ``pidx`` may stop, as
        draft lengths ``k`` (0 <= k < ``count``): its token ``pos + k`` ends a sentence of the source
        where the answer stops whole (:func:`~nest_integrations.policy.copy_policy.stops_whole`), or
        lies in a code block (:meth:`_open_code_block`), where the rule for copied code goes on to
        the line's end and closes the block (:meth:`_inside_copied_code`)."""
        assert gen.candidates is not None and self.datastore is not None
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans
        sentence = frozenset(sentence_ends(text))
        sentences, code = set(), set()
        block: Optional[tuple[int, int]] = None  # the code block last found, read once for all its tokens
        for k in range(count):
            start, end = int(char_spans[pos + k, 0]), int(char_spans[pos + k, 1])
            if block is None or not block[0] <= start < block[1]:
                block = self._open_code_block(pidx, start)
            if block is not None:
                code.add(k)
            elif end in sentence and stops_whole(text, end):
                sentences.add(k)
        return WholeEnds(frozenset(sentences), frozenset(code))

    def _stops_whole_so_far(self, gen: Generation) -> bool:
        """Whether the answer so far stops with its last sentence whole: its last token copied where
        a sentence of its source ends (:func:`~nest_integrations.policy.copy_policy.stops_whole`),
        set by the decoder between two copies (a break: it ends with the copy before it), or
        written by the model after a sentence's end."""
        if not gen.text.strip():
            return False
        copied = self._last_copied(gen)
        if copied is None:
            return gen.records[-1].separator or ends_sentence(gen.text.rstrip())
        return stops_whole(self.datastore.passages[copied[0]].text, copied[2])  # type: ignore[union-attr]

    def _code_in_budget(self, gen: Generation, pidx: int, pos: int, count: int) -> int:
        """How many of the ``count`` tokens of a copy from token ``pos`` of passage ``pidx`` the answer
        takes so that the budget (:meth:`~.generation.Generation.tokens_left`) does not end inside
        copied code: all of them when the budget can still finish the line they end on and close
        its block, or when they end outside a code block of their source
        (:func:`~nest_integrations.corpus.markdown_structure.open_code_block`); else the most that end
        at a line end and leave the budget room for the fence that closes the
        block; 0 (close it now) when none do and the answer so far ends at a line end, else all
        of them (the budget cuts the line, as it would have). A copy ends at a line end right
        before its source's line break (the default tokenizer writes a line break and the next
        line's indentation as one token; the closing fence brings its own line break), or after
        a line break that is a token of its own.

        A budget that ends inside copied code cuts a line ("rv = click.Group.get_command(self, ctx,")
        and leaves its block open, which a Markdown reader renders as code to the end; a copy that
        stops at a line end instead, with its block closed, shows whole lines of the source. The
        answer is parsed only when the budget is within ``_FENCE_ROOM`` tokens of that line's end."""
        room = gen.tokens_left()
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        start = int(char_spans[pos, 0])

        def answer(taken: int) -> str:
            return gen.text + text[start : int(char_spans[pos + taken - 1, 1])] if taken else gen.text

        def line_done(taken: int) -> bool:  # the answer ends where a line of the source does
            return text.startswith("\n", int(char_spans[pos + taken - 1, 1]) if taken else start) or answer(taken).endswith("\n")

        newline = text.find("\n", int(char_spans[pos + count - 1, 1]))
        to_line_end = count if line_done(count) else (_first_token_from(char_spans, newline + 1) if newline >= 0 else len(char_spans)) - pos
        if to_line_end + _FENCE_ROOM < room:
            return count
        if self._open_code_block(pidx, int(char_spans[pos + min(count, room) - 1, 1])) is None:
            return count  # the budget ends in prose, as anywhere else
        for taken in range(min(count, room), 0, -1):
            done = line_done(taken)
            if not done and taken < count:
                continue
            so_far = answer(taken)
            closing = closing_fence_line(so_far)
            if closing is not None and so_far.rstrip().rsplit("\n", 1)[-1].strip().startswith(closing.lstrip("\n")):
                continue  # the block's opening line alone: an empty block
            if (taken if done else to_line_end) + len(self._decoder_tokens(closing)) <= room:
                return taken
        return 0 if gen.text.strip() and line_done(0) else count

    def _close_for_budget(self, gen: Generation) -> Proposal:
        """The budget cannot hold the next line of the copied code: the fence that closes the block
        (set by the decoder, as between two copies) ends the answer, or, for a block that needs
        none, the answer ends now (``length`` either way)."""
        fence = self._decoder_tokens(closing_fence_line(gen.text))
        if fence and len(fence) <= gen.tokens_left():
            gen.budget = len(gen.records) + len(fence)
            return _set_by_decoder(fence)
        gen.finish("length")
        return self._nothing_more()

    def _break_before_opening(self, gen: Generation, planned_opener: Optional[str]) -> Optional[int]:
        """The token the decoder sets before the planned copy about to open, so that it does not
        run into the text so far; None when it needs none. A copy runs into text when both end and
        opening are a word or a sign, no white space between ("...close the file.Path.read_bytes"):
        a window that opens at its passage's start, or after a window that ends its section, has
        no line break of its own to copy. So does the fence the decoder sets above a copy that
        opens inside a fenced block (``planned_opener``, :meth:`_planned_opener`;
        :meth:`_opening_fence`), unless the answer is inside one already: after "... writes to
        the file." the copied lines would otherwise follow without it. Either gets a paragraph
        break (``break_id``). A section's title copied as a label opens a paragraph of its own:
        :meth:`_break_above_label`."""
        if self._fence_wanted(gen, planned_opener):
            runs = bool(gen.text.strip(" \t")) and not gen.text.endswith("\n")
            return self.break_id if runs else None
        if gen.plan.copying_title and gen.plan.window_end is not None:
            return self._break_above_label(gen)
        pidx, pos = gen.plan.opening  # type: ignore[misc]
        text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)  # type: ignore[union-attr]
        return self.break_id if self._runs_into(gen, pidx, self._opening_token(encoded, text, pos)) else None

    def _break_above_label(self, gen: Generation) -> Optional[int]:
        """The token that opens a paragraph for the section title the plan copies next as a label,
        counting the line breaks the text so far ends in and those the label brings from its
        source: a paragraph break (``break_id``) for none (" Immutability" would run into "... set
        an attribute."), a line break (``line_break_id``) for one, None for two or more, or for no
        text so far. With one line break a reader, and Markdown, read the label as the last line
        of the paragraph or list item above it ("... the final output type.\nInflection
        (camel-cased keys)" reads "... the final output type. Inflection (camel-cased keys)")."""
        plan = gen.plan
        if not gen.text.strip():
            return None
        pidx, pos = plan.opening  # type: ignore[misc]
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        label = "".join(text[slice(*char_spans[i])] for i in title_tokens(text, char_spans, pos, plan.window_end[1]))  # type: ignore[index]
        breaks = gen.text[len(gen.text.rstrip()) :].count("\n") + label[: len(label) - len(label.lstrip())].count("\n")
        return self.break_id if breaks == 0 else self.line_break_id if breaks == 1 else None

    def _runs_into(self, gen: Generation, pidx: int, pos: int) -> bool:
        """Whether copying token ``pos`` of passage ``pidx`` next would run it into the text so
        far (a break token must be known). A token that opens a line (only the line's indentation
        before it in its source) runs into any text that does not end in a line break: the spaces of a code
        line's indentation separate no lines; so does any token after a text whose last line is
        code (:meth:`_text_ends_in_code`: on a closing fence's line it keeps the block open). Any
        other token runs into a text that ends in a word or a sign unless it opens with white
        space; a token that brings its own line break runs into nothing."""
        if self.break_id is None or not gen.text.strip(" \t"):
            return False  # nothing to run into: no text, or the indentation the decoder set
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        if pos >= len(char_spans):
            return False
        start = int(char_spans[pos, 0])
        token = text[start : int(char_spans[pos, 1])]
        if token.lstrip(" \t").startswith("\n"):
            return False
        if not text[text.rfind("\n", 0, start) + 1 : start].strip(" \t") or self._text_ends_in_code(gen):
            return not gen.text.rstrip(" \t").endswith("\n")
        return not gen.text[-1].isspace() and not token[:1].isspace()

    def _text_ends_in_code(self, gen: Generation) -> bool:
        """Whether the text so far ends in a line of code: its own text reads so
        (:func:`~nest_integrations.corpus.markdown_structure.ends_in_code`), or its last token was
        copied from inside a code block of its source. The source tells what the text alone
        cannot: a literal block's ``::`` or a code directive's line is markup the answer does not
        show, and a body copied without it reads as a paragraph."""
        if ends_in_code(gen.text):
            return True
        copied = self._last_copied(gen)
        return copied is not None and self._open_code_block(copied[0], copied[2] - 1) is not None

    def _last_copied(self, gen: Generation) -> Optional[tuple[int, int, int]]:
        """``(passage index, position, character end)`` of the answer's last token in its source
        passage; None when there is none or the model wrote it."""
        last = gen.records[-1] if gen.records else None
        if last is None or last.passage_index is None or gen.candidates is None or self.datastore is None:
            return None
        pidx, pos = int(last.passage_index), int(last.position)  # type: ignore[arg-type]
        return pidx, pos, int(gen.candidates.passage(pidx).char_spans[pos, 1])

    def _past_hidden(self, gen: Generation, pidx: int, pos: int, last: int) -> Optional[tuple[int, int]]:
        """Where a copy at token ``pos`` of passage ``pidx`` goes on: the first token from ``pos``
        to ``last`` that a reader sees (markup such as an inline HTML tag, or the directive line
        a chunk opens with, is skipped, not left for the LM to write around), or None when there
        is none. Past skipped markup, the indentation of a directive's body of prose is skipped
        too, and so is the line break under a hidden line above a block (:func:`_past_markup`):
        the copy opens at its text, after the decoder's paragraph break."""
        assert gen.candidates is not None and self.datastore is not None
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans
        ahead = np.flatnonzero(copyable_tokens(text, char_spans)[pos : last + 1])
        if not len(ahead):
            return None
        found = pos + int(ahead[0])
        if found > pos and (start := _past_markup(text, int(char_spans[found, 0]))) > char_spans[found, 0]:
            at_text = _token_holding(char_spans, start)
            found = at_text if at_text <= last else found
        return (pidx, found)

    def _next_visible(self, gen: Generation, pidx: int, pos: int) -> Optional[tuple[int, int]]:
        """Where a copy running on from token ``pos`` of passage ``pidx`` goes on: the first token
        from there a reader sees, in that passage or, when the rest of it is markup (the
        ``.. code-block::`` line that announces the next chunk's example), in the next chunk of
        its document; None when there is none."""
        assert gen.candidates is not None and self.datastore is not None
        visible = self._past_hidden(gen, pidx, pos, len(gen.candidates.passage(pidx).token_ids) - 1)
        if visible is not None:
            return visible
        following = next_chunk(self.datastore.passages, gen.candidates, pidx)
        if following is None:
            return None
        return self._past_hidden(gen, *following, len(gen.candidates.passage(following[0]).token_ids) - 1)

    def _first_line_length(self, gen: Generation, pidx: int, pos: int, end: int) -> int:
        """Tokens from ``pos`` (before ``end``) of passage ``pidx`` up to the end of the first line
        that shows text, or in prose whose line ends mid-sentence, of that sentence: a copy forced
        past the LM's check stops at a line's end, not mid-way through a line of code the LM might
        not go on with, nor on a hard-wrapped line's first words (a chunker that cut a paragraph
        after "... arguments." leaves "If you" the next chunk's first line)."""
        assert gen.candidates is not None and self.datastore is not None
        text, spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans
        start = int(spans[pos, 0])
        shown = len(text[start:]) - len(text[start:].lstrip())
        line_end = text.find("\n", start + shown)
        if line_end < 0:
            return end - pos
        if self._open_code_block(pidx, line_end) is None and not stops_whole(text, line_end):
            line_end = next((e for e in sentence_ends(text) if e >= line_end), line_end)
        return max(1, min(_first_token_from(spans, line_end), end) - pos)

    def _break_before(self, gen: Generation, came_from: int, resumed: tuple[int, int], going_on: tuple[int, int]) -> Optional[int]:
        """The break token a copy that came from passage ``came_from``, was to go on at ``resumed``
        and goes on at ``going_on`` instead needs first, or None when it does not run into the
        text so far (:meth:`_runs_into`). Markup skipped between them that holds a line break
        (the directive line between "... with the ``multiple`` flag:" and its example) gets the
        paragraph break, as between planned copies; markup skipped inside a line (an inline tag)
        gets none. A chunker's cut between two chunks
        (:func:`~nest_integrations.decoding.chunk_chain.cut_between`) gets the white space it
        cut as a reader saw it: one character is the line break inside a paragraph, a list or
        a block of code (a paragraph break there would split a sentence or a line of code in
        two), a longer cut the paragraph break between blocks."""
        assert self.datastore is not None and gen.candidates is not None
        passages = self.datastore.passages

        from_char, to_char = self._char_at(gen, *resumed), self._char_at(gen, *going_on)
        if going_on[0] == resumed[0]:
            skipped = passages[resumed[0]].text[from_char:to_char]
        else:
            skipped = passages[resumed[0]].text[from_char:] + passages[going_on[0]].text[:to_char]
        crossed = going_on[0] != came_from and cut_between(passages, came_from, going_on[0])
        if not ("\n" in skipped or crossed) or not self._runs_into(gen, *going_on):
            return None
        if "\n" not in skipped and cut_width(passages, came_from, going_on[0]) == 1 and self.line_break_id is not None:
            return self.line_break_id
        return self.break_id

    def _inside_copied_code(self, gen: Generation) -> Optional[Proposal]:
        """Where the LM would write next while the answer's last token was copied from inside a
        Markdown code block (:func:`~nest_integrations.corpus.markdown_structure.open_code_block`): the
        next token and draft that keep the code the source's, all unchecked, or None outside code.

        Model text spliced into copied code reads as the documentation's own (an option that
        does not exist inside a copied command), and so does a span of another source spliced
        mid-line (``C(x=`` going on with another example's ``42)``), so: mid-line, the copy goes
        on to the line's end; at a line's end, the block's closing fence is copied and the answer
        ends there (``answered``); a block without one (indented, or cut by the chunking) ends
        the answer at that line end (:meth:`_end_in_code`). A copy that reached the end of a
        block the decoder fenced (:meth:`_left_decoder_fence`) gets its closing fence. The
        proposer asks before it looks for a span elsewhere."""
        copied = self._last_copied(gen)
        if copied is None:
            return None
        pidx, pos, copied_to = copied
        text, encoded = self.datastore.passages[pidx].text, gen.candidates.passage(pidx)  # type: ignore[union-attr]
        block = self._open_code_block(pidx, copied_to)
        if block is None:
            return self._fence_closing(gen) if self._left_decoder_fence(gen) else None
        line_end = text.find("\n", copied_to, block[1])
        if text[copied_to : line_end if line_end >= 0 else block[1]].strip():  # mid-line
            stop = _first_token_from(encoded.char_spans, line_end if line_end >= 0 else block[1])
            positions = range(pos + 1, max(stop, pos + 2))
        elif (fence := closing_fence(text, block)) is not None:
            fence_start = fence[0] + 1 if gen.text.rstrip(" \t").endswith("\n") else fence[0]
            first = _first_token_from(encoded.char_spans, fence_start)
            last_token = _first_token_from(encoded.char_spans, fence[1]) - 1
            positions = range(first, last_token + 1)
            gen.plan.end_with(pidx, last_token)
        else:
            return self._end_in_code(gen)
        span = [TokenRecord(int(encoded.token_ids[i]), pidx, i) for i in positions if i < len(encoded.token_ids)]
        if not span:
            return self._end_in_code(gen)
        return Proposal(span[0], span[1:], unchecked=True)

    def _left_decoder_fence(self, gen: Generation) -> bool:
        """Whether the answer's last token was copied from a code block without a fence of its own
        (:func:`~nest_integrations.corpus.markdown_structure.unfenced_code_block`), reached the
        block's end, and the answer holds a fence open: the one the decoder set above it, to be
        closed before anything else is written, or what follows would read as the block's code.
        Only that block's: a fence the answer leaves open otherwise (a fence indented in a list
        item, copied without the list) is the source's, and a copy cut mid-line there goes on."""
        copied = self._last_copied(gen)
        if copied is None:
            return False
        pidx, pos, copied_to = copied
        text, char_spans = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        block = unfenced_code_block(text, int(char_spans[pos, 0]), self._lead(pidx))
        return block is not None and block[1] <= copied_to and unclosed_fence(gen.text) is not None

    def _end_in_code(self, gen: Generation) -> Proposal:
        """A copied line of code ended and its block has no fence to close it with: the answer
        ends there (``answered``), before the LM or a span from elsewhere writes in the block."""
        gen.finish("answered")
        return self._nothing_more()

    def _open_code_block(self, pidx: int, pos: int) -> Optional[tuple[int, int]]:
        """The code block of passage ``pidx`` a copy that got to its character ``pos`` is inside,
        read after the chunks its document has before it (:meth:`_lead`,
        :func:`~nest_integrations.corpus.markdown_structure.open_code_block`): a chunk cut inside
        a literal block opens with lines that need the ``::`` above them to read as code."""
        return open_code_block(self.datastore.passages[pidx].text, pos, self._lead(pidx))  # type: ignore[union-attr]

    def _lead(self, pidx: int) -> str:
        """The text the chunks before passage ``pidx`` hold in its document
        (:func:`~nest_integrations.decoding.chunk_chain.text_read_before`)."""
        return text_read_before(self.datastore.passages, self.datastore.preceding_chunk, pidx)  # type: ignore[union-attr]

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
        before a later answer window (the window's text when that break is the one under a hidden
        line: :func:`~nest_integrations.corpus.markdown_structure.below_hidden_line`), else the
        first token there a copy may start with (an opening planned at a Markdown heading starts
        below it: :func:`first_copyable`)."""
        if not text[slice(*encoded.char_spans[pos])].strip():
            start = int(encoded.char_spans[pos, 0])
            below = below_hidden_line(text, start)
            return pos if below == start else _token_holding(encoded.char_spans, below)
        return first_copyable(text, encoded.char_spans, pos)

    def _copy_end(self, gen: Generation, pidx: int, pos: int, source_repeats: bool = False) -> int:
        """Where a copy from token ``pos`` of passage ``pidx`` must end (exclusive): at most
        ``span_length`` tokens, never past the passage, never into Markdown a reader does not
        see (:func:`~nest_integrations.corpus.markdown_structure.copyable_end`), never across the edge of a code
        block that reads as code only between the decoder's fences (:meth:`_decoder_fence_bound`),
        never into a token this
        answer has already copied (a used entry), never past the end of the planned copy it is in (the
        plan moves on from there), never completing a run of ``repeat_ngram`` tokens the answer
        already holds (:func:`~nest_integrations.policy.repetition.repeat_free_length`). A planned
        window copied whole, and with ``source_repeats`` a copy that goes on where its source does
        (the first line after a break, or a copy running on past a planned answer's windows), are
        the source's text, repeats and all (an example that calls
        ``click.confirm('Do you want to continue?', ...)`` again)."""
        candidates, config = gen.candidates, gen.config
        assert candidates is not None
        tokens = candidates.passage(pidx).token_ids
        end = min(len(tokens), pos + config.span_length)
        if gen.plan.in_planned_copy(pidx, pos):
            end = min(end, gen.plan.window_end[1] + 1)  # type: ignore[index]
        text, char_spans = self.datastore.passages[pidx].text, candidates.passage(pidx).char_spans  # type: ignore[union-attr]
        end = copyable_end(text, char_spans, pos, end)
        end = min(end, self._decoder_fence_bound(gen, pidx, pos, end))
        end = next((i for i in range(pos, end) if candidates.is_used(pidx, i)), end)
        if source_repeats or gen.plan.copies_whole(pidx, pos):
            return end
        return pos + repeat_free_length(gen.ids, [int(t) for t in tokens[pos:end]], config.repeat_ngram)

    def _decoder_fence_bound(self, gen: Generation, pidx: int, pos: int, end: int) -> int:
        """Where a copy from token ``pos`` to ``end`` of passage ``pidx`` must end at a code block
        without a fence of its own: at the block's end when the copy is inside it and the answer
        holds a fence open (the decoder's, :func:`~nest_integrations.corpus.markdown_structure.opening_fence`);
        at the end of the prose above a block indented fewer than four spaces when the copy would
        run on into it (:func:`~nest_integrations.corpus.markdown_structure.shallow_code_entry`);
        ``end`` otherwise. The copy goes on past the fence the decoder sets there
        (:meth:`_fence_going_on`)."""
        text, char_spans, lead = self.datastore.passages[pidx].text, gen.candidates.passage(pidx).char_spans, self._lead(pidx)  # type: ignore[union-attr]
        start = int(char_spans[pos, 0])
        if unclosed_fence(gen.text) is not None:
            stop = block[1] if (block := unfenced_code_block(text, start, lead)) is not None else None
        elif end > pos and shallow_code_block(text, start, lead) is None:
            stop = shallow_code_entry(text, start, int(char_spans[end - 1, 1]), lead)
        else:
            stop = None
        return end if stop is None else max(_first_token_from(char_spans, stop), pos + 1)

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


def _past_markup(text: str, pos: int) -> int:
    """Where a copy that skipped hidden markup and would go on at character ``pos`` opens: past the
    indentation of a directive's body of prose
    (:func:`~nest_integrations.corpus.markdown_structure.past_markup_indent`), or past the line
    break under a hidden line above a block
    (:func:`~nest_integrations.corpus.markdown_structure.below_hidden_line`); else ``pos``."""
    indented = past_markup_indent(text, pos)
    return indented if indented > pos else below_hidden_line(text, pos)


def _set_by_decoder(ids: list[int]) -> Proposal:
    """Tokens the decoder sets, not copied and no word of the model's (a closing fence on a line of
    its own): separators, accepted whole."""
    records = [TokenRecord(i, separator=True) for i in ids]
    return Proposal(records[0], records[1:], unchecked=True)


def _first_token_from(char_spans: np.ndarray, char: int) -> int:
    """Index of the first token of int (L, 2) ``char_spans`` that starts at character ``char`` or
    later (L when none does): where a copy that must end before ``char`` stops, exclusive."""
    return int(np.searchsorted(char_spans[:, 0], char, side="left"))


def _token_holding(char_spans: np.ndarray, char: int) -> int:
    """Index of the token of int (L, 2) ``char_spans`` that holds character ``char``: the first
    that ends after it (L when none does)."""
    return int(np.searchsorted(char_spans[:, 1], char, side="right"))


def paragraph_break_id(tokenizer: Any) -> Optional[int]:
    """The id of ``tokenizer``'s one token for ``"\n\n"``, else for ``"\n"``; None when neither is one token."""
    double = _single_token_id(tokenizer, "\n\n")
    return double if double is not None else line_break_id(tokenizer)


def line_break_id(tokenizer: Any) -> Optional[int]:
    """The id of ``tokenizer``'s one token for ``"\n"``; None when it takes more than one."""
    return _single_token_id(tokenizer, "\n")


def _single_token_id(tokenizer: Any, text: str) -> Optional[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None
