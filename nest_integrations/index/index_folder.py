"""The saved folder of a :class:`~nest_integrations.index.nest_index.NestIndex`: its manifest, every
file read once, and the keys checked against the passages and the codec.

Folder layout (no pickle anywhere; loading never executes code from the folder)::

    manifest.json      format version, LM and tokenizer fingerprints, key layer,
                       encoding prefix, hidden size, dtype, counts, sha256 of every file
    passages.jsonl     one Passage per line
    dense.faiss        FAISS index of passage embeddings   (+ dense.json)
    keys/*.npy         precomputed token keys (optional), memory-mapped on load
    keys/shard-*/*.npy the same split in shards, as a distributed build writes them
                       (format version 2; see :mod:`nest_integrations.store.shards`)
    keys/codec/*.npy   the trained parameters of the key codec when keys/keys.npy
                       (or every shard's keys.npy) holds codes instead of float16
                       keys (format version 2; see :mod:`nest_integrations.store.key_codec`)

:meth:`NestIndex.save <nest_integrations.index.nest_index.NestIndex.save>` writes it;
:func:`read_index_folder` reads one version of it (not yet checked against an LM), and
:func:`saved_keys` turns its key arrays into the datastore's precomputed keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator
from typing_extensions import Annotated

from nest_integrations.core.folder_snapshot import FolderSnapshot
from nest_integrations.core.safe_io import MANIFEST_FILE, ArtefactManifest
from nest_integrations.corpus.passages import Passage, parse_passages_jsonl
from nest_integrations.model.key_reader import parse_key_layer
from nest_integrations.policy.calibration import CALIBRATION_FILE
from nest_integrations.store.codec_base import Float16Codec, KeyCodec
from nest_integrations.store.key_codec import codec_from_arrays, parse_spec, saved_array_names
from nest_integrations.store.key_sources import PrecomputedKeys
from nest_integrations.store.shards import EMBEDDINGS, KEY_ARRAYS, ShardedKeys, ShardRecord, shard_name

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.retrieval.dense import SavedDense

FORMAT = "nest-index"
FORMAT_VERSION = 2
"""Newest version read. Version 1: float16 keys in one set of arrays (still written for
such indexes, so older releases read them); version 2 adds sharded keys and compressed keys."""


@dataclass
class SavedIndex:
    """The files of one saved version of an index, read (key arrays memory-mapped) and not yet checked against an LM.

    Attributes:
        identity: the sha256 of the manifest read (:func:`~nest_integrations.index.nest_index.index_identity`).
        keys: the flat key arrays (with ``embeddings`` of each shard, per shard), empty without precomputed keys.
        codec: the key codec's arrays.
        calibration: the bytes of ``calibration.json``, None when there is none.
    """

    manifest: "IndexManifest"
    identity: str
    passages: list[Passage]
    dense: "SavedDense"
    keys: list[dict[str, np.ndarray]]
    codec: dict[str, np.ndarray]
    calibration: Optional[bytes]


def read_index_folder(snapshot: FolderSnapshot, *, verify_checksums: bool) -> SavedIndex:
    """Read every file of the index in ``snapshot`` once (see :class:`~nest_integrations.core.folder_snapshot.FolderSnapshot`):
    the manifest, passages, dense index, key arrays (memory-mapped), codec and calibrations.

    Raises:
        ValueError: an invalid or newer manifest; a missing, unlisted, damaged or unreadable file.
    """
    from nest_integrations.retrieval.dense import read_saved_dense

    manifest = snapshot.read_manifest(IndexManifest, kind=FORMAT, supported_version=FORMAT_VERSION)
    key_folders = [f"keys/{shard_name(n)}" for n in range(len(manifest.key_shards or []))] or ["keys"]
    key_arrays = (*KEY_ARRAYS, EMBEDDINGS) if manifest.key_shards is not None else KEY_ARRAYS  # a shard holds its embeddings too
    key_files = [f"{folder}/{name}.npy" for folder in key_folders for name in key_arrays] if manifest.precomputed_keys else []
    codec_names = saved_array_names(manifest.key_codec) if manifest.precomputed_keys else ()
    codec_files = [f"keys/codec/{name}.npy" for name in codec_names]
    snapshot.require(["passages.jsonl", "dense.faiss", "dense.json", *key_files, *codec_files], hash_files=verify_checksums)
    listed = sorted(rel for rel in manifest.checksums if rel.startswith("keys/codec/"))
    if manifest.precomputed_keys and listed != sorted(codec_files):  # e.g. an opq index relabelled pq: its codes would be read unrotated
        raise ValueError(
            f"{snapshot.folder}: a {manifest.key_codec} key codec is saved as {codec_files or 'no files'}, the manifest lists {listed or 'none'}"
        )
    with snapshot.stream("passages.jsonl") as stream:
        passages = parse_passages_jsonl(stream, str(snapshot.folder / "passages.jsonl"))
    if len(passages) != manifest.counts.passages:
        raise ValueError(f"{snapshot.folder}: manifest says {manifest.counts.passages} passages, found {len(passages)}")
    dense = read_saved_dense(snapshot)
    keys = [{name: snapshot.array(f"{folder}/{name}.npy", mmap=True) for name in key_arrays} for folder in key_folders] if key_files else []
    codec = {name: snapshot.array(rel, mmap=False) for name, rel in zip(codec_names, codec_files)}
    assert snapshot.manifest_raw is not None
    identity = hashlib.sha256(snapshot.manifest_raw).hexdigest()
    return SavedIndex(manifest, identity, passages, dense, keys, codec, snapshot.optional(CALIBRATION_FILE))



class _LMEntry(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    name: StrictStr
    fingerprint: StrictStr


class _Counts(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    passages: Annotated[StrictInt, Field(ge=1)]
    tokens: Annotated[StrictInt, Field(ge=0)]
    entries: Annotated[StrictInt, Field(ge=0)]


class IndexManifest(ArtefactManifest):
    """``manifest.json`` of an index folder, typed (see the module docstring)."""

    format: Literal["nest-index"] = FORMAT  # absent in the first format-1 indexes
    created: StrictStr
    lm: _LMEntry
    tokenizer_fingerprint: StrictStr
    key_layer: StrictStr
    encoding_prefix: Optional[StrictStr]
    encoding_prefix_text: StrictStr
    max_passage_tokens: Annotated[StrictInt, Field(ge=2)]
    hidden_size: Annotated[StrictInt, Field(ge=1)]
    dtype: Literal["float16"]
    retriever: Literal["hybrid", "dense", "bm25"]
    counts: _Counts
    precomputed_keys: StrictBool
    key_shards: Optional[Annotated[list[_Counts], Field(min_length=1)]] = None
    """Passages, tokens and entries of each shard of sharded keys (format 2); None: one set of arrays."""
    key_codec: StrictStr = "float16"
    """How ``keys/keys.npy`` or every shard's ``keys.npy`` stores keys (format 2; absent: float16)."""

    @field_validator("key_codec")
    @classmethod
    def _known_codec(cls, value: str) -> str:
        parse_spec(value)
        return value

    @field_validator("key_layer")
    @classmethod
    def _known_key_layer(cls, value: str) -> str:
        parse_key_layer(value)
        return value


