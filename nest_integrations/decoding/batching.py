"""Batched NEST: a row scheduler that advances many generations by shared forward passes.

Each prompt is a :class:`Row`: its own :class:`~nest_integrations.decoding.generation.Generation`
(candidate set, used-entry mask, copy plan, records), its own sampling generator and
its own next-step distribution. Every decision a row takes is its decoder's own,
called per row: :meth:`NestDecoder.prepare_row` (retrieval, gate, candidates,
copy plan; in the caller's thread), then the row's
:class:`~nest_integrations.decoding.speculation.Speculation`: its proposer's ``propose`` (next
token and draft), its verifier's ``commit`` (append, stop rules) and ``verify`` (relaxed
verification), its mixer's ``mixture`` (p_M at the row's positions); the generation builds its
output. Rows of different decoders (other datastores, other configs) share a batch when they
share the LM and its key layer, which the scheduler is made with (:class:`SharedLM`). What the
What the
:class:`RowScheduler` adds is only the sharing of the LM:

* **One KV cache for the batch, packed**: a transformers ``DynamicCache`` of
  batch size 1 whose columns are the rows' tokens side by side, with
  ``owner[c]``, the row that column ``c`` belongs to (-1: dead). A row's live
  columns are exactly its prompt and its accepted tokens.
* **One forward per step over every row's ``[next token] + draft``**, the rows'
  fed tokens concatenated in one sequence with no padding, so a step costs the
  tokens the rows actually verify (a row copying 64 tokens does not make the
  rows writing one token at a time pay for 64). A 4-D additive attention mask
  lets each fed token see its own row's live columns and the tokens its row fed
  before it in this step, nothing else.
* **Explicit position ids**: a row's token sits at position ``prompt + accepted
  tokens`` whatever its column, so rotary embeddings are those of the row
  generated alone.
* **Per-row advance**: after verification each row keeps its next token and its
  own accepted prefix; the columns of its rejected draft tokens die (owner -1),
  so a row that rejects early holds back no other.
* **Prefill inside the step**: a row *joins* whenever there is room
  (``max_batch``), so a queue keeps the batch full. Its whole prompt is fed in
  the step's shared forward beside the other rows' tokens (logits kept at its
  last position only), so joining costs the others no forward of its own: a
  separate prefill forward would come before the row's first token, which a
  short prompt inside a shared forward does not (docs/serving.md, Batching, has
  the cost of one on CPU). The row proposes its
  first token at the next step, as after a prefill alone.
* **Rows leave** as soon as they finish or their consumer stops listening
  (``Row.cancelled``; their columns die), and dead columns
  are dropped (one ``index_select`` over the cache) once they outnumber a
  quarter of the live ones, so masked columns never dominate attention.

The price of packing is attention: each fed token's scores are computed against
all rows' columns (and masked), i.e. attention work grows with the batch's total
length, while the projections and MLP -- most of a small LM's work at these
lengths -- cost exactly the fed tokens.

With greedy decoding each row takes the decisions it takes alone, so outputs,
spans and attribution equal one-by-one generation (up to float rounding of a
batched matmul against an unbatched one, which does not flip a decision on the
tests' models). ``stats.forward_passes`` counts the shared forwards a row took
part in (its prefill included) -- the same count as alone; ``decode_s`` runs
from the row's prefill to its finish, and ``wall_s`` is the row's own time: its
preparation (retrieval, gate) plus ``decode_s``. The time a prepared row waits
for room in the batch, or for the other rows of a batch call to be prepared, is
no row's own and counts in neither (a generation alone waits for nothing, so
its ``wall_s`` is the time from the call to its last token).

A :class:`RowListener` hears of each row's progress (for streaming), its output
or its error. :func:`batched_generate` runs a fixed list of rows in the calling
thread; :class:`~nest_integrations.decoding.batching_service.BatchingService` keeps a scheduler
running for concurrent callers.

Models with sliding-window or chunked attention layers, and attention kernels
that take no 4-D mask (flash attention, flex attention), are generated one by
one (:func:`supports_batching`): a foreign column would count against a window.
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import torch

from nest_integrations.model.attention import PACKED_SDPA
from .generation import Generation
from .output import NestOutput
from .proposal import Proposal, Verdict
from .speculation import Speculation

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.key_reader import KeyReader
    from nest_integrations.model.lm import LoadedLM

logger = logging.getLogger(__name__)

__all__ = ["Row", "RowListener", "RowScheduler", "SharedLM", "batched_generate", "run_rows", "supports_batching"]

_COMPACT_SLACK = 64
"""Dead columns always tolerated; beyond them the cache is compacted once they exceed a quarter of the live ones."""


def supports_batching(model: Any) -> bool:
    """Whether the model's attention is full (no sliding-window layers), so masked
    cache columns are invisible to it and rows can share one cache."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    layer_types = getattr(config, "layer_types", None) or []
    if any("sliding" in str(t) or "chunk" in str(t) for t in layer_types):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if getattr(config, "attention_chunk_size", None):
        return False
    # The shared forward passes a 4-D additive mask, which these attention kernels take as it is.
    return getattr(config, "_attn_implementation", None) in (None, "sdpa", PACKED_SDPA, "eager")


