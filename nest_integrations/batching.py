"""Batched NEST: a row scheduler that advances many generations by shared forward passes.

Each prompt is a *row*: its own :class:`~nest_integrations.decoding._Generation`
(candidate set, used-entry mask, opening, records), its own sampling generator and
its own next-step distribution. Every decision a row takes is the decoder's own,
called per row: :meth:`NestDecoder._prepare` (retrieval, gate, candidates, opening),
:meth:`~NestDecoder._decide` (next token and draft), :meth:`~NestDecoder._commit`
(append, stop rules), :meth:`~NestDecoder._mix` (p_M at the row's positions) and
:meth:`~NestDecoder._output`. What the scheduler adds is only the sharing of the LM:

* **One KV cache for the batch**, a transformers ``DynamicCache`` whose tensors
  are (rows, heads, columns, head_dim), with a boolean ``valid`` (rows, columns)
  matrix beside it. A row's valid columns are exactly its prompt and its
  accepted tokens, in order; every other column (left padding, a step's right
  padding, rejected draft tokens) is masked out of attention by the 2-D
  attention mask. The cache is append-only within a step: a step feeds each row
  ``[next token] + draft`` right-padded to the longest, all rows' columns grow by
  that length, and after verification the columns past each row's accepted
  length are marked invalid -- so a row that rejects early holds back no other.
* **Explicit position ids**: a row's new token sits at position ``prompt +
  accepted tokens`` whatever its column, so rotary embeddings are those of the
  row generated alone.
* **Prefill per row** into a cache of its own (exactly the one-by-one prefill),
  then the row *joins* the batch: both caches are left-padded with zero columns
  (invalid) to a common length and concatenated on the row axis. Rows join
  whenever there is room (``max_batch``), so a queue keeps the batch full.
* **Rows leave** the batch as soon as they finish (row selection on the cache),
  and the cache is **compacted** -- each row's valid columns gathered and
  right-aligned -- once invalid columns exceed what the longest row holds by
  more than half (or 64 columns), so masked slots never dominate attention.

With greedy decoding each row takes the decisions it takes alone, so outputs,
spans and attribution equal one-by-one generation (up to float rounding of a
batched matmul against an unbatched one, which does not flip a decision on the
tests' models). ``stats.forward_passes`` counts the shared forwards a row took
part in (its prefill included) -- the same count as alone; ``decode_s`` runs
from the row's prefill to its finish, ``wall_s`` from the batch's start to it.

Models with sliding-window attention layers are generated one by one: a masked
column would still count against the window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from .attribution import NestOutput, TokenRecord
from .config import MODES, NestConfig
from .mixture import accepted_prefix_length, relaxed_accept_ratio

if TYPE_CHECKING:  # pragma: no cover
    from .decoding import NestDecoder, PromptLike, ScoredPassages, _Generation, _Step

__all__ = ["batched_generate", "supports_batching"]

_COMPACT_SLACK = 64
"""Invalid columns tolerated beyond half the longest row before the cache is compacted."""


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
    return not getattr(config, "attention_chunk_size", None)


@dataclass
class _Row:
    """One prompt's place in the batch."""

    index: int
    gen: "_Generation"
    prompt_ids: list[int]
    generator: Optional[torch.Generator]
    step: Optional["_Step"] = None
    at: int = 0
    """Which position of ``step`` holds the next token's distribution."""
    continuation: Optional[tuple[int, int]] = None
    first: Optional[TokenRecord] = None
    draft: list[TokenRecord] = field(default_factory=list)
    t_decode: float = 0.0

    @property
    def cached(self) -> int:
        """Tokens the row holds in the cache: its prompt and its accepted tokens."""
        return len(self.prompt_ids) + len(self.gen.records)