def saved_keys(folder: Path, saved: SavedIndex, *, vocab_size: int) -> "PrecomputedKeys | ShardedKeys":
    """The saved keys (one set of arrays, or shards), each checked by :func:`check_key_arrays`.

    Raises:
        ValueError: an inconsistent array, shards that do not cover the passages,
            totals differing from the manifest's counts, or a codec that does not fit.
    """
    manifest, passages = saved.manifest, saved.passages
    keys: PrecomputedKeys | ShardedKeys
    codec = load_codec(folder, manifest, saved.codec)
    if manifest.key_shards is None:
        [arrays] = saved.keys
        try:
            check_key_arrays(arrays, passages, hidden_size=manifest.hidden_size, vocab_size=vocab_size, codec=codec)
        except ValueError as err:
            raise ValueError(f"{folder / 'keys'}: {err}") from err
        keys = PrecomputedKeys(**arrays, codec=codec)
    else:
        if sum(shard.passages for shard in manifest.key_shards) != len(passages):
            raise ValueError(f"{folder}: the key shards cover {sum(s.passages for s in manifest.key_shards)} passages, the index has {len(passages)}")

        def check(arrays: dict[str, np.ndarray], first: int, count: int) -> None:
            check_key_arrays(
                arrays, passages[first : first + count], hidden_size=manifest.hidden_size, vocab_size=vocab_size, codec=codec
            )

        records = [ShardRecord(s.passages, s.tokens, s.entries) for s in manifest.key_shards]
        keys = ShardedKeys.from_arrays(folder / "keys", records, saved.keys, check=check, codec=codec)
    if manifest.counts.tokens != keys.num_tokens or manifest.counts.entries != keys.num_entries:
        raise ValueError(
            f"{folder / MANIFEST_FILE} counts {manifest.counts.tokens} tokens and {manifest.counts.entries} entries; "
            f"the key arrays hold {keys.num_tokens} and {keys.num_entries}"
        )
    return keys


