"""Precomputed keys: every passage's encoding in flat arrays, alone or several sets in a row.

:class:`KeySource` is what the datastore serves precomputed keys through;
:class:`PrecomputedKeys` holds one set of flat (memory-mappable) arrays and
:class:`KeySegments` serves several sets as one, in order, copying no key: a
vector store's saved keys and those encoded since
(:mod:`nest_integrations.index.vector_store_keys`), or the shards of a saved index
(:class:`~nest_integrations.store.shards.ShardedKeys`, which adds the shard folders).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from nest_integrations.core.folder_snapshot import check_mapping

from .encoder import EncodedPassage, PassageEncoder
from .codec_base import Float16Codec, KeyCodec


class KeySource(Protocol):
    """Precomputed keys as the datastore serves them: :class:`PrecomputedKeys` (flat
    arrays), :class:`KeySegments` (a vector store's saved and added keys) or
    :class:`~nest_integrations.store.shards.ShardedKeys` (one set per shard of a saved
    index). The shards' module builds on this one; the protocol is what lets the
    datastore serve them without importing it."""

    @property
    def num_passages(self) -> int:
        """Passages covered: the first ``num_passages`` of the datastore."""
        ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_entries(self) -> int: ...

    @property
    def key_bytes(self) -> int: ...

    @property
    def key_width(self) -> int:
        """Row width of the stored keys (the LM's hidden size for float16 keys)."""
        ...

    @property
    def codec(self) -> KeyCodec:
        """How the keys are stored."""
        ...

    def passage(self, index: int) -> EncodedPassage:
        """The encoding of passage ``index``."""
        ...


@dataclass
class PrecomputedKeys:
    """Every passage's encoding in flat arrays (memory-mappable).

    Attributes:
        token_ids: int32 (M,), all passage tokens back to back.
        char_spans: int32 (M, 2).
        keys: (M, codec.code_width) ``codec.code_dtype``: float16 (M, d) keys,
            or their codes.
        valid: bool (M,).
        offsets: int64 (P + 1,), passage ``p`` owns rows ``offsets[p]:offsets[p+1]``.
        codec: how ``keys`` are stored (None: float16 of the keys' width).
    """

    token_ids: np.ndarray
    char_spans: np.ndarray
    keys: np.ndarray
    valid: np.ndarray
    offsets: np.ndarray
    codec: KeyCodec = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        m = len(self.token_ids)
        if self.codec is None:
            self.codec = Float16Codec(self.keys.shape[1])
        assert self.token_ids.dtype == np.int32 and self.token_ids.ndim == 1
        assert self.char_spans.shape == (m, 2) and self.char_spans.dtype == np.int32
        assert self.keys.shape == (m, self.codec.code_width) and self.keys.dtype == self.codec.code_dtype
        assert self.valid.shape == (m,) and self.valid.dtype == np.bool_
        assert self.offsets.dtype == np.int64 and self.offsets[0] == 0 and self.offsets[-1] == m

    @property
    def num_passages(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_entries(self) -> int:
        return int(self.valid.sum())

    @property
    def key_bytes(self) -> int:
        return int(self.keys.nbytes)

    @property
    def key_width(self) -> int:
        """Row width of ``keys`` (the LM's hidden size for float16 keys)."""
        return int(self.keys.shape[1])

    def passage(self, index: int) -> EncodedPassage:
        """Passage ``index``'s rows (views, not copies).

        Raises:
            ValueError: a memory-mapped array's file was truncated in place since it was
                loaded (:func:`~nest_integrations.core.folder_snapshot.check_mapping`): reading it would be a SIGBUS.
        """
        for array in (self.token_ids, self.char_spans, self.keys, self.valid, self.offsets):
            check_mapping(array)
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        return EncodedPassage(self.token_ids[lo:hi], self.char_spans[lo:hi], self.keys[lo:hi], self.valid[lo:hi])

    @classmethod
    def from_encoded(
        cls, encoded: Sequence[EncodedPassage], encoder: PassageEncoder, codec: KeyCodec | None = None
    ) -> "PrecomputedKeys":
        """Flatten passages whose keys are already stored with ``codec`` (None: float16 from ``encoder``)."""
        codec = codec if codec is not None else Float16Codec(encoder.lm.hidden_size)
        lengths = np.asarray([len(e.token_ids) for e in encoded], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

        def stack(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros(empty_shape, dtype=dtype))

        return cls(
            token_ids=stack([e.token_ids for e in encoded], (0,), np.int32),
            char_spans=stack([e.char_spans for e in encoded], (0, 2), np.int32),
            keys=stack([e.keys for e in encoded], (0, codec.code_width), codec.code_dtype),
            valid=stack([e.valid for e in encoded], (0,), np.bool_),
            offsets=offsets,
            codec=codec,
        )


class KeySegments:
    """Several :class:`PrecomputedKeys` served as one, in order.

    Passage ``i`` comes from the segment that holds it. Appending a segment
    copies no key, so keys loaded memory-mapped stay mapped. Offers what
    :class:`~nest_integrations.store.datastore.TokenDatastore` uses of precomputed keys.

    Args:
        segments: at least one, all stored with one codec and of one key width.
    """

    def __init__(self, segments: Sequence[PrecomputedKeys]):
        if not segments or len({s.key_width for s in segments}) != 1:
            raise ValueError("key segments need at least one segment, all of one key width")
        self.segments = list(segments)
        self._starts = np.cumsum([0] + [s.num_passages for s in self.segments]).astype(np.int64)

    @staticmethod
    def joined(first: "PrecomputedKeys | KeySegments | None", more: PrecomputedKeys) -> "PrecomputedKeys | KeySegments":
        """``more`` after ``first`` (None: ``more`` alone)."""
        if first is None:
            return more
        return KeySegments([*(first.segments if isinstance(first, KeySegments) else [first]), more])

    @property
    def codec(self) -> KeyCodec:
        """How every segment stores its keys."""
        return self.segments[0].codec

    @property
    def key_width(self) -> int:
        return self.segments[0].key_width

    @property
    def num_passages(self) -> int:
        return int(self._starts[-1])

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)

    @property
    def num_entries(self) -> int:
        return sum(s.num_entries for s in self.segments)

    @property
    def key_bytes(self) -> int:
        return sum(s.key_bytes for s in self.segments)

    def passage(self, index: int) -> EncodedPassage:
        """Encoded passage ``index`` (global), read from the segment that holds it."""
        if not 0 <= index < self.num_passages:
            raise IndexError(f"passage {index} is outside the {self.num_passages} precomputed passages")
        segment = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.segments[segment].passage(index - int(self._starts[segment]))
