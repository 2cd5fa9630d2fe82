"""Batched NEST: a row scheduler that advances many generations by shared forward passes.

Each prompt is a *row*: its own :class:`~nest_integrations.decoding._Generation`
(candidate set, used-entry mask, opening, records), its own sampling generator and
its own next-step distribution. Every decision a row takes is the decoder's own,
called per row: :meth:`NestDecoder._prepare` (retrieval, gate, candidates, opening),
:meth:`~NestDecoder._decide` (next token and draft), :meth:`~NestDecoder._commit`
(append, stop rules), :meth:`~NestDecoder._mix` (p_M at the row's positions) and
:meth:`~NestDecoder._output`. What the scheduler adds is only the sharing of the LM:

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
* **Prefill per row** into a cache of its own (exactly the one-by-one prefill),
  whose columns are then appended to the batch's: a row *joins* whenever there
  is room (``max_batch``), so a queue keeps the batch full.
* **Rows leave** as soon as they finish (their columns die), and dead columns
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
from the row's prefill to its finish, ``wall_s`` from the batch's start to it.

Models with sliding-window or chunked attention layers, and attention kernels
that take no 4-D mask (flash attention, flex attention), are generated one by
one (:func:`supports_batching`): a foreign column would count against a window.
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
    return getattr(config, "_attn_implementation", None) in (None, "sdpa", "eager")


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


class _PackedCache:
    """One ``DynamicCache`` of batch size 1 holding every row's columns side by side.

    ``owner[c]`` is the row that column ``c`` belongs to, -1 for a dead column (a
    rejected draft token, a finished row's). A row attends to its own live columns
    only, so the order of the columns between rows does not matter.
    """

    def __init__(self) -> None:
        self.cache: Any = None
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

    def join(self, cache: Any, owner: int) -> None:
        """Append the columns of a row's own (batch size 1) cache, owned by ``owner``."""
        length = int(self._layers(cache)[0].keys.shape[2])
        if self.cache is None:
            self.cache = cache
        else:
            for mine, theirs in zip(self._layers(self.cache), self._layers(cache)):
                mine.keys = torch.cat([mine.keys, theirs.keys], dim=2)
                mine.values = torch.cat([mine.values, theirs.values], dim=2)
        self.owner = torch.cat([self.owner, torch.full((length,), owner, dtype=torch.long)])

    def release(self, owner: int) -> None:
        """Mark a finished row's columns dead."""
        self.owner[self.owner == owner] = -1

    def compact_if_sparse(self) -> None:
        """Drop dead columns once they outnumber a quarter of the live ones (and ``_COMPACT_SLACK``)."""
        if self.cache is None:
            return
        live = self.owner >= 0
        alive = int(live.sum())
        if self.columns - alive <= max(_COMPACT_SLACK, alive // 4):
            return
        index = live.nonzero().squeeze(1)
        for layer in self._layers(self.cache):
            layer.keys = layer.keys.index_select(2, index.to(layer.keys.device))
            layer.values = layer.values.index_select(2, index.to(layer.values.device))
        self.owner = self.owner[index]


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
    batch = _PackedCache()
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
            batch.join(cache, i)
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
                batch.release(row.index)
                finish(row)
                continue
            row.first, row.draft = first, draft[: config.max_new_tokens - len(row.gen.records)]
            staying.append(position)
        active = [active[p] for p in staying]
        if not active:
            continue

        # One shared forward over every row's [token] + draft.
        fed = [[row.first.token_id] + [r.token_id for r in row.draft] for row in active]  # type: ignore[union-attr]
        first_column = batch.columns
        logits, keys = _shared_forward(decoder, batch, active, fed)

        staying = []
        offset = 0
        for position, row in enumerate(active):
            n = len(fed[position])
            row.gen.stats.forward_passes += 1
            row.step = decoder._mix(logits[offset : offset + n], keys[offset : offset + n], row.gen)
            accepted = _verify(decoder, row)
            # The row keeps its token and its accepted draft; its other new columns die.
            batch.owner[first_column + offset + 1 + accepted : first_column + offset + n] = -1
            offset += n
            if row.gen.finished:
                batch.release(row.index)
                finish(row)
                continue
            staying.append(position)
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
    decoder: "NestDecoder", batch: _PackedCache, rows: Sequence[_Row], fed: Sequence[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LM call over every row's fed tokens, packed one row after another in one sequence.

    A fed token attends to its row's live cache columns and to the tokens its row
    fed before it in this step (a 4-D mask); its position id is the row's own.
    Returns logits (Q, V) float32 and query vectors (Q, d), Q the fed tokens of all
    rows in order. Appends the Q new columns to ``batch``, owned by their rows.
    """
    lm = decoder.lm
    tokens = [t for f in fed for t in f]
    owners = torch.tensor([row.index for row, f in zip(rows, fed) for _ in f], dtype=torch.long)
    # the fed first token is already committed, so it sits at position ``cached - 1``
    positions = torch.tensor([row.cached - 1 + j for row, f in zip(rows, fed) for j in range(len(f))], dtype=torch.long)
    q, past = len(tokens), batch.columns
    columns = torch.cat([batch.owner, owners])
    allowed = (columns[None, :] == owners[:, None]) & (torch.arange(past + q)[None, :] <= past + torch.arange(q)[:, None])
    dtype = lm.model.dtype if lm.model.dtype.is_floating_point else torch.float32
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    with torch.inference_mode(), lm.forward_lock, decoder.reader.capture() as captured:
        outputs = lm.model(
            input_ids=torch.tensor([tokens], dtype=torch.long, device=lm.device),
            attention_mask=mask[None, None].to(lm.device),
            position_ids=positions[None].to(lm.device),
            use_cache=True,
            **{decoder._cache_arg: batch.cache},
            logits_to_keep=q,
            **decoder.reader.forward_kwargs(),
        )
        keys = decoder.reader.keys_from(captured, outputs)
    batch.owner = columns
    return outputs.logits[0, -q:].float().cpu(), keys[0, -q:].float().cpu()