def load_codec(folder: Path, manifest: IndexManifest, arrays: dict[str, np.ndarray]) -> KeyCodec:
    """The trained key codec named by the manifest, from the arrays of ``keys/codec/*.npy`` (checked by :func:`codec_from_arrays`).

    Raises:
        ValueError: parameters that do not fit the codec or the hidden size.
    """
    spec = manifest.key_codec
    try:
        return codec_from_arrays(spec, manifest.hidden_size, arrays)
    except ValueError as err:
        raise ValueError(f"{folder}: its {spec} key codec cannot be loaded ({err})") from err


def check_key_arrays(
    arrays: dict[str, np.ndarray], passages: Sequence[Passage], *, hidden_size: int, vocab_size: int,
    codec: KeyCodec | None = None,
) -> None:
    """Check one set of key arrays against each other, their passages, the key codec (None:
    float16 keys of ``hidden_size``) and the vocabulary.

    Raises:
        ValueError: wrong dtype or shape, offsets that do not tile the tokens,
            token ids outside the vocabulary, or character spans outside their
            passage or not tiling it from its start (shifted offsets).
    """
    token_ids, char_spans, keys, valid, offsets = (arrays[name] for name in KEY_ARRAYS)
    codec = codec if codec is not None else Float16Codec(hidden_size)
    m = len(token_ids)
    shapes_ok = (
        token_ids.dtype == np.int32 and token_ids.ndim == 1
        and char_spans.dtype == np.int32 and char_spans.shape == (m, 2)
        and keys.dtype == codec.code_dtype and keys.shape == (m, codec.code_width)
        and valid.dtype == np.bool_ and valid.shape == (m,)
        and offsets.dtype == np.int64 and offsets.shape == (len(passages) + 1,)
    )
    if not shapes_ok:
        raise ValueError("the index's key arrays have the wrong dtype or shape")
    if offsets[0] != 0 or offsets[-1] != m or (np.diff(offsets) < 0).any():
        raise ValueError(f"the index's key offsets do not tile its {m} tokens over {len(passages)} passages")
    if m and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        raise ValueError(f"the index's token ids fall outside the LM's vocabulary of {vocab_size}")
    limits = np.repeat(np.asarray([len(p.text) for p in passages], dtype=np.int64), np.diff(offsets))
    if m and ((char_spans[:, 0] < 0) | (char_spans[:, 0] > char_spans[:, 1]) | (char_spans[:, 1] > limits)).any():
        raise ValueError("the index's character spans fall outside their passages")
    first = np.zeros(m, dtype=bool)
    first[offsets[:-1][np.diff(offsets) > 0]] = True
    if m and ((char_spans[first, 0] != 0).any() or (char_spans[1:, 0] != char_spans[:-1, 1])[~first[1:]].any()):
        raise ValueError("the index's character spans do not tile each passage from its start: offsets and spans disagree")