class _BatchCache:
    """A ``DynamicCache`` shared by the rows, and which of its columns each row may attend to."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.valid = torch.zeros((0, 0), dtype=torch.bool)

    @property
    def rows(self) -> int:
        return int(self.valid.shape[0])

    @property
    def columns(self) -> int:
        return int(self.valid.shape[1])

    def _layers(self, cache: Any) -> list[Any]:
        layers = getattr(cache, "layers", None)
        if layers is None or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
            raise TypeError(f"batched decoding needs a DynamicCache with per-layer keys/values, got {type(cache).__name__}")
        return list(layers)

    def join(self, cache: Any, length: int) -> None:
        """Append a row whose own cache holds ``length`` valid columns."""
        valid = torch.ones((1, length), dtype=torch.bool)
        if self.cache is None:
            self._layers(cache)
            self.cache, self.valid = cache, valid
            return
        width = max(self.columns, length)
        for mine, theirs in zip(self._layers(self.cache), self._layers(cache)):
            mine.keys = torch.cat([_left_pad(mine.keys, width), _left_pad(theirs.keys, width)], dim=0)
            mine.values = torch.cat([_left_pad(mine.values, width), _left_pad(theirs.values, width)], dim=0)
        pad = lambda v: torch.cat([torch.zeros((v.shape[0], width - v.shape[1]), dtype=torch.bool), v], dim=1)  # noqa: E731
        self.valid = torch.cat([pad(self.valid), pad(valid)], dim=0)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Drop every row not in ``rows`` (indices into the current rows, in order)."""
        if len(rows) == self.rows:
            return
        if not rows:
            self.cache, self.valid = None, torch.zeros((0, 0), dtype=torch.bool)
            return
        index = torch.tensor(list(rows), dtype=torch.long)
        for layer in self._layers(self.cache):
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
            layer.values = layer.values.index_select(0, index.to(layer.values.device))
        self.valid = self.valid.index_select(0, index)

    def compact_if_sparse(self) -> None:
        """Gather each row's valid columns, right-aligned, when invalid ones are too many."""
        if self.cache is None:
            return
        counts = self.valid.sum(1)
        width = int(counts.max())
        if self.columns - width <= max(_COMPACT_SLACK, width // 2):
            return
        # Valid columns sort after invalid ones, each group in column order (a stable sort).
        order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, -width:]
        self.valid = torch.gather(self.valid, 1, order)
        for layer in self._layers(self.cache):
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                index = order.to(tensor.device)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                setattr(layer, name, torch.gather(tensor, 2, index))


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero columns before ``tensor``'s (dimension 2) up to ``width``; zeros, never NaN, in masked slots."""
    missing = width - tensor.shape[2]
    if missing <= 0:
        return tensor
    shape = (tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([tensor.new_zeros(shape), tensor], dim=2)


def batched_generate(
    decoder: "NestDecoder",
    prompts: Sequence["PromptLike"],
    queries: Sequence[Optional[str]],
    passages: Optional[Sequence[Optional["ScoredPassages"]]] = None,
    *,
    max_batch: Optional[int] = None,
    **overrides: Any,
) -> list[NestOutput]:
    """Generate for every prompt, at most ``max_batch`` rows sharing each forward.

    Prompts are assumed checked (:func:`~nest_integrations.decoding.check_prompt`).
    Outputs are in prompt order. ``max_batch`` None: all prompts at once.
    """
    from .decoding import _Generation

    config: NestConfig = decoder.config.updated(**overrides) if overrides else decoder.config
    if config.mode not in MODES:  # validated by pydantic; kept for clarity of the error
        raise ValueError(f"unknown mode {config.mode!r}; choose from {MODES}")
    passages = list(passages) if passages is not None else [None] * len(prompts)
    limit = max(int(max_batch), 1) if max_batch else max(len(prompts), 1)
    started = time.perf_counter()
    outputs: list[Optional[NestOutput]] = [None] * len(prompts)
    waiting = list(range(len(prompts)))
    batch = _BatchCache()
    active: list[_Row] = []

    def finish(row: _Row) -> None:
        row.gen.stats.decode_s = time.perf_counter() - row.t_decode if row.t_decode else 0.0
        row.gen.stats.wall_s = time.perf_counter() - started
        outputs[row.index] = decoder._output(row.gen)

    while waiting or active:
        while waiting and len(active) < limit:
            i = waiting.pop(0)
            gen = _Generation(config=config)
            context = decoder._prepare(gen, prompts[i], queries[i], passages[i])
            prompt_ids = decoder._prompt_ids(decoder.format_prompt(prompts[i], config, context), config, gen.stats)
            generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
            row = _Row(i, gen, prompt_ids, generator)
            if config.max_new_tokens == 0:
                gen.finish("length")
                finish(row)
                continue
            row.t_decode = time.perf_counter()
            from transformers import DynamicCache

            cache = DynamicCache()
            logits, keys = decoder._forward(prompt_ids, cache, gen.stats, keep=1)
            row.step = decoder._mix(logits, keys, gen)
            batch.join(cache, len(prompt_ids))
            active.append(row)
        if not active:
            continue

        # Each row's next token and draft (its own decisions); rows that finish leave.
        staying = []
        for position, row in enumerate(active):
            assert row.step is not None
            first, draft = decoder._decide(row.gen, row.step, row.at, row.continuation, row.generator)
            decoder._commit(row.gen, [first])
            if row.gen.finished:
                finish(row)
                continue
            row.first, row.draft = first, draft[: config.max_new_tokens - len(row.gen.records)]
            staying.append(position)
        batch.keep_rows(staying)
        active = [active[p] for p in staying]
        if not active:
            continue

        # One shared forward over every row's [token] + draft.
        fed = [[row.first.token_id] + [r.token_id for r in row.draft] for row in active]  # type: ignore[union-attr]
        first_column = batch.columns
        logits, keys = _shared_forward(decoder, batch, active, fed)

        staying = []
        for position, row in enumerate(active):
            n = len(fed[position])
            row.gen.stats.forward_passes += 1
            row.step = decoder._mix(logits[position, :n], keys[position, :n], row.gen)
            accepted = _verify(decoder, row)
            # The row keeps its token and its accepted draft; its other new columns are masked out.
            batch.valid[position, first_column + 1 + accepted :] = False
            if row.gen.finished:
                finish(row)
                continue
            assert int(batch.valid[position].sum()) == row.cached
            staying.append(position)
        batch.keep_rows(staying)
        active = [active[p] for p in staying]
        batch.compact_if_sparse()

    assert all(o is not None for o in outputs)
    return outputs  # type: ignore[return-value]


def _verify(decoder: "NestDecoder", row: _Row) -> int:
    """Accept the longest acceptable prefix of the row's draft (relaxed speculative decoding),
    commit it, and set where the next proposal continues. Returns the accepted length;
    the next token's distribution is at that position of ``row.step``."""
    gen, draft, first = row.gen, row.draft, row.first
    assert row.step is not None and first is not None
    accepted = 0
    if draft:
        ratios = relaxed_accept_ratio(
            row.step.p_m[: len(draft)], torch.tensor([r.token_id for r in draft]), gen.config.effective_gamma
        )
        accepted = accepted_prefix_length(ratios, gen.config.accept_threshold)
        decoder._commit(gen, draft[:accepted])
    row.at = accepted
    row.continuation = None
    if draft and accepted == len(draft) and draft[-1].passage_index is not None:
        row.continuation = (draft[-1].passage_index, draft[-1].position + 1)  # type: ignore[operator]
    elif not draft and first.passage_index is not None:
        row.continuation = (first.passage_index, first.position + 1)  # type: ignore[operator]
    return accepted


def _shared_forward(
    decoder: "NestDecoder", batch: _BatchCache, rows: Sequence[_Row], fed: Sequence[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LM call over every row's fed tokens, right-padded to the longest.

    Returns logits (rows, L, V) float32 and query vectors (rows, L, d), L the longest
    fed length; positions past a row's own length are padding. Extends ``batch.valid``
    by L columns, valid where a row fed a real token.
    """
    lm = decoder.lm
    width = max(len(f) for f in fed)
    pad = next(iter(decoder._eos_ids), 0)
    input_ids = torch.tensor([f + [pad] * (width - len(f)) for f in fed], dtype=torch.long)
    lengths = torch.tensor([len(f) for f in fed])
    new = torch.arange(width)[None, :] < lengths[:, None]
    start = torch.tensor([row.cached - 1 for row in rows])  # the fed token is already committed
    position_ids = start[:, None] + torch.arange(width)[None, :]
    mask = torch.cat([batch.valid, new], dim=1)
    with torch.inference_mode(), lm.forward_lock, decoder.reader.capture() as captured:
        outputs = lm.model(
            input_ids=input_ids.to(lm.device),
            attention_mask=mask.to(torch.long).to(lm.device),
            position_ids=position_ids.to(lm.device),
            use_cache=True,
            **{decoder._cache_arg: batch.cache},
            logits_to_keep=width,
            **decoder.reader.forward_kwargs(),
        )
        keys = decoder.reader.keys_from(captured, outputs)
    batch.valid = mask
    return outputs.logits[:, -width:].float().cpu(), keys[:, -width:].float().cpu()
