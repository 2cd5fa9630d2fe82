"""The verifier of NEST decoding: :class:`SpanVerifier`, relaxed acceptance of a draft, the commit and the stop rules.

The row scheduler feeds a :class:`~nest_integrations.decoding.proposal.Proposal`'s first token
and its draft to the LM in **one** forward, their kNN lookups done as one batched search; the
draft is accepted while ``min(1, p_M(x_i) / (gamma * max p_M)) > 0.5``, as a verifier accepts a
draft in speculative decoding. The p_M at the first rejected position is the next proposal's
distribution, so every forward advances by at least one token (the scheduler crops the row's KV
columns back to it). Accepted tokens join the text (:meth:`SpanVerifier.commit`) and the stop
rules apply:

* EOS, a stop string, the token budget (``max_new_tokens``, or less where a copy in code stopped
  to close its block: :meth:`~nest_integrations.decoding.generation.Generation.tokens_left`);
* copying the last token of the planned copies
  (:class:`~nest_integrations.decoding.copy_plan.CopyPlan`; ``answered``), or an LM token where
  the plan refuses one;
* copying the last token of a passage whose document's next chunk was not retrieved, or of a
  Markdown section (``stop_at_source_end``): what a small LM writes after a fully copied source
  is its own, and mostly invented. A copy reaching a chunk's end goes on into the next chunk
  of its document when that was retrieved.

An answer that ended where its copies do inside a fenced block they left open gets the block's
closing fence (:meth:`SpanVerifier.close`, applied by the scheduler once a row has finished).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from nest_integrations.core.mixture import accepted_prefix_length, relaxed_accept_ratio
from nest_integrations.corpus.markdown_structure import closing_fence_line, section_ends_at
from nest_integrations.store.candidates import CandidateSet
from nest_integrations.store.datastore import TokenDatastore
from .chunk_chain import continue_at
from .generation import Generation
from .mixing import Mixture
from .proposal import Proposal, Verdict, WholeEnds
from .spans import TokenRecord

__all__ = ["SpanVerifier", "whole_prefix"]


def whole_prefix(accepted: int, ends: WholeEnds) -> int:
    """Draft tokens kept of a draft whose first ``accepted`` the relaxed check accepts, not all:
    the longest whole end within them (a sentence end, or a token in code); else the first
    sentence end after them when no code comes first, which finishes the sentence the copy
    began; else ``accepted``.

    Past a planned answer's windows, the check refusing a copy mid-sentence ends the answer, and
    on a fragment ("... has to have read and write permissions" of "... permissions on
    ``/run/borg``::"); kept to a whole prefix, the answer ends there instead. A copy refused
    before its first sentence ends has committed its first token already (it passed the check
    alone), so the answer ends where that sentence of the source does, verbatim, rather than on
    its first words. A copy that reaches code first is left to the rule for copied code."""
    within = [k for k in ends.sentences | ends.code if k <= accepted]
    if within:
        return max(within)
    after = min((k for k in ends.sentences if k > accepted), default=None)
    if after is None or any(k < after for k in ends.code):
        return accepted
    return after


class SpanVerifier:
    """Checks each row's draft against the mixture, commits what is accepted and applies the stop rules.

    Stateless between calls apart from the :class:`Generation` it is given, so one object serves
    every row of a decoder, from any thread.

    Args:
        tokenizer: the LM's tokenizer (decodes the accepted tokens).
        datastore: the token datastore the candidate passages index into; None when the
            decoder has none.
        eos_ids: token ids that end a generation.
    """

    def __init__(self, tokenizer: Any, datastore: Optional[TokenDatastore], eos_ids: set[int]):
        self.tokenizer = tokenizer
        self.datastore = datastore
        self.eos_ids = eos_ids

    def verify(self, gen: Generation, proposal: Proposal, mixture: Mixture) -> Verdict:
        """Verify ``proposal.draft`` by relaxed speculative acceptance and commit its longest
        acceptable prefix (all of it for an unchecked draft).

        Args:
            proposal: what was fed for this row; its first token is already committed.
            mixture: the mixture at the 1 + len(draft) positions fed for this row: position i
                holds p_M after ``first`` and ``draft[:i]``.

        Returns the :class:`Verdict`: the accepted length (also where in ``mixture`` the next
        token's distribution sits) and where a copy goes on without a new span selection.
        """
        config, first, draft = gen.config, proposal.first, proposal.draft
        accepted = 0
        if draft and proposal.unchecked:
            accepted = len(draft)
            self.commit(gen, draft)
        elif draft:
            ratios = relaxed_accept_ratio(mixture.p_m[: len(draft)], torch.tensor([r.token_id for r in draft]), config.effective_gamma)
            checked = accepted = accepted_prefix_length(ratios, config.accept_threshold)
            if checked < len(draft) and proposal.whole_ends is not None:
                accepted = whole_prefix(checked, proposal.whole_ends())
            self.commit(gen, draft[:accepted])
            if accepted != checked and not gen.finished:
                gen.finish("answered")  # the check refused the copy mid-sentence: the answer ends on a whole one of it
        resume_at = None
        if draft and accepted == len(draft) and draft[-1].passage_index is not None:
            resume_at = (draft[-1].passage_index, draft[-1].position + 1)
        elif not draft and first.passage_index is not None:
            resume_at = (first.passage_index, first.position + 1)
        return Verdict(mixture, accepted, resume_at)  # type: ignore[arg-type]

    def commit(self, gen: Generation, records: Sequence[TokenRecord]) -> None:
        """Append accepted tokens; stop at EOS, a stop string, max_new_tokens, the end of the source,
        the last planned copy's end, or an LM token the copy plan refuses."""
        if gen.finished:
            return
        for record in records:
            if record.token_id in self.eos_ids:
                gen.finish("eos")
                return
            if record.passage_index is None and not record.separator and gen.plan.refuses_lm_token(bool(gen.records)):
                gen.finish("answered")  # the LM refused the next window, or would write in a planned answer
                return
            if not record.separator:
                gen.plan.between_windows = False
            self._append(gen, record)
            copied = record.passage_index is not None and gen.candidates is not None
            if copied:
                gen.candidates.mark_used(record.passage_index, record.position, record.position)  # type: ignore[union-attr, arg-type]
            if any(s in gen.text for s in gen.config.stop):
                gen.finish("stop")
            elif copied:
                if gen.plan.ends_at(record.passage_index, record.position):  # type: ignore[arg-type]
                    gen.end_planned_copy()
                # A planned copy ends where it was planned (the line breaks that open a section's
                # title label sit right before its heading); a copy without one (or running on
                # past its window) ends with its source.
                if not gen.finished and gen.plan.window_end is None and gen.config.stop_at_source_end and self._source_exhausted(gen.candidates, record):  # type: ignore[arg-type]
                    gen.finish("source_end")
            # The budget ends only an answer that did not end on its own: a last planned copy
            # whose last token is the budget's last one is complete (``answered``), not cut short.
            if not gen.finished and gen.tokens_left() <= 0:
                gen.finish("length")
            if gen.finished:
                return

    def _append(self, gen: Generation, record: TokenRecord) -> None:
        """Add one token to ``gen``: its record, its id, the text and the token's end in it."""
        gen.records.append(record)
        gen.ids.append(record.token_id)
        text = self.tokenizer.decode(gen.ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        # A token ending inside a multi-byte character decodes to U+FFFD until
        # the next token completes it; it owns no characters until then.
        partial = text.endswith("\ufffd")
        gen.boundaries.append((gen.boundaries[-1] if gen.boundaries else 0) if partial else len(text))
        gen.text = text

    def close(self, gen: Generation) -> None:
        """The last tokens of a ``nest`` / ``ra_nest`` answer that ended where its copies end
        (``answered``, ``source_end``, ``eos``) inside a fenced code block its last copy left open
        (a chunker cut the block): the block's closing fence on a line of its own, set like a
        paragraph break between copies (not copied, no word of the model's), when the budget holds
        it. A reader of the raw text (a LangChain string, a file) sees the code end where the copy
        did; the renderers close such a block too."""
        if gen.config.mode not in ("nest", "ra_nest") or gen.stats.finish_reason not in ("answered", "source_end", "eos"):
            return
        closing = closing_fence_line(gen.text) if gen.records and gen.records[-1].copied else None
        if closing is None:
            return
        ids = self.tokenizer(closing, add_special_tokens=False)["input_ids"]
        if len(ids) <= gen.tokens_left():
            for token in ids:
                self._append(gen, TokenRecord(int(token), separator=True))

    def _source_exhausted(self, candidates: CandidateSet, record: TokenRecord) -> bool:
        """Whether ``record`` copied the last token of its passage and no candidate
        passage continues it (the next chunk of the same document), or the last token
        of a Markdown section (a heading follows: :func:`section_ends_at`, in its passage or
        at the start of the chunk that continues it)."""
        pidx, pos = int(record.passage_index), int(record.position)  # type: ignore[arg-type]
        passages = self.datastore.passages  # type: ignore[union-attr]
        following = continue_at(passages, candidates, pidx, pos + 1)
        if following is None or section_ends_at(passages[pidx].text, int(candidates.passage(pidx).char_spans[pos, 1])):
            return True
        nxt, at = following
        return nxt != pidx and section_ends_at(passages[nxt].text, int(candidates.passage(nxt).char_spans[at, 0]))
