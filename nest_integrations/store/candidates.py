"""One generation's datastore entries, searched by the decoder at every step.

Search is vectorised over a :class:`CandidateSet` (the entries of the passages
retrieved for one generation), built once per generation: exact over float16
keys, asymmetric distance computation over codes. :class:`Neighbours` is what a
search returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .encoder import EncodedPassage
from .codec_base import Float16Codec, KeyCodec

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class Neighbours:
    """Top-r datastore entries for T query vectors, best first.

    All arrays are (T, r) torch tensors; ``r`` is ``min(k, available entries)``.
    ``scores`` are ``-||q - k||^2`` (float32; ``-inf`` marks masked entries when
    fewer than r unmasked ones exist); with compressed keys ``k`` is the key
    the codes stand for, so scores are approximate but in the same units.
    ``entries`` index into the CandidateSet.
    """

    scores: "torch.Tensor"
    values: "torch.Tensor"
    entries: "torch.Tensor"


@dataclass
class CandidateSet:
    """The datastore entries of one generation's retrieved passages, ready to search.

    Built once per generation (the passages do not change while decoding), so
    each decoding step is one matrix product (float16 keys) or one lookup-table
    pass over the codes (compressed keys). Entry ``e`` is key ``keys[e]`` ->
    value token ``values[e]`` at token position ``positions[e]`` of passage
    ``passage_index[e]``; ``keys`` is the codec's search form of the stored
    rows (float32 (n, d) for float16 keys, see
    :meth:`~nest_integrations.store.codec_base.KeyCodec.prepare`).

    ``used`` marks entries already copied; :meth:`search` skips them so the same
    span is not proposed over and over.
    """

    passage_indices: list[int]
    encoded: list[EncodedPassage]
    normalize: bool = False
    codec: KeyCodec | None = None
    """How the passages' keys are stored; None: float16."""
    keys: Any = field(init=False)
    values: "torch.Tensor" = field(init=False)
    passage_index: np.ndarray = field(init=False)
    positions: np.ndarray = field(init=False)
    used: "torch.Tensor" = field(init=False)

    def __post_init__(self) -> None:
        import torch

        if self.codec is None:
            self.codec = Float16Codec(self.encoded[0].keys.shape[1] if self.encoded else 1)
        codec = self.codec
        keys, values, owners, positions = [], [], [], []
        self._entry_of: dict[tuple[int, int], int] = {}
        for pidx, enc in zip(self.passage_indices, self.encoded):
            rows = np.flatnonzero(enc.valid)
            assert enc.keys.dtype == codec.code_dtype and enc.keys.shape[1:] == (codec.code_width,), "keys not in the codec's form"
            keys.append(enc.keys[rows])
            values.append(enc.token_ids[rows].astype(np.int64))
            owners.append(np.full(len(rows), pidx, dtype=np.int64))
            positions.append(rows.astype(np.int64))
        self.keys = codec.prepare(np.concatenate(keys) if keys else np.zeros((0, codec.code_width), dtype=codec.code_dtype))
        self.key_sq = codec.squared_norms(self.keys)
        # Normalised search compares q / |q| with k / |k| (cosine); zero keys stay zero.
        self._inv_norm = self.key_sq.sqrt().clamp_min(1e-12).reciprocal() if self.normalize else None
        self.values = torch.from_numpy(np.concatenate(values)) if values else torch.zeros(0, dtype=torch.long)
        self.passage_index = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
        self.positions = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
        for e, (p, pos) in enumerate(zip(self.passage_index.tolist(), self.positions.tolist())):
            self._entry_of[(p, pos)] = e
        self.used = torch.zeros(len(self.values), dtype=torch.bool)
        self._by_passage = dict(zip(self.passage_indices, self.encoded))

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def search(self, queries: "torch.Tensor", k: int) -> Neighbours:
        """Top-k by squared L2 distance, ``||q||^2 - 2 q.k + ||k||^2`` with the
        codec's inner products and norms (exact for float16 keys).

        Args:
            queries: float (T, d) query vectors (normalised here when the set is).
            k: neighbours per query; capped at the number of entries.
        """
        import torch

        assert queries.ndim == 2, f"queries must be (T, d), got {tuple(queries.shape)}"
        queries = queries.float()
        if self.normalize:
            queries = torch.nn.functional.normalize(queries, dim=-1)
        k = min(k, len(self))
        if k == 0:
            empty = torch.zeros((queries.shape[0], 0))
            return Neighbours(empty, empty.long(), empty.long())
        assert self.codec is not None
        ip = self.codec.inner_products(queries, self.keys)
        key_sq = self.key_sq
        if self._inv_norm is not None:
            ip, key_sq = ip * self._inv_norm, key_sq * self._inv_norm**2
        dist = (queries * queries).sum(-1, keepdim=True) - 2.0 * ip + key_sq
        scores = -dist.clamp_min(0.0)
        if bool(self.used.any()):
            scores = scores.masked_fill(self.used, float("-inf"))
        top_scores, top_entries = scores.topk(k, dim=-1)
        return Neighbours(top_scores, self.values[top_entries], top_entries)

    def mark_used(self, passage_index: int, first_position: int, last_position: int) -> None:
        """Mask the entries whose values are tokens ``first..last`` of a passage."""
        for pos in range(first_position, last_position + 1):
            e = self._entry_of.get((passage_index, pos))
            if e is not None:
                self.used[e] = True

    def is_used(self, passage_index: int, position: int) -> bool:
        """Whether the entry whose value is token ``position`` of a passage is masked
        (already copied, or outside an answer window); False for a token with no entry."""
        e = self._entry_of.get((passage_index, position))
        return e is not None and bool(self.used[e])

    def passage(self, passage_index: int) -> EncodedPassage:
        return self._by_passage[passage_index]

    def entry_source(self, entry: int) -> tuple[int, int]:
        """(passage index, value token position) of an entry."""
        return int(self.passage_index[entry]), int(self.positions[entry])
