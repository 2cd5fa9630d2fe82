"""Sharded precomputed keys: one folder of ``.npy`` arrays per shard, read as one datastore.

A distributed build (:mod:`nest_integrations.index.distributed`) has each worker write
the keys of a contiguous run of passages into its own shard folder, so no
process ever holds the whole datastore. Loading memory-maps every array of every
shard; :class:`ShardedKeys` serves passage ``i`` from the shard that holds it.

Layout under an index folder's ``keys/``::

    shard-00000/token_ids.npy    int32 (M_s,)       passage tokens back to back
                char_spans.npy   int32 (M_s, 2)     character range of each token
                keys.npy         (M_s, code_width)  the keys in the index's codec: float16
                                                    (M_s, d), or uint8 codes (M_s, M)
                valid.npy        bool (M_s,)        whether the token is a datastore entry
                offsets.npy      int64 (P_s + 1,)   local: passage p of the shard owns
                                                    rows offsets[p]:offsets[p+1], 0 .. M_s
                embeddings.npy   float32 (P_s, D)   L2-normalised passage embeddings (the
                                                    vectors of the dense index; kept so a
                                                    shard is self-contained)
    shard-00001/...
    codec/*.npy                     the trained codec's parameters, one set for every
                                    shard (absent for float16 keys)

Shard ``s`` holds passages ``[start_s, start_s + P_s)``, ``start_s`` being the
sum of the earlier shards' ``P``. The index manifest lists each shard's passage,
token and entry counts, and every file with its sha256 (:mod:`nest_integrations.core.safe_io`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from .codec_base import Float16Codec, KeyCodec
from .key_sources import KeySegments, PrecomputedKeys

logger = logging.getLogger(__name__)

KEY_ARRAYS = ("token_ids", "char_spans", "keys", "valid", "offsets")
"""The arrays every shard (and the single-file layout) holds, in this order."""
EMBEDDINGS = "embeddings"

ShardCheck = Callable[[dict[str, np.ndarray], int, int], None]
"""``check(arrays, first_passage, shard_passages)``: raises ValueError on a bad shard."""


def shard_name(number: int) -> str:
    """Folder name of shard ``number`` under ``keys/``: ``shard-00000``, ``shard-00001``..."""
    if number < 0:
        raise ValueError(f"shard numbers start at 0, got {number}")
    return f"shard-{number:05d}"


@dataclass(frozen=True)
class ShardRecord:
    """What the manifest says of one shard: passages, tokens and datastore entries."""

    passages: int
    tokens: int
    entries: int


def write_shard(folder: Path, keys: PrecomputedKeys, embeddings: np.ndarray) -> ShardRecord:
    """Write one shard's arrays into the new folder ``folder``.

    Args:
        keys: the shard's passages encoded, keys in their codec's stored form
            (offsets local to the shard); the codec itself is saved by the index.
        embeddings: float32 (P_s, D), the same passages' L2-normalised embeddings.

    Raises:
        ValueError: ``embeddings`` does not have one float32 row per passage,
            or ``folder`` exists.
    """
    if embeddings.dtype != np.float32 or embeddings.ndim != 2 or len(embeddings) != keys.num_passages:
        raise ValueError(
            f"a shard of {keys.num_passages} passages needs float32 (passages, dim) embeddings, "
            f"got {embeddings.dtype} {embeddings.shape}"
        )
    folder.mkdir(parents=True, exist_ok=False)
    for name in KEY_ARRAYS:
        np.save(folder / f"{name}.npy", np.ascontiguousarray(getattr(keys, name)), allow_pickle=False)
    np.save(folder / f"{EMBEDDINGS}.npy", np.ascontiguousarray(embeddings), allow_pickle=False)
    return ShardRecord(passages=keys.num_passages, tokens=keys.num_tokens, entries=keys.num_entries)


def read_arrays(folder: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Memory-map ``folder/<name>.npy`` for each name (read-only, no pickle), e.g. shards a build
    just wrote; a saved index reads its own through :class:`~nest_integrations.core.folder_snapshot.FolderSnapshot`.

    Raises:
        ValueError: a file is truncated or not a ``.npy`` file (naming it).
    """
    arrays = {}
    for name in names:
        path = folder / f"{name}.npy"
        try:
            arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, EOFError, OSError) as err:  # numpy's words for a truncated or foreign .npy
            raise ValueError(f"{path} is not a readable .npy file ({err})") from err
    return arrays


