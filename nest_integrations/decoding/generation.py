"""One generation's state, and the per-step interface the row scheduler drives.

* :class:`Generation`: what one prompt's decoding holds between steps (its
  config, accepted tokens and their text, candidate set, opening, stats).
* :class:`Step`: the mixture quantities at the T positions one forward fed a row.
* :class:`RowDecoder`: what the row scheduler (:mod:`~nest_integrations.decoding.batching`)
  and the batching service (:mod:`~nest_integrations.decoding.batching_service`) need of the
  decoder a row belongs to -- the LM it runs on and the per-step rules
  ``propose`` (next token and draft), ``commit`` (append, stop rules),
  ``mixture`` (p_M at the fed positions), ``verify`` (relaxed acceptance of the
  draft) and ``build_output``. :class:`~nest_integrations.decoding.step.StepRules`
  implements it (a :class:`~nest_integrations.decoding.decoder.NestDecoder`'s ``rules``).
* :class:`StreamCursor` turns a generation's growing text into :class:`StreamChunk` s.

These types sit below the decoder, its step rules, the scheduler and the service:
the decoder drives the scheduler and the service with its rules, and neither of
those imports the decoder or the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Protocol, Sequence

import torch

from nest_integrations.core.config import NestConfig
from nest_integrations.store.candidates import CandidateSet
from .output import FinishReason, GenerationStats, NestOutput, Span
from .spans import TokenRecord, shift_spans

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.key_reader import KeyReader
    from nest_integrations.model.lm import LoadedLM

__all__ = ["Generation", "RowDecoder", "Step", "StreamChunk", "StreamCursor"]


@dataclass
class Step:
    """Mixture quantities at T positions: p_M (T, V), lambda (T,), neighbours."""

    p_m: torch.Tensor
    lam: torch.Tensor
    values: torch.Tensor  # (T, r) long, -1 where there is no neighbour
    entries: torch.Tensor  # (T, r) long
    ratio: torch.Tensor  # (T,) RRC distance ratio, 1 where there is no neighbour


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
    opening: Optional[tuple[int, int]] = None
    """(passage index, token position) proposed next, once: an answer window's start, or a name's passage start."""
    window_end: Optional[tuple[int, int]] = None
    """(passage index, last token position) of the answer window; copying it ends the answer,
    or moves on to the next of ``next_windows``."""
    copying_title: bool = False
    """The planned copy that ``opening`` / ``window_end`` describe is a section's title, the label
    of the window after it: its tokens are copied without the LM's check (``unchecked_draft``)."""
    unchecked_draft: bool = False
    """The draft proposed last is a section title's rest: :meth:`verify` accepts it whole."""
    after_title: bool = False
    """A section's title was just copied and its window opens now: a line break that opens the
    window sets the title on a line of its own and is copied without the LM's check (an LM with
    the passages in its prompt refuses it and writes on in its own words)."""
    next_windows: list[tuple[tuple[int, int], Optional[tuple[int, int]], bool]] = field(default_factory=list)
    """``(opening, window_end, title)`` of the copies still to make, in order
    (:data:`~nest_integrations.decoding.prepare.PlannedOpening`)."""
    planned: bool = False
    """The answer copies planned windows, whole (``config.check_answer_windows`` off): the model
    writes nothing in it, and a token of its own, once something is copied, ends the answer
    (``answered``). Past the plan (a last window that runs on to its passage's end, a copy that
    cannot go on), what a small LM writes is its own, and mostly invented."""
    between_windows: bool = False
    """An LM token now ends the answer (``answered``) instead of the LM writing on: an answer
    window that closes an answer was just copied and the LM refuses the next one's opening, or
    a copied line of code ended and its block has no fence to close it with."""
    starts: dict[int, list[int]] = field(default_factory=dict)
    """Sentence starts (characters) of each candidate passage, computed when first needed."""
    lead_in: str = ""
    """Text the output continues: a plain-text prompt (a chat answer starts afresh)."""

    def finish(self, reason: FinishReason) -> None:
        self.finished = True
        self.stats.finish_reason = reason


class RowDecoder(Protocol):
    """The per-step rules of a row, as the row scheduler and the batching service use them.

    Rows of different decoders share a batch when they share ``lm`` and the
    ``reader``'s key layer. Each method is one rule of a step, applied to one row.
    """

    lm: "LoadedLM"
    """The LM whose forward passes the row takes part in."""
    reader: "KeyReader"
    """Reads the query vectors at the datastore's key layer during a forward."""
    cache_arg: str
    """The keyword under which the model's forward takes its KV cache."""

    def propose(
        self, gen: Generation, step: Step, row: int, continuation: Optional[tuple[int, int]],
        generator: Optional[torch.Generator],
    ) -> tuple[TokenRecord, list[TokenRecord]]:
        """The next token (from p_M at position ``row`` of ``step``, or a copied span's
        first token) and the draft that follows it."""
        ...

    def commit(self, gen: Generation, records: Sequence[TokenRecord]) -> None:
        """Append accepted tokens and apply the stop rules."""
        ...

    def mixture(self, logits: torch.Tensor, queries: torch.Tensor, gen: Generation) -> Step:
        """p_M, lambda and neighbours at T positions from logits (T, V) and queries (T, d)."""
        ...

    def verify(
        self, gen: Generation, step: Step, first: TokenRecord, draft: Sequence[TokenRecord]
    ) -> tuple[int, Optional[tuple[int, int]]]:
        """Commit the longest acceptable prefix of ``draft``; its length and where a copy goes on."""
        ...

    def build_output(self, gen: Generation) -> NestOutput:
        """The finished generation's :class:`NestOutput`."""
        ...

    def stable_length(self, gen: Generation) -> int:
        """Characters of ``gen.text`` that can be streamed."""
        ...

    def spans(self, gen: Generation) -> tuple[list[Span], list[int]]:
        """The spans of the text so far and each one's length in tokens."""
        ...


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

    def __init__(self, decoder: RowDecoder):
        self.decoder = decoder
        self.emitted = 0
        """Characters of the output already streamed."""

    def advance(self, gen: Generation) -> Optional[StreamChunk]:
        """The chunk of text that became stable since the last call, or None."""
        stable = self.decoder.stable_length(gen)
        if stable <= self.emitted:
            return None
        spans = self.decoder.spans(gen)[0]
        chunk = StreamChunk(gen.text[self.emitted : stable], shift_spans(spans, self.emitted, stable))
        self.emitted = stable
        return chunk

    def last(self, output: NestOutput) -> StreamChunk:
        """The final chunk: the rest of the text and the complete output."""
        return StreamChunk(output.text[self.emitted :], shift_spans(output.spans, self.emitted, len(output.text)), output)