class SharedLM:
    """The LM the rows of one scheduler run on, and what its forward needs: the key reader
    (query vectors at the datastore's key layer) and the keyword of its KV cache
    (:func:`~nest_integrations.model.lm.cache_argument`).

    Holds the LM weakly: the batching services kept per LM
    (:func:`~nest_integrations.decoding.batching_service.shared_service`) are dropped with it,
    and must not keep it alive.
    """

    def __init__(self, lm: "LoadedLM", reader: "KeyReader", cache_arg: str):
        self._lm = weakref.ref(lm)
        self.reader = reader
        self.cache_arg = cache_arg

    @property
    def lm(self) -> "LoadedLM":
        lm = self._lm()
        if lm is None:
            raise RuntimeError("the LM these rows run on was released")
        return lm


@dataclass
class Row:
    """One prompt's place in the batch: a prepared generation and where it stands.

    Built by :meth:`NestDecoder.prepare_row` (retrieval, gate, candidates and the
    prompt's token ids, all in the caller's thread); the scheduler runs the rest,
    applying the row's ``speculation`` at each step.
    """

    speculation: Speculation
    """The mixer, proposer and verifier of the row's decoder."""
    gen: Generation
    prompt_ids: list[int]
    generator: Optional[torch.Generator]
    listener: Optional["RowListener"] = None
    submitted: float = field(default_factory=time.perf_counter)
    """When the row's preparation began."""
    prepared: float = field(default_factory=time.perf_counter)
    """When its preparation ended (the row is built right after it): ``stats.wall_s`` is
    ``prepared - submitted`` plus the time from joining the batch to the row's last token."""
    cancelled: bool = False
    """Set by a consumer that stopped listening (an abandoned stream, a cancelled future or
    task); the row leaves at the next step and its listener hears nothing more."""
    owner: int = -1
    """The row's id in the packed cache, given when it joins."""
    verdict: Optional[Verdict] = None
    """What the row's last forward decided (its mixture, where the next token's distribution
    sits, where a copy goes on); None before its prefill."""
    proposal: Optional[Proposal] = None
    """The next token and draft fed in the current step."""
    t_decode: float = 0.0
    output: Optional[NestOutput] = None
    """The complete result, once the row finished (None for a cancelled or failed row)."""
    error: Optional[BaseException] = None
    """Why the row failed, if it did."""

    @property
    def cached(self) -> int:
        """Tokens the row holds in the cache: its prompt and its accepted tokens."""
        return len(self.prompt_ids) + len(self.gen.records)


class RowListener:
    """What a row tells whoever waits for it. The scheduler calls these from the
    thread that runs it, so they must be quick (hand the result over, nothing more)."""

    def progress(self, row: Row) -> None:
        """Tokens were committed to ``row.gen`` (a streaming consumer reads them now)."""

    def finished(self, row: Row, output: NestOutput) -> None:
        """The row is done; ``output`` is its complete result."""

    def failed(self, row: Row, error: BaseException) -> None:
        """The row cannot go on (its prefill or a shared forward raised ``error``)."""


