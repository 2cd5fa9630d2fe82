"""How long a key encoding will take, said before it runs, and its progress in tokens.

Precomputing keys runs the LM over every token of a corpus: minutes to hours on
a CPU. :class:`EncodeProgress` counts the tokens to encode before the first
forward, encodes a small first chunk (``probe_tokens``) to measure this
machine's rate, then logs the estimate of the whole run and shows it beside
the progress bar before the bulk of the work starts. The rate of one small
chunk includes the first forward's warm-up, so the first estimate errs long;
the bar's own remaining-time figure follows the rate as it settles.

Used by :meth:`~nest_integrations.store.datastore.TokenDatastore.precompute` (the CLI's
``nest index build``) and by the vector stores that precompute keys on add.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Generic, Protocol, Sequence, Sized, TypeVar

logger = logging.getLogger(__name__)


class EncodedText(Protocol):
    """An encoded text as the progress counts it: one entry of ``token_ids`` per token
    (:class:`~nest_integrations.store.encoder.EncodedPassage` is one)."""

    @property
    def token_ids(self) -> Sized: ...


EncodedT = TypeVar("EncodedT", bound=EncodedText)
EncodedT_co = TypeVar("EncodedT_co", bound=EncodedText, covariant=True)


class TextEncoder(Protocol[EncodedT_co]):
    """What the progress needs of an encoder (:class:`~nest_integrations.store.encoder.PassageEncoder`
    is one): its LM's tokenizer to count tokens up front, the tokens of one forward,
    and ``encode`` itself. Defined here so that this module needs nothing of the datastore,
    which uses it."""

    batch_tokens: int
    """Tokens the encoder runs in one forward."""

    @property
    def lm(self) -> Any:
        """The loaded LM; its ``tokenizer`` counts the texts' tokens."""
        ...

    def encode(self, texts: Sequence[str]) -> Sequence[EncodedT_co]:
        """One encoded text per text, in order."""
        ...


def format_duration(seconds: float) -> str:
    """``"45 s"``, ``"12.5 min"`` or ``"2.3 h"``: the unit a reader of a log line wants."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def chunk_bounds(token_counts: Sequence[int], start: int, chunk_passages: int, probe_tokens: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` passage ranges covering ``[start, len(token_counts))``, the first one a probe.

    The probe holds the fewest passages whose tokens reach ``probe_tokens``
    (at least one passage, at most ``chunk_passages``), so the rate is known
    after seconds; every later range holds ``chunk_passages`` passages.

    Raises:
        ValueError: ``chunk_passages`` below 1.
    """
    if chunk_passages < 1:
        raise ValueError(f"chunk_passages must be at least 1, got {chunk_passages}")
    bounds: list[tuple[int, int]] = []
    lo, end = start, len(token_counts)
    if lo < end:
        hi, tokens = lo, 0
        while hi < end and hi - lo < chunk_passages and (hi == lo or tokens < probe_tokens):
            tokens += token_counts[hi]
            hi += 1
        bounds.append((lo, hi))
        lo = hi
    bounds.extend((a, min(a + chunk_passages, end)) for a in range(lo, end, chunk_passages))
    return bounds


class EncodeProgress(Generic[EncodedT]):
    """A progress bar in tokens and an estimate of the run, for encoding ``texts``.

    Use as a context manager; feed every encoded chunk to :meth:`update`, or let
    :meth:`encode` run the chunks.

    Args:
        encoder: the :class:`~nest_integrations.store.encoder.PassageEncoder` (its
            tokenizer counts the tokens up front, one pass over the texts;
            docs/persistence.md has its rate).
        texts: every text the run will encode, in order.
        show_progress: draw a tqdm bar (the estimate is logged either way).
        desc: the bar's label and the log lines' subject.
        probe_tokens: tokens of the first chunk :meth:`encode` runs; None: the
            encoder's ``batch_tokens`` (one forward). Larger measures the rate
            better and gives the estimate later.
    """

    def __init__(
        self, encoder: TextEncoder[EncodedT], texts: Sequence[str], *, show_progress: bool = True,
        desc: str = "Encoding keys", probe_tokens: int | None = None,
    ):
        self.encoder = encoder
        self.texts = list(texts)
        self.desc = desc
        self.show_progress = show_progress
        self.probe_tokens = encoder.batch_tokens if probe_tokens is None else probe_tokens
        tokenizer = encoder.lm.tokenizer
        ids = tokenizer(self.texts, add_special_tokens=False)["input_ids"] if self.texts else []
        self.token_counts = [len(row) for row in ids]
        self.total_tokens = sum(self.token_counts)
        self.tokens_done = 0
        self.estimate_s: float | None = None
        """Seconds the whole run should take, from the first chunk's rate (None before it)."""
        self._start = 0.0
        self._bar: Any = None

    def __enter__(self) -> "EncodeProgress[EncodedT]":
        from tqdm.auto import tqdm

        logger.info("%s: %d passages, %d tokens to encode", self.desc, len(self.texts), self.total_tokens)
        self._bar = tqdm(
            total=self.total_tokens, desc=self.desc, unit="tok", unit_scale=True, disable=not self.show_progress
        )
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.close()

    @property
    def seconds(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self._start

    @property
    def rate(self) -> float:
        """Tokens per second so far."""
        return self.tokens_done / max(self.seconds, 1e-9)

    def update(self, chunk: Sequence[EncodedT]) -> None:
        """Count an encoded chunk; after the first one, log and show the run's estimate."""
        tokens = sum(len(e.token_ids) for e in chunk)
        self.tokens_done += tokens
        self._bar.update(tokens)
        if self.estimate_s is None and self.tokens_done:
            rate = self.rate
            self.estimate_s = self.total_tokens / rate
            logger.info(
                "%s: %.0f tokens/s on the first %d tokens; the %d tokens should take about %s (%s left)",
                self.desc, rate, self.tokens_done, self.total_tokens, format_duration(self.estimate_s),
                format_duration(max(self.total_tokens - self.tokens_done, 0) / rate),
            )
            self._bar.set_postfix_str(f"estimate {format_duration(self.estimate_s)}")

    def encode(
        self, start: int = 0, chunk_passages: int = 256,
        store: Callable[[EncodedT], EncodedT] | None = None,
    ) -> list[EncodedT]:
        """Encode ``texts[start:]`` in :func:`chunk_bounds` chunks, counting each.

        Args:
            chunk_passages: passages per ``encoder.encode`` call after the probe;
                the float16 keys of one chunk are held at once.
            store: maps each encoded passage to the form kept (e.g. compressed
                keys) as its chunk arrives; None keeps float16 keys.

        Returns:
            One :class:`~nest_integrations.store.encoder.EncodedPassage` per text from ``start``, in order.
        """
        out: list[EncodedT] = []
        for lo, hi in chunk_bounds(self.token_counts, start, chunk_passages, self.probe_tokens):
            chunk = self.encoder.encode(self.texts[lo:hi])
            self.update(chunk)
            out.extend(chunk if store is None else [store(e) for e in chunk])
        return out