class ShardedKeys(KeySegments):
    """Several :class:`PrecomputedKeys`, one per shard folder, served as one: the
    :class:`~nest_integrations.store.key_sources.KeySegments` of the shards, with their
    folder and embeddings.

    Offers what :class:`~nest_integrations.store.datastore.TokenDatastore` and
    :class:`~nest_integrations.index.nest_index.NestIndex` use of precomputed keys
    (``num_passages``, ``passage``, ``num_tokens``, ``num_entries``,
    ``key_bytes``, ``key_width``, ``codec``). Arrays stay memory-mapped; nothing is
    concatenated.

    Args:
        folder: the ``keys/`` folder holding ``shard-*`` folders.
        shards: each shard's keys, in passage order, all stored with one codec.
        embeddings: each shard's float32 (P_s, D) passage embeddings.
    """

    def __init__(self, folder: Path, shards: Sequence[PrecomputedKeys], embeddings: Sequence[np.ndarray]):
        if not shards or len(shards) != len(embeddings):
            raise ValueError(f"{folder}: sharded keys need at least one shard, and embeddings for each")
        odd = [shard_name(n) for n, s in enumerate(shards) if s.key_width != shards[0].key_width]
        if odd:
            raise ValueError(f"{folder}: {', '.join(odd)} store keys {shards[0].key_width} wide in {shard_name(0)}, not as wide")
        first = shards[0].codec
        odd = [shard_name(n) for n, s in enumerate(shards) if s.codec.spec != first.spec or s.codec.compresses and s.codec is not first]
        if odd:
            raise ValueError(f"{folder}: {', '.join(odd)} do not share {shard_name(0)}'s key codec (codes: one trained codec object)")
        super().__init__(shards)
        self.folder = folder
        self.embeddings = list(embeddings)

    @property
    def records(self) -> list[ShardRecord]:
        return [ShardRecord(s.num_passages, s.num_tokens, s.num_entries) for s in self.segments]

    def copy_to(self, folder: Path) -> list[ShardRecord]:
        """Write every shard into the new ``keys/`` folder ``folder`` (a re-save) from the arrays
        this object serves, not from the files at :attr:`folder`, which a later save may have
        replaced since; a no-op when ``folder`` is where the shards already are (a fresh
        distributed build)."""
        if folder.resolve() != self.folder.resolve():
            for number, (keys, embeddings) in enumerate(zip(self.segments, self.embeddings)):
                write_shard(folder / shard_name(number), keys, embeddings)
        return self.records

    @classmethod
    def open(
        cls, folder: Path, records: Sequence[ShardRecord], *, check: Optional[ShardCheck] = None,
        codec: Optional[KeyCodec] = None,
    ) -> "ShardedKeys":
        """Memory-map the shards ``records`` describes (:func:`read_arrays`), checked as :meth:`from_arrays` says.

        Args:
            folder: the ``keys/`` folder.

        Raises:
            ValueError: an unreadable array, or as :meth:`from_arrays`.
        """
        shards = [read_arrays(folder / shard_name(n), (*KEY_ARRAYS, EMBEDDINGS)) for n in range(len(records))]
        return cls.from_arrays(folder, records, shards, check=check, codec=codec)

    @classmethod
    def from_arrays(
        cls, folder: Path, records: Sequence[ShardRecord], shards: Sequence[dict[str, np.ndarray]], *,
        check: Optional[ShardCheck] = None, codec: Optional[KeyCodec] = None,
    ) -> "ShardedKeys":
        """The shards ``records`` describes from their arrays (each shard's :data:`KEY_ARRAYS` and
        ``embeddings``, memory-mapped), checking each against its record.

        Args:
            folder: the ``keys/`` folder they were read from (for messages).
            codec: the trained codec the shards' keys are stored with (None: float16
                of the width the first shard holds).
            check: called as ``check(arrays, first_passage, shard_passages)`` on each
                shard's key arrays before use (the index checks dtypes, shapes,
                token ids and spans against the passages); raises ValueError.

        Raises:
            ValueError: a shard whose arrays disagree with its record or whose embeddings
                are not float32 (P_s, D); the message names the shard folder.
        """
        keys_of, embeddings, start = [], [], 0
        for number, (record, arrays) in enumerate(zip(records, shards, strict=True)):
            where = folder / shard_name(number)
            key_arrays = {name: arrays[name] for name in KEY_ARRAYS}
            if check is not None:
                try:
                    check(key_arrays, start, record.passages)
                except ValueError as err:  # the check knows the passages, not which shard it reads
                    raise ValueError(f"{where}: {err}") from err
            if codec is None:
                codec = Float16Codec(key_arrays["keys"].shape[1])
            keys = PrecomputedKeys(**key_arrays, codec=codec)
            if (keys.num_passages, keys.num_tokens, keys.num_entries) != (record.passages, record.tokens, record.entries):
                raise ValueError(
                    f"{where}: the manifest records {record.passages} passages, {record.tokens} tokens and "
                    f"{record.entries} entries; the arrays hold {keys.num_passages}, {keys.num_tokens} and {keys.num_entries}"
                )
            vectors = arrays[EMBEDDINGS]
            if vectors.dtype != np.float32 or vectors.ndim != 2 or len(vectors) != record.passages:
                raise ValueError(f"{where}: embeddings must be float32 ({record.passages}, dim), got {vectors.dtype} {vectors.shape}")
            keys_of.append(keys)
            embeddings.append(vectors)
            start += record.passages
        return cls(folder, keys_of, embeddings)