class _PackedCache:
    """One ``DynamicCache`` of batch size 1 holding every row's columns side by side.

    ``owner[c]`` is the row that column ``c`` belongs to, -1 for a dead column (a
    rejected draft token, a finished row's). A row attends to its own live columns
    only, so the order of the columns between rows does not matter.
    """

    def __init__(self) -> None:
        from transformers import DynamicCache

        self.cache: Any = DynamicCache()
        self.owner = torch.zeros(0, dtype=torch.long)

    @property
    def columns(self) -> int:
        return int(self.owner.shape[0])

    @staticmethod
    def _layers(cache: Any) -> list[Any]:
        layers = getattr(cache, "layers", None)
        if layers is None or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
            raise TypeError(f"batched decoding needs a DynamicCache with per-layer keys/values, got {type(cache).__name__}")
        return list(layers)

    def release(self, owner: int) -> None:
        """Mark a finished row's columns dead."""
        self.owner[self.owner == owner] = -1

    def trim_tail(self) -> None:
        """Drop the dead columns at the end (the last rows' rejected drafts): a crop, no copy."""
        live = (self.owner >= 0).nonzero()
        keep = int(live[-1]) + 1 if len(live) else 0
        if keep == self.columns:
            return
        for layer in self._layers(self.cache):
            layer.keys = layer.keys[:, :, :keep]
            layer.values = layer.values[:, :, :keep]
        self.owner = self.owner[:keep]

    def compact_if_sparse(self) -> None:
        """Drop dead columns once they outnumber a quarter of the live ones (and ``_COMPACT_SLACK``)."""
        live = self.owner >= 0
        alive = int(live.sum())
        if self.columns - alive <= max(_COMPACT_SLACK, alive // 4):
            return
        index = live.nonzero().squeeze(1)
        for layer in self._layers(self.cache):
            layer.keys = layer.keys.index_select(2, index.to(layer.keys.device))
            layer.values = layer.values.index_select(2, index.to(layer.values.device))
        self.owner = self.owner[index]


class RowScheduler:
    """Rows advancing together: each :meth:`step` takes every running row's next
    token and draft and the prompts of waiting rows that join (up to ``max_batch``
    rows in the batch), runs one shared forward, lets each running row verify its
    own draft and each joining row read its first distribution.

    One thread calls :meth:`step`; :meth:`add` may be called from any thread at
    any time (a row added during a step joins at the next one).

    Args:
        shared: the LM every row runs on (its rows' decoders share it and its key layer).
        max_batch: rows sharing a forward at most (>= 1); more wait and join as
            rows finish. Memory grows with it: every row holds its own KV columns.
    """

    def __init__(self, shared: SharedLM, *, max_batch: int = 16):
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.shared = shared
        self.max_batch = int(max_batch)
        self.waiting: deque[Row] = deque()  # appended by any thread, popped by the stepping one
        self.active: list[Row] = []
        self.joining: list[Row] = []
        """Rows taken from ``waiting`` whose prompts the current step prefills."""
        self.batch = _PackedCache()
        self._owners = itertools.count()

    def __len__(self) -> int:
        """Rows waiting, joining or running."""
        return len(self.waiting) + len(self.active) + len(self.joining)

    @property
    def busy(self) -> bool:
        """Whether any row waits or runs."""
        return len(self) > 0

    def add(self, row: Row) -> None:
        """Queue a prepared row; it joins as soon as a step has room."""
        self.waiting.append(row)

    def step(self) -> None:
        """Advance every row by one shared forward: running rows verify their next
        token and draft, joining rows (taken from ``waiting`` while there is room)
        prefill their prompts."""
        self._drop_cancelled()
        self.joining = self._admit()
        self.active = [row for row in self.active if self._propose(row)]
        rows = self.active + self.joining
        if not rows:
            self.batch = _PackedCache()  # only dead columns are left
            return
        feeds = [
            _Feed([row.proposal.first.token_id] + [r.token_id for r in row.proposal.draft], row.cached - 1, keep_all=True)  # type: ignore[union-attr]
            for row in self.active
        ] + [_Feed(row.prompt_ids, 0, keep_all=False) for row in self.joining]
        column = self.batch.columns
        try:
            logits, keys = _shared_forward(self.shared, self.batch, rows, feeds)
        except Exception as error:  # the batch's cache is unusable now: every row in it fails
            self.fail_all(error)
            return
        staying, offset = [], 0
        for row, feed in zip(rows, feeds):
            start, kept = column, (logits[offset : offset + feed.kept], keys[offset : offset + feed.kept])
            column, offset = column + len(feed.tokens), offset + feed.kept
            try:
                stays = self._verify(row, feed, start, *kept)
            except Exception as error:  # this row's decisions failed: the other rows go on
                self._fail(row, error)
                stays = False
            if stays and self._stays(row):
                staying.append(row)
        self.active, self.joining = staying, []
        if not staying:
            self.batch = _PackedCache()
            return
        self.batch.trim_tail()
        self.batch.compact_if_sparse()

    def fail_all(self, error: BaseException) -> None:
        """Fail every waiting and running row with ``error`` and start afresh (rows
        added meanwhile by other threads stay queued)."""
        failing, self.active, self.joining, self.batch = self.active + self.joining, [], [], _PackedCache()
        while self.waiting:
            failing.append(self.waiting.popleft())
        for row in failing:
            self._fail(row, error)

    # ------------------------------------------------------------------ phases of a step
    def _drop_cancelled(self) -> None:
        self.active = [row for row in self.active if self._stays(row)]

    def _stays(self, row: Row) -> bool:
        """False for a row whose consumer stopped listening (or that failed); its columns die."""
        if row.cancelled and row.owner >= 0:
            self.batch.release(row.owner)
        return not row.cancelled

    def _admit(self) -> list[Row]:
        """Take waiting rows while the batch has room; returns those that join (their
        prompts are fed in this step's forward)."""
        joining: list[Row] = []
        while self.waiting and len(self.active) + len(joining) < self.max_batch:
            row = self.waiting.popleft()
            if row.cancelled:
                continue
            if row.gen.config.max_new_tokens == 0:
                row.gen.finish("length")
            if row.gen.finished:  # nothing to decode: no tokens asked for, or an abstention made in preparation
                self._finish(row)
                continue
            row.t_decode = time.perf_counter()
            row.owner = next(self._owners)
            joining.append(row)
        return joining

    def _propose(self, row: Row) -> bool:
        """The row's next token and draft (its own decisions); False when it finished or failed."""
        assert row.verdict is not None
        try:
            proposal = row.speculation.proposer.propose(row.gen, row.verdict, row.generator)
            row.speculation.verifier.commit(row.gen, [proposal.first])
        except Exception as error:
            self._fail(row, error)
            return False
        self._notify(row)
        if row.gen.finished:
            self._finish(row)
            return False
        row.proposal = proposal.cut(row.gen.tokens_left())
        return self._stays(row)

    def _verify(self, row: Row, feed: "_Feed", start: int, logits: torch.Tensor, keys: torch.Tensor) -> bool:
        """The row's part of a shared forward: p_M at its fed positions, then either its
        first distribution (a prefill) or the verification of its draft. ``start`` is the
        row's first new cache column. False when the row finished."""
        row.gen.stats.forward_passes += 1
        mixture = row.speculation.mixer.mixture(logits, keys, row.gen)
        if not feed.keep_all:  # a prefill: the row proposes its first token at the next step
            row.verdict = Verdict(mixture)
            return True
        assert row.proposal is not None
        row.verdict = row.speculation.verifier.verify(row.gen, row.proposal, mixture)
        # The row keeps its token and its accepted draft; its other new columns die.
        self.batch.owner[start + 1 + row.verdict.accepted : start + len(feed.tokens)] = -1
        if row.verdict.accepted:
            self._notify(row)
        if row.gen.finished:
            self._finish(row)
            return False
        return True

    def _notify(self, row: Row) -> None:
        if row.listener is not None and not row.cancelled:
            try:
                row.listener.progress(row)
            except Exception as error:
                self._fail(row, error)

    def _finish(self, row: Row) -> None:
        now = time.perf_counter()
        row.gen.stats.decode_s = now - row.t_decode if row.t_decode else 0.0
        row.gen.stats.wall_s = (row.prepared - row.submitted) + row.gen.stats.decode_s
        if row.owner >= 0:
            self.batch.release(row.owner)
        if row.cancelled:
            return
        try:
            row.speculation.verifier.close(row.gen)
            row.output = row.gen.output(row.speculation.passages)
            if row.listener is not None:
                row.listener.finished(row, row.output)
        except Exception as error:  # building or handing over this row's output failed: its caller hears why
            row.output = None
            self._fail(row, error)

    def _fail(self, row: Row, error: BaseException) -> None:
        """``row`` cannot go on: it leaves the batch (its columns die) and its listener
        hears ``error``. An exception the listener raises is logged, never propagated:
        one row's caller must not stop the others."""
        row.cancelled, row.error = True, error
        if row.owner >= 0:
            self.batch.release(row.owner)
        if row.listener is None:
            return
        listener, row.listener = row.listener, None  # told once
        try:
            listener.failed(row, error)
        except Exception:
            logger.exception("a row's listener raised while told of the row's error")


def run_rows(rows: Sequence[Row], shared: SharedLM, *, max_batch: int) -> Iterator[None]:
    """Run prepared ``rows`` on ``shared`` to the end in this thread, at most ``max_batch`` sharing each
    forward, yielding after every step so the caller can read each row's progress
    (``row.gen``). Each row ends with its ``output`` or its ``error``. Closing the
    iterator early abandons the rows. One prompt decoded alone is this with one row:
    there is one step loop, whatever the batch."""
    scheduler = RowScheduler(shared, max_batch=max_batch)
    for row in rows:
        scheduler.add(row)
    while scheduler.busy:
        scheduler.step()
        yield


def batched_generate(rows: Sequence[Row], shared: SharedLM, *, max_batch: int) -> list[NestOutput]:
    """Run prepared ``rows`` on ``shared`` to the end in this thread, at most ``max_batch`` sharing
    each forward; outputs in the rows' order. Raises the first row's error, if any."""
    for _ in run_rows(rows, shared, max_batch=max_batch):
        pass
    for row in rows:
        if row.error is not None:
            raise row.error
    return [row.output for row in rows]  # type: ignore[misc]


@dataclass(frozen=True)
class _Feed:
    """A row's tokens in one shared forward.

    Attributes:
        tokens: the fed token ids (a running row's next token and draft, or a joining row's prompt).
        position: the position id of the first of them (the row's own, as alone).
        keep_all: logits at every fed token (verification) or at the last only (a prefill).
    """

    tokens: list[int]
    position: int
    keep_all: bool

    @property
    def kept(self) -> int:
        """Positions whose logits and queries the forward returns."""
        return len(self.tokens) if self.keep_all else 1


def _shared_forward(shared: SharedLM, batch: _PackedCache, rows: Sequence[Row], feeds: Sequence[_Feed]) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of the ``shared`` LM over every row's fed tokens, packed one row after another in one sequence.

    A fed token attends to its row's live cache columns and to the tokens its row
    fed before it in this step (a 4-D mask); its position id is the row's own. A
    row alone in a cache of only its own columns needs no mask: it runs the model's
    own causal path, exactly the forward of a generation alone.
    Returns logits (K, V) float32 and query vectors (K, d) at the kept positions
    (:attr:`_Feed.kept` per row, rows in order). Appends the Q fed tokens as new
    columns of ``batch``, owned by their rows.
    """
    lm, reader = shared.lm, shared.reader
    tokens = [t for feed in feeds for t in feed.tokens]
    owners = torch.tensor([row.owner for row, feed in zip(rows, feeds) for _ in feed.tokens], dtype=torch.long)
    positions = torch.tensor([feed.position + j for feed in feeds for j in range(len(feed.tokens))], dtype=torch.long)
    ends = torch.tensor([len(feed.tokens) for feed in feeds]).cumsum(0).tolist()
    kept = torch.tensor([i for feed, end in zip(feeds, ends) for i in range(end - feed.kept, end)], dtype=torch.long)
    q, past = len(tokens), batch.columns
    columns = torch.cat([batch.owner, owners])
    mask = None  # every column is the one row's own: the model's causal mask is the row's mask
    if not bool((columns == columns[0]).all()):
        allowed = (columns[None, :] == owners[:, None]) & (torch.arange(past + q)[None, :] <= past + torch.arange(q)[:, None])
        dtype = lm.model.dtype if lm.model.dtype.is_floating_point else torch.float32
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[None, None].to(lm.device)
    with torch.inference_mode(), lm.forward_lock, reader.capture() as captured:
        outputs = lm.model(
            input_ids=torch.tensor([tokens], dtype=torch.long, device=lm.device),
            attention_mask=mask,
            position_ids=positions[None].to(lm.device),
            use_cache=True,
            **{shared.cache_arg: batch.cache},
            logits_to_keep=kept.to(lm.device) if len(kept) < q else q,
            **reader.forward_kwargs(),
        )
        keys = reader.keys_from(captured, outputs)
    batch.owner = columns
    return outputs.logits[0, -len(kept) :].float().cpu(), keys[0, kept.to(keys.device)].float().cpu()
