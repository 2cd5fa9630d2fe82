"""Spans from per-token records: which characters of a generation came from which passage.

:func:`build_spans` turns the decoder's :class:`TokenRecord` s into the
:class:`~nest_integrations.decoding.output.Span` s that tile an output's text
(a run is called copied only when it is verbatim its source slice);
:func:`summarize` gives an output's attribution figures; :func:`merge_spans`
joins the pieces of a stream and :func:`shift_spans` cuts spans to a range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from nest_integrations.corpus.passages import Passage

from .locations import locate
from .output import SourceRef, Span, SpanSource


@dataclass(frozen=True)
class TokenRecord:
    """One generated token and, when copied, the passage position it came from.

    ``separator``: a paragraph break the decoder sets between two planned copies that would
    otherwise run into each other ("...years before Leibniz.Sir Isaac Newton"), the fence that
    closes a code block a copy left open before a copy from elsewhere, or the indentation of a
    code line a copy opens a line of the answer at: the LM's tokens, not
    copied, and no word of the model's own (a copy plan that ends the answer at the LM's next
    token lets them through)."""

    token_id: int
    passage_index: Optional[int] = None
    position: Optional[int] = None
    separator: bool = False

    @property
    def copied(self) -> bool:
        return self.passage_index is not None


def token_runs(records: Sequence[TokenRecord]) -> list[tuple[int, int]]:
    """Group token indices into runs ``[lo, hi)``: consecutive tokens copied from one
    passage at consecutive positions form a run; consecutive LM tokens form a run."""
    runs: list[tuple[int, int]] = []
    lo = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or not _continues(records[i - 1], records[i]):
            runs.append((lo, i))
            lo = i
    return runs if records else []


def _continues(prev: TokenRecord, cur: TokenRecord) -> bool:
    if prev.copied != cur.copied:
        return False
    if not cur.copied:
        return True
    return cur.passage_index == prev.passage_index and cur.position == (prev.position or 0) + 1


def build_spans(
    text: str,
    boundaries: Sequence[int],
    records: Sequence[TokenRecord],
    passages: Sequence[Passage],
    char_spans_of: Any,
) -> tuple[list[Span], list[int]]:
    """Spans tiling ``text`` from per-token records.

    Args:
        text: the decoded output (possibly cut at a stop string).
        boundaries: character offset in ``text`` where each token ends
            (``len(boundaries) == len(records)``; clipped to ``len(text)``).
        char_spans_of: ``passage_index -> int32 (L, 2)`` tiling char spans.

    Returns:
        The spans and, per span, its length in tokens. A run whose decoded text
        differs from its claimed source slice (a lossy tokenizer, or a cut at a
        stop string) is reported as LM text: a span is only called copied when
        it is verbatim.
    """
    spans: list[Span] = []
    lengths: list[int] = []
    for lo, hi in token_runs(records):
        start = min(boundaries[lo - 1], len(text)) if lo else 0
        end = min(boundaries[hi - 1], len(text))
        if end <= start:
            continue
        piece = text[start:end]
        first = records[lo]
        source = None
        if first.copied:
            passage = passages[first.passage_index]
            cs = char_spans_of(first.passage_index)
            c0, c1 = int(cs[first.position, 0]), int(cs[records[hi - 1].position, 1])
            if passage.text[c0:c1] == piece:
                source = SpanSource(
                    id=passage.id, title=passage.title, metadata=dict(passage.metadata), chunk_char_start=c0, chunk_char_end=c1,
                    location=locate(passage, c0, c1),
                )
        if spans and source is None and not spans[-1].copied:  # merge with the previous LM span
            prev = spans[-1]
            spans[-1] = Span(text=prev.text + piece, start=prev.start, end=end, copied=False)
            lengths[-1] += hi - lo
            continue
        spans.append(Span(text=piece, start=start, end=end, copied=source is not None, source=source))
        lengths.append(hi - lo)
    return spans, lengths


def summarize(spans: Sequence[Span], lengths: Sequence[int]) -> tuple[float, float, list[SourceRef]]:
    """(attribution ratio in tokens, mean copied span in tokens, distinct sources in order of use)."""
    total = sum(lengths)
    copied = [n for s, n in zip(spans, lengths) if s.copied]
    ratio = sum(copied) / total if total else 0.0
    mean_span = sum(copied) / len(copied) if copied else 0.0
    sources: dict[str, SourceRef] = {}
    for span in spans:
        if span.source is not None and span.source.id not in sources:
            sources[span.source.id] = SourceRef(id=span.source.id, title=span.source.title, metadata=span.source.metadata)
    return ratio, mean_span, list(sources.values())


def merge_spans(pieces: Iterable[Span]) -> list[Span]:
    """Join streamed span pieces back into whole spans.

    Adjacent LM pieces merge; adjacent copied pieces merge when they come from
    the same passage and continue each other in both the output and the source.
    Merging the chunks of a stream gives the spans of the non-streamed output.
    """
    merged: list[Span] = []
    for piece in pieces:
        if merged and _joins(merged[-1], piece):
            prev = merged[-1]
            source = None
            if prev.source is not None and piece.source is not None:
                source = prev.source.model_copy(
                    update={"chunk_char_end": piece.source.chunk_char_end, "location": prev.source.location.joined(piece.source.location)}
                )
            merged[-1] = Span(text=prev.text + piece.text, start=prev.start, end=piece.end, copied=prev.copied, source=source)
        else:
            merged.append(piece)
    return merged


def _joins(a: Span, b: Span) -> bool:
    if a.end != b.start or a.copied != b.copied:
        return False
    if not a.copied:
        return True
    assert a.source is not None and b.source is not None
    return a.source.id == b.source.id and a.source.chunk_char_end == b.source.chunk_char_start


def shift_spans(spans: Iterable[Span], lo: int, hi: int) -> list[Span]:
    """The parts of ``spans`` inside ``[lo, hi)`` (character offsets), cut where needed."""
    out = []
    for span in spans:
        a, b = max(span.start, lo), min(span.end, hi)
        if a >= b:
            continue
        source = None
        if span.source is not None:
            lo, hi = a - span.start, b - span.start
            source = span.source.model_copy(
                update={
                    "chunk_char_start": span.source.chunk_char_start + lo,
                    "chunk_char_end": span.source.chunk_char_start + hi,
                    "location": span.source.location.cut(span.text, lo, hi),
                }
            )
        out.append(Span(text=span.text[a - span.start : b - span.start], start=a, end=b, copied=span.copied, source=source))
    return out
