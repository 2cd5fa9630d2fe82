"""One generation's state and its output: :class:`Generation`, and the stream of its text.

* :class:`Generation`: what one prompt's decoding holds between steps (its config, accepted
  tokens and their text, candidate set, copy plan, stats), and the output built from it
  (:meth:`Generation.output`: the text up to a stop string, its spans, attribution and stats).
* :class:`StreamCursor` turns a generation's growing text into :class:`StreamChunk` s.

The proposer, the verifier, the row scheduler and the decoder read and write this state; it
imports none of them. ``passages`` below is the datastore's passage list, which the token
records' passage indices index (empty without a datastore: then nothing is copied).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.store.candidates import CandidateSet
from .copy_plan import CopyPlan
from .output import FinishReason, GenerationStats, NestOutput, Span
from .spans import TokenRecord, build_spans, shift_spans, summarize

__all__ = ["Generation", "StreamChunk", "StreamCursor"]


@dataclass
class Generation:
    """Mutable state of one generation."""

    config: NestConfig
    records: list[TokenRecord] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)
    candidates: Optional[CandidateSet] = None
    finished: bool = False
    plan: CopyPlan = field(default_factory=CopyPlan)
    """Where the answer's planned copies start and end (:mod:`~nest_integrations.decoding.prepare`
    makes it before the first step); empty for a generation without one."""
    starts: dict[int, list[int]] = field(default_factory=dict)
    """Sentence starts (characters) of each candidate passage, computed when first needed."""
    lead_in: str = ""
    """Text the output continues: a plain-text prompt (a chat answer starts afresh)."""
    budget: int = -1
    """Tokens the answer may hold: ``config.max_new_tokens`` (set when -1), or fewer once a copy
    in code stopped at the last line end from which the budget could close its block (the
    closing fence is then the answer's last tokens), or a copy in prose at the last sentence
    end the budget reaches (``length`` either way)."""

    def __post_init__(self) -> None:
        if self.budget < 0:
            self.budget = self.config.max_new_tokens

    def tokens_left(self) -> int:
        """Tokens the budget leaves the answer (0 or fewer: it is spent)."""
        return self.budget - len(self.records)

    def finish(self, reason: FinishReason) -> None:
        """End the generation with ``reason``. White space the decoder set before a copy
        (:attr:`~nest_integrations.decoding.spans.TokenRecord.separator`: a paragraph break between
        two copies, a code line's indentation) that nothing followed (the LM refused the copy
        after it, or the budget ran out) is dropped: it separates or indents nothing. A code
        block's closing fence, also set by the decoder, stays: it closes what was copied."""
        while self.records and self.records[-1].separator:
            last_start = self.boundaries[-2] if len(self.boundaries) > 1 else 0
            if self.text[last_start:].strip():
                break
            self.records.pop()
            self.ids.pop()
            self.boundaries.pop()
            self.text = self.text[: self.boundaries[-1] if self.boundaries else 0]
        self.finished = True
        self.stats.finish_reason = reason

    def end_planned_copy(self) -> None:
        """The planned copy being made is done: the next one opens, or the answer ends (``answered``)."""
        if not self.plan.next_copy():
            self.finish("answered")

    # ------------------------------------------------------------------ output
    def final_text(self) -> str:
        """``text`` up to the first stop string it holds."""
        cut = min((self.text.find(s) for s in self.config.stop if s and s in self.text), default=-1)
        return self.text[:cut] if cut >= 0 else self.text

    def stable_length(self) -> int:
        """Characters that can be streamed: not past a possible stop-string start, nor a
        paragraph break between copies before the copy after it is committed."""
        text = self.final_text()
        if len(text) < len(self.text) or self.finished:
            return len(text)
        held_back = 2 if self.records and self.records[-1].separator else 1  # a break streams with what follows it
        text = text[: self.boundaries[-held_back] if len(self.boundaries) >= held_back else 0]
        hold = 0
        for stop in self.config.stop:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        return len(text) - hold

    def spans(self, passages: Sequence[Passage]) -> tuple[list[Span], list[int]]:
        """The spans tiling the text so far (up to a stop string), and each span's length in tokens."""

        def char_spans_of(pidx: int) -> Any:
            assert self.candidates is not None
            return self.candidates.passage(pidx).char_spans

        # The last token owns whatever its decode left unassigned (a trailing partial character).
        boundaries = self.boundaries[:-1] + [len(self.text)] if self.boundaries else []
        return build_spans(self.final_text(), boundaries, self.records, passages, char_spans_of)

    def output(self, passages: Sequence[Passage]) -> NestOutput:
        """The output contract of this generation: final text, spans, attribution and stats."""
        spans, lengths = self.spans(passages)
        ratio, mean_span, sources = summarize(spans, lengths)
        self.stats.new_tokens = len(self.records)
        return NestOutput(
            text=self.final_text(),
            mode=self.config.mode,
            spans=spans,
            attribution_ratio=ratio,
            mean_copied_span_tokens=mean_span,
            sources=sources,
            stats=self.stats,
        )


@dataclass
class StreamChunk:
    """A piece of a streamed generation: new text, the spans inside it, and on the
    last chunk the complete :class:`NestOutput`."""

    text: str
    spans: list[Span]
    output: Optional[NestOutput] = None


class StreamCursor:
    """What of one generation has been streamed: turns its growing text into
    :class:`StreamChunk` s, each the newly stable text (never past a possible
    stop-string start) with its spans."""

    def __init__(self, passages: Sequence[Passage]):
        self.passages = passages
        """The datastore's passages, which the generation's token records index."""
        self.emitted = 0
        """Characters of the output already streamed."""

    def advance(self, gen: Generation) -> Optional[StreamChunk]:
        """The chunk of text that became stable since the last call, or None."""
        stable = gen.stable_length()
        if stable <= self.emitted:
            return None
        spans = gen.spans(self.passages)[0]
        chunk = StreamChunk(gen.text[self.emitted : stable], shift_spans(spans, self.emitted, stable))
        self.emitted = stable
        return chunk

    def last(self, output: NestOutput) -> StreamChunk:
        """The final chunk: the rest of the text and the complete output."""
        return StreamChunk(output.text[self.emitted :], shift_spans(output.spans, self.emitted, len(output.text)), output)
