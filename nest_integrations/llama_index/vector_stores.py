"""NestVectorStore: an in-memory LlamaIndex vector store that also keeps NEST's
token-level datastore in sync with its nodes.

Persisted layout (``persist_path`` is the manifest, as LlamaIndex's
``StorageContext.persist`` names it, e.g. ``storage/default__vector_store.json``)::

    default__vector_store.json                     manifest: format, version, settings, counts,
                                                   the data file names and their sha256
    default__vector_store.nodes-<sha>.json         node records (ids, text, metadata, relationships)
    default__vector_store.embeddings-<sha>.npy     float32 (n, d) embeddings, saved with allow_pickle=False
    default__vector_store.<array>-<sha>.npy        the token keys, when every node has precomputed ones
                                                   (format 3): the arrays of
                                                   :class:`~nest_integrations.store.key_sources.PrecomputedKeys`
                                                   (token_ids, char_spans, keys, valid, offsets) in node
                                                   order, memory-mapped on load from a local disk; the
                                                   manifest's ``keys`` names the LM that encoded them
    default__vector_store.calibration.json         alpha/tau fitted on the nodes, by LM fingerprint
                                                   (:mod:`nest_integrations.index.vector_store_calibration`): a cache,
                                                   outside the checksums (an invalid entry is fitted again;
                                                   a path that is not a regular file is a ``ValueError``)

Data files are named by their content, so replacing a store is one rename of
the manifest (see :meth:`NestVectorStore.persist`). Loading never executes code
from the files and reads only files the manifest lists with a checksum, so a
modified or truncated file is a ``ValueError``, never silent garbage. A load
reads the manifest and the calibrations under the folder's save lock, then each
data file once (:class:`~nest_integrations.core.folder_snapshot.FolderSnapshot`), so a
persist running meanwhile never mixes into it; it cleans stale files only by the
manifest there at its end.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, List, Literal, Optional, Sequence

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, StringConstraints
from typing_extensions import Annotated
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    DEFAULT_PERSIST_DIR,
    BasePydanticVectorStore,
    FilterCondition,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import (
    build_metadata_filter_fn,
    metadata_dict_to_node,
    node_to_metadata_dict,
)

from nest_integrations.core.folder_snapshot import FolderReplaced, FolderSnapshot, read_consistently
from nest_integrations.core.safe_io import ArtefactManifest, locked_folder, parse_manifest, write_file_atomic
from nest_integrations.core.similarity import unit_rows
from nest_integrations.corpus.passages import Passage
from nest_integrations.index.vector_store_calibration import CalibrationsFile, Search, VectorStoreCalibrations, local_calibrations_file
from nest_integrations.index.vector_store_keys import SavedKeysInfo, VectorStoreKeys
from nest_integrations.model.key_reader import parse_key_layer
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.shards import KEY_ARRAYS
from ._common import node_to_passage

if TYPE_CHECKING:  # pragma: no cover
    from llama_index.core.base.embeddings.base import BaseEmbedding

    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.policy.calibration import Calibration

logger = logging.getLogger(__name__)

FORMAT = "nest-integrations/llama-index-vector-store"
FORMAT_VERSION = 3
"""3: token keys among the data files (written only with keys); 2: content-addressed data file
names listed under ``files``; 1: fixed names. All are read."""
DEFAULT_NAMESPACE = "default"
_MANIFEST_SUFFIX = "__vector_store.json"
_COMBINE: dict[FilterCondition, Callable[[list[bool]], bool]] = {
    FilterCondition.AND: all,
    FilterCondition.OR: any,
    FilterCondition.NOT: lambda matches: not any(matches),
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stem(persist_path: str) -> str:
    name = posixpath.basename(persist_path)
    return name[: -len(".json")] if name.endswith(".json") else name


def _calibration_path(persist_path: str) -> str:
    """The calibrations file beside the manifest at ``persist_path``: one per namespace, as its nodes are."""
    return posixpath.join(posixpath.dirname(persist_path), f"{_stem(persist_path)}.calibration.json")


def _calibrations_file(fs: fsspec.AbstractFileSystem, persist_path: str, raw_manifest: bytes) -> CalibrationsFile:
    """The calibrations file on ``fs`` (see :func:`_calibration_path`) of the store persisted at ``persist_path``
    whose manifest is ``raw_manifest``: updated only while that manifest is still there."""
    path, digest = _calibration_path(persist_path), _sha256(raw_manifest)
    if _is_local(fs):
        folder = Path(posixpath.dirname(persist_path) or ".")
        return local_calibrations_file(Path(path), manifest=Path(persist_path), digest=digest, lock=folder)

    def update(change: Callable[[Optional[bytes]], bytes]) -> bool:  # no lock on other file systems: checked, then written
        if _read_optional(fs, persist_path) != raw_manifest:
            return False
        _write_file(fs, path, change(_read_optional(fs, path)))
        return True

    return CalibrationsFile(path, update)


def _read_optional(fs: fsspec.AbstractFileSystem, path: str) -> Optional[bytes]:
    """The bytes of ``path`` on ``fs``; None when there is no such file."""
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as handle:
        return handle.read()


def _data_names(persist_path: str, data: dict[str, bytes]) -> dict[str, str]:
    """Content-addressed names of the data files beside the manifest (format 2): nodes
    as JSON, the embeddings and key arrays as ``.npy``."""
    return {
        key: f"{_stem(persist_path)}.{key}-{_sha256(payload)[:16]}.{'json' if key == 'nodes' else 'npy'}"
        for key, payload in data.items()
    }


def _stale_data_pattern(persist_path: str) -> "re.Pattern[str]":
    """Data files of any version of the store at ``persist_path``, and write temporaries of
    those and of the manifest (see :func:`~nest_integrations.core.safe_io.write_file_atomic`)."""
    stem, name, hex16 = re.escape(_stem(persist_path)), re.escape(posixpath.basename(persist_path)), "[0-9a-f]{16}"
    arrays = "|".join(("embeddings", *KEY_ARRAYS))
    data = rf"{stem}\.(nodes-{hex16}\.json|({arrays})-{hex16}\.npy)"
    return re.compile(rf"{data}|\.{data}-tmp-{hex16}|\.{name}-tmp-{hex16}")


def _npy_bytes(array: np.ndarray) -> bytes:
    """``array`` as the bytes of a ``.npy`` file (no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def _write_file(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``path`` whole: fsynced temporary and rename locally, one object write elsewhere."""
    if _is_local(fs):
        write_file_atomic(Path(path), data)
    else:
        with fs.open(path, "wb") as handle:
            handle.write(data)


def _check_foreign(fs: fsspec.AbstractFileSystem, persist_path: str) -> None:
    """Refuse to replace a file at ``persist_path`` that is not a NestVectorStore manifest."""
    if not fs.exists(persist_path):
        return
    try:
        with fs.open(persist_path, "rb") as handle:
            kind = json.loads(handle.read()).get("format")
    except (ValueError, AttributeError, RecursionError, OSError):
        kind = None
    if kind != FORMAT:
        raise ValueError(
            f"{persist_path} exists and is not a NestVectorStore manifest; refusing to replace it. "
            "Persist to another folder or namespace, or remove it yourself."
        )


def _remove_stale(fs: fsspec.AbstractFileSystem, persist_path: str, keep: set[str]) -> None:
    """Delete the data files and temporaries of replaced or interrupted persists beside ``persist_path``,
    all but ``keep``. Call under the folder's save lock, with ``keep`` the names the manifest there
    now lists: a persist writes its data files and its manifest under that lock."""
    folder = posixpath.dirname(persist_path) or "."
    pattern = _stale_data_pattern(persist_path)
    for path in fs.ls(folder, detail=False):
        name = posixpath.basename(path.rstrip("/"))
        if pattern.fullmatch(name) and name not in keep:
            fs.rm(path)
            logger.info("removed %s, data of an earlier or interrupted persist", name)


def _listed_now(fs: fsspec.AbstractFileSystem, persist_path: str) -> Optional[set[str]]:
    """The file names the manifest at ``persist_path`` lists now; None when it is not a readable store manifest
    (then nothing beside it is known to be stale)."""
    try:
        manifest = json.loads(_read_optional(fs, persist_path) or b"null")
    except (ValueError, RecursionError, OSError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    files, checksums = manifest.get("files") or {}, manifest.get("checksums") or {}
    if not isinstance(files, dict) or not isinstance(checksums, dict):
        return None
    return {str(name) for name in files.values()} | {str(name) for name in checksums}


@contextmanager
def _persist_lock(fs: fsspec.AbstractFileSystem, folder: str, *, blocking: bool) -> Iterator[bool]:
    """The folder's save lock on a local disk (:func:`~nest_integrations.core.safe_io.locked_folder`).
    Other file systems have none: a persist goes on (yields True), a load's cleaning does not (False)."""
    if not _is_local(fs):
        yield blocking
        return
    with locked_folder(Path(folder or "."), blocking=blocking) as acquired:
        yield acquired


class _Settings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    key_layer: StrictStr
    encoding_prefix: Optional[StrictStr]
    cache_mb: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    precompute_keys: StrictBool = False
    """Absent before format 3, whose stores encoded keys lazily."""


_DataName = Annotated[str, StringConstraints(pattern=r"^[^/\\]*[^/\\.][^/\\]*$")]
"""A plain file name beside the manifest: no folder part, not ``.`` or ``..``."""


class _PersistManifest(ArtefactManifest):
    """The manifest at ``persist_path``, typed."""

    format: Literal["nest-integrations/llama-index-vector-store"]
    settings: _Settings
    count: Annotated[StrictInt, Field(ge=0)]
    dim: Annotated[StrictInt, Field(ge=0)]
    files: Optional[dict[Literal["nodes", "embeddings", "token_ids", "char_spans", "keys", "valid", "offsets"], _DataName]] = None
    """Data file names (format 2); format 1 used fixed names, see :func:`_data_files`."""
    keys: Optional[SavedKeysInfo] = None
    """The saved token keys (format 3); None: none saved."""


def _data_files(persist_path: str, manifest: _PersistManifest) -> dict[str, str]:
    """Names, beside the manifest, of the data files a manifest names (nodes, embeddings, key arrays)."""
    stem = _stem(persist_path)
    names = manifest.files or {"nodes": f"{stem}.nodes.json", "embeddings": f"{stem}.embeddings.npy"}
    expected = {"nodes", "embeddings", *(KEY_ARRAYS if manifest.keys is not None else ())}
    if set(names) != expected:
        raise ValueError(f"{persist_path} must name exactly the files {sorted(expected)}, it names {sorted(names)}")
    for name in names.values():
        if name not in manifest.checksums:
            raise ValueError(f"{persist_path}: {name} is not listed in the manifest's checksums; refusing to read it")
    return dict(names)


def _parse_entries(persist_path: str, nodes: bytes, matrix: np.ndarray, manifest: _PersistManifest) -> list[Any]:
    """Node records, checked against their embedding matrix and the manifest."""
    try:
        entries = json.loads(nodes)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"NestVectorStore at {persist_path} has unreadable data files ({err})") from err
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("id"), str) and e["id"] and isinstance(e.get("record"), dict) for e in entries
    ):
        raise ValueError(f"NestVectorStore at {persist_path}: every node entry needs a non-empty string id and a record object")
    if matrix.dtype != np.float32 or matrix.ndim != 2 or matrix.shape[0] != len(entries) or len(entries) != manifest.count:
        raise ValueError(
            f"NestVectorStore at {persist_path} is inconsistent: {len(entries)} node record(s), "
            f"embeddings {matrix.dtype} of shape {matrix.shape}, manifest count {manifest.count}"
        )
    if not np.isfinite(matrix).all():
        raise ValueError(f"NestVectorStore at {persist_path}: embeddings must be finite")
    return entries


@dataclass
class _Persisted:
    """The files of one persisted version of a store, read (key arrays memory-mapped on a local disk).

    Attributes:
        keys: the key arrays; None when none are saved or ``load_keys`` is False.
        calibration: the bytes of the calibrations file; None when there is none.
    """

    manifest: _PersistManifest
    raw_manifest: bytes
    entries: list[Any]
    matrix: np.ndarray
    keys: Optional[dict[str, np.ndarray]]
    calibration: Optional[bytes]


def _read_persisted(
    snapshot: "FolderSnapshot | _RemoteFiles", persist_path: str, lock: Callable[[], ContextManager[bool]], *, load_keys: bool
) -> _Persisted:
    """Read the manifest at ``persist_path`` and the calibrations file, then every data file the manifest names, each once.

    The manifest and the calibrations file are read under the folder's save lock (``lock()``),
    so both come from one finished persist; the data files, named by their content, then
    belong to that manifest, or are gone (a later persist cleaned them) and the read starts again.

    Raises:
        ValueError: an invalid manifest; a missing, unlisted, damaged or unreadable file; inconsistent contents.
    """
    with lock():
        manifest = snapshot.read_manifest(_PersistManifest, kind=FORMAT, supported_version=FORMAT_VERSION)
        calibration = snapshot.optional(posixpath.basename(_calibration_path(persist_path)))
    names = _data_files(persist_path, manifest)
    matrix = snapshot.array(names["embeddings"], mmap=False)
    entries = _parse_entries(persist_path, snapshot.read(names["nodes"]), matrix, manifest)
    keys = None
    if load_keys and manifest.keys is not None:
        keys = {name: snapshot.array(names[name], mmap=True) for name in KEY_ARRAYS}
    if snapshot.replaced():  # without a lock (other file systems), the calibrations may be the next persist's
        raise FolderReplaced(f"{persist_path} was persisted again")
    assert snapshot.manifest_raw is not None
    return _Persisted(manifest, snapshot.manifest_raw, entries, matrix, keys, calibration)


class _RemoteFiles:
    """The files beside a manifest on a file system other than the local disk, as a
    :class:`~nest_integrations.core.folder_snapshot.FolderSnapshot` offers them to :func:`_read_persisted`:
    each read whole, once, and checked against its sha256 (arrays in memory)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, persist_path: str):
        self.fs, self.persist_path = fs, persist_path
        self.folder = posixpath.dirname(persist_path)
        self.manifest_raw: Optional[bytes] = None
        self._checksums: dict[str, str] = {}

    def __enter__(self) -> "_RemoteFiles":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def read_manifest(self, schema: type[_PersistManifest], *, kind: str, supported_version: int) -> _PersistManifest:
        raw = self.optional(posixpath.basename(self.persist_path))
        if raw is None:
            raise ValueError(f"cannot load NestVectorStore: {self.persist_path} is missing")
        manifest = parse_manifest(raw, schema, kind=kind, supported_version=supported_version, what="NestVectorStore", where=self.persist_path)
        self.manifest_raw, self._checksums = raw, dict(manifest.checksums)
        return manifest

    def read(self, name: str) -> bytes:
        data = self.optional(name)
        if data is None:
            raise ValueError(f"cannot load NestVectorStore: {posixpath.join(self.folder, name)} is missing")
        if self._checksums.get(name) != _sha256(data):
            raise ValueError(f"NestVectorStore at {self.persist_path} is corrupted: {name} does not match its checksum")
        return data

    def array(self, name: str, *, mmap: bool) -> np.ndarray:
        """The ``.npy`` file ``name``, in memory (``mmap`` is for local disks only)."""
        data = self.read(name)
        try:
            return np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, EOFError, OSError) as err:  # numpy's words for a truncated or foreign .npy
            raise ValueError(f"NestVectorStore at {self.persist_path}: {name} is not a readable .npy file ({err})") from err

    def optional(self, name: str) -> Optional[bytes]:
        return _read_optional(self.fs, posixpath.join(self.folder, name))

    def replaced(self) -> bool:
        try:
            return self.optional(posixpath.basename(self.persist_path)) != self.manifest_raw
        except OSError:
            return True


class NestVectorStore(BasePydanticVectorStore):
    """In-memory vector store (cosine similarity) whose nodes also form NEST's token datastore.

    Use it like any LlamaIndex vector store::

        store = NestVectorStore()
        index = VectorStoreIndex.from_documents(
            docs, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
        )
        llm = NestLLM("default", retriever=index)  # shares the store's token datastore

    The token datastore (:meth:`token_datastore`, bound to one LM by
    :class:`~nest_integrations.index.vector_store_keys.VectorStoreKeys`) follows every change:
    added or replaced nodes enter it at once (their keys are appended, or
    encoded on first retrieval when lazy), deleted ones leave it (their keys
    are not persisted again), and the other nodes keep their keys.

    Precomputed or lazy keys, the trade-off: precomputing (``precompute_keys``)
    pays the LM's encoding of every token once, when nodes are added (a
    progress bar gives an estimate first), and then no answer encodes
    anything; lazy keys make adding free, and each answer encodes the nodes it
    retrieves that no earlier answer did (an LM forward over each such chunk;
    docs/persistence.md has both costs). Persisted keys load memory-mapped, so
    a reloaded store answers at once. Keys take ``2 x hidden_size`` bytes per
    token (1,152 B on the default LM).

    Args:
        lm: the LM whose hidden states are the datastore keys; optional, a
            :class:`~nest_integrations.llama_index.NestLLM` built over the store
            supplies its own (nodes added before it are encoded when it binds).
        embed_model: the embedding model the nodes are embedded with. With ``lm``,
            alpha/tau are fitted for the LM while nodes are added (:meth:`calibration`,
            whose first stage it embeds; a progress bar, at most 90 s), so no first
            question waits for the fit; without it the first nest generation fits.
    """

    stores_text: bool = True
    is_embedding_query: bool = True
    key_layer: str = Field(
        default="ffn_input",
        description="Layer whose hidden states are the datastore keys: 'ffn_input' or 'layer:<i>'.",
    )
    encoding_prefix: Optional[str] = Field(
        default="auto",
        description="Text placed before each passage when encoding keys: 'auto', 'chat', or a literal string.",
    )
    cache_mb: float = Field(default=1024.0, gt=0, description="Bound of the lazy key cache in megabytes.")
    precompute_keys: bool = Field(
        default=True,
        description="Encode token keys when nodes are added (once an LM is bound) and persist them; "
        "False: encode a node the first time it is retrieved. See the class docstring for the trade-off.",
    )
    show_progress: bool = Field(default=True, description="Draw a progress bar (with a time estimate) while precomputing keys.")

    _records: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)
    _vectors: dict[str, np.ndarray] = PrivateAttr(default_factory=dict)
    _table: Optional[tuple[list[str], np.ndarray]] = PrivateAttr(default=None)
    _lock: threading.RLock = PrivateAttr(default_factory=threading.RLock)
    _keys: VectorStoreKeys = PrivateAttr()
    _calibrations: VectorStoreCalibrations = PrivateAttr()
    _embed_model: Optional["BaseEmbedding"] = PrivateAttr(default=None)

    def __init__(self, lm: Optional[LoadedLM] = None, embed_model: Optional["BaseEmbedding"] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._embed_model = embed_model
        self._keys = VectorStoreKeys(
            self._passages, self._lock, lm=lm, key_layer=self.key_layer, encoding_prefix=self.encoding_prefix,
            cache_mb=self.cache_mb, precompute=self.precompute_keys, show_progress=self.show_progress, owner="NestVectorStore",
        )
        self._calibrations = VectorStoreCalibrations(self._keys)

    @field_validator("key_layer")
    @classmethod
    def _check_key_layer(cls, value: str) -> str:
        parse_key_layer(value)
        return value

    @classmethod
    def class_name(cls) -> str:
        return "NestVectorStore"

    @property
    def client(self) -> None:
        """No external client: the store lives in memory."""
        return None

    @property
    def lm(self) -> Optional[LoadedLM]:
        """The LM of the token datastore (None until one is given)."""
        return self._keys.lm

    def _passages(self) -> list[Passage]:
        """The nodes as passages, in store order (lock held)."""
        return [node_to_passage(metadata_dict_to_node(r)) for r in self._records.values()]

    # ------------------------------------------------------------------ token datastore
    def token_datastore(self, lm: Optional[LoadedLM] = None) -> TokenDatastore:
        """NEST's token datastore over the stored nodes, created on first use
        (with ``precompute_keys``, keys not encoded yet are encoded first).

        Args:
            lm: the LM to key the datastore with; binds it when the store has none.

        Raises:
            ValueError: no LM is known, ``lm`` differs from the store's LM, or
                persisted keys were encoded by another LM.
        """
        return self._keys.datastore(lm)

    def precompute_token_keys(self, lm: Optional[LoadedLM] = None, *, show_progress: Optional[bool] = None) -> int:
        """Encode now the token keys of every node that has none (e.g. in a lazy
        store, before :meth:`persist`); returns how many were encoded.

        Args:
            lm: as for :meth:`token_datastore`.
            show_progress: None: the store's setting.
        """
        return self._keys.encode_all(lm, show_progress=show_progress)

    # ------------------------------------------------------------------ calibration
    @property
    def calibrations(self) -> dict[str, "Calibration"]:
        """alpha/tau fitted on the store's nodes, by LM fingerprint (persisted with the store)."""
        return self._calibrations.calibrations

    def saved_calibration(self, lm: LoadedLM) -> Optional["Calibration"]:
        """The store's calibration for ``lm``, without fitting one (None: none yet)."""
        return self._calibrations.saved(lm)

    def calibration(
        self, lm: Optional[LoadedLM], embed_model: "BaseEmbedding", *, show_progress: Optional[bool] = None
    ) -> Optional["Calibration"]:
        """alpha/tau for ``lm`` (None: the store's) on the store's nodes: the store's, else fitted now
        (:meth:`calibrate`). What a :class:`~nest_integrations.llama_index.NestLLM` over the store runs
        before its first nest generation that leaves alpha or tau to calibration. None, with a warning,
        when no node has two sentences to fit on (the defaults apply).

        Args:
            embed_model: embeds the first-stage queries of the fit (the one the nodes were embedded with).
            show_progress: None: the store's setting.
        """
        return self._calibrations.calibration(lm, self._search_with(embed_model), show_progress=show_progress)

    def calibrate(
        self,
        lm: Optional[LoadedLM],
        embed_model: "BaseEmbedding",
        *,
        n: int = 12,
        seed: int = 0,
        budget_s: Optional[float] = 90.0,
        show_progress: Optional[bool] = None,
    ) -> "Calibration":
        """Fit alpha/tau for ``lm`` (None: the store's) on ``n`` of the store's nodes, at most ``budget_s``
        seconds (:func:`~nest_integrations.policy.calibration.calibrate`); keep it, and add it to the persisted
        store's calibrations file when the store was persisted or loaded.

        Raises:
            ValueError: no node of two sentences to fit on; no LM; an ``embed_model`` of another dimension.
        """
        return self._calibrations.calibrate(
            lm, self._search_with(embed_model), n=n, seed=seed, budget_s=budget_s, show_progress=show_progress
        )

    def _search_with(self, embed_model: "BaseEmbedding") -> Search:
        """The store's similarity search for text queries embedded by ``embed_model``: (passage, cosine), best first."""

        def search(query: str, k: int) -> list[tuple[Passage, float]]:
            result = self.query(VectorStoreQuery(query_embedding=embed_model.get_query_embedding(query), similarity_top_k=k))
            return [(node_to_passage(node), float(score)) for node, score in zip(result.nodes or [], result.similarities or [])]

        return search

    # ------------------------------------------------------------------ writes
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> List[str]:
        """Store nodes with their embeddings (a known id is replaced); all or nothing.

        Raises:
            ValueError: a node has no embedding, an empty one or one with NaN or infinite values, its
                dimension differs from the store's, or its metadata cannot be made JSON
                (:func:`nest_integrations.core.jsonsafe.json_safe`); the message names the node id.
        """
        with self._lock:
            dim = next(iter(self._vectors.values())).shape[0] if self._vectors else None
            vectors = []
            for node in nodes:
                if node.embedding is None:
                    raise ValueError(
                        f"node {node.node_id!r} has no embedding; add nodes through VectorStoreIndex "
                        "(which embeds them) or set node.embedding"
                    )
                try:
                    vector = np.asarray(node.embedding, dtype=np.float32)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"node {node.node_id!r} has an embedding that is not a list of numbers ({err})") from None
                if vector.size == 0:
                    raise ValueError(f"node {node.node_id!r} has an empty embedding")
                if vector.ndim != 1 or (dim is not None and vector.shape[0] != dim):
                    raise ValueError(
                        f"node {node.node_id!r} has an embedding of shape {vector.shape}; "
                        f"the store holds {dim}-d vectors"
                    )
                if not np.isfinite(vector).all():
                    raise ValueError(f"node {node.node_id!r} has an embedding with NaN or infinite values")
                node_to_passage(node)  # refuses metadata that cannot be made JSON, before anything is stored
                dim = vector.shape[0]
                vectors.append(vector)
            for node, vector in zip(nodes, vectors, strict=True):
                self._records[node.node_id] = node_to_metadata_dict(node, remove_text=False, flat_metadata=False)
                self._vectors[node.node_id] = vector
                self._keys.added([node_to_passage(node)])
            self._table = None
        self._keys.after_add()  # outside the lock: queries go on while keys are encoded
        if self._embed_model is not None:
            self._calibrations.after_add(self._search_with(self._embed_model))
        return [node.node_id for node in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the source document ``ref_doc_id``."""
        with self._lock:
            self._remove([i for i, record in self._records.items() if record.get("ref_doc_id") == ref_doc_id])

    def delete_nodes(
        self,
        node_ids: Optional[List[str]] = None,
        filters: Optional[MetadataFilters] = None,
        **delete_kwargs: Any,
    ) -> None:
        """Delete the nodes matching both ``node_ids`` and ``filters`` (None: no restriction)."""
        with self._lock:
            self._remove(self._select(node_ids=node_ids, filters=filters))

    def clear(self) -> None:
        """Delete every node."""
        with self._lock:
            self._remove(list(self._records))

    def _remove(self, node_ids: Sequence[str]) -> None:
        for node_id in node_ids:
            del self._records[node_id]
            del self._vectors[node_id]
        if node_ids:
            self._table = None
            self._keys.removed(node_ids)
            logger.debug("deleted %d node(s)", len(node_ids))

    # ------------------------------------------------------------------ reads
    def _filter_fn(self, filters: MetadataFilters) -> Callable[[str], bool]:
        """Node-id predicate for ``filters``, nested filter groups included."""
        if not any(isinstance(f, MetadataFilters) for f in filters.filters):
            return build_metadata_filter_fn(self._records.__getitem__, filters)
        parts = [
            self._filter_fn(f if isinstance(f, MetadataFilters) else MetadataFilters(filters=[f]))
            for f in filters.filters
        ]
        combine = _COMBINE[filters.condition or FilterCondition.AND]
        return lambda node_id: combine([part(node_id) for part in parts])

    def _select(
        self,
        node_ids: Optional[Sequence[str]] = None,
        filters: Optional[MetadataFilters] = None,
        doc_ids: Optional[Sequence[str]] = None,
    ) -> list[str]:
        """Stored ids (insertion order) in ``node_ids``, of documents ``doc_ids``, matching ``filters``."""
        keep = self._filter_fn(filters) if filters is not None and filters.filters else None
        wanted = set(node_ids) if node_ids is not None else None
        docs = set(doc_ids) if doc_ids is not None else None
        return [
            node_id
            for node_id, record in self._records.items()
            if (wanted is None or node_id in wanted)
            and (docs is None or record.get("ref_doc_id") in docs)
            and (keep is None or keep(node_id))
        ]

    def get_nodes(
        self,
        node_ids: Optional[List[str]] = None,
        filters: Optional[MetadataFilters] = None,
    ) -> List[BaseNode]:
        """Stored nodes matching both ``node_ids`` and ``filters`` (without embeddings)."""
        with self._lock:
            selected = self._select(node_ids=node_ids, filters=filters)
            return [metadata_dict_to_node(self._records[i]) for i in selected]

    def _unit_table(self) -> tuple[list[str], np.ndarray]:
        """Stored ids and their unit-norm embeddings (cached until the next write)."""
        if self._table is None:
            ids = list(self._vectors)
            matrix = unit_rows(np.stack([self._vectors[i] for i in ids])) if ids else np.zeros((0, 0), np.float32)
            self._table = (ids, matrix)
        return self._table

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Top ``similarity_top_k`` nodes by cosine similarity, after the id, document and metadata filters
        (empty ``node_ids`` / ``doc_ids`` lists do not restrict).

        Raises:
            ValueError: a query mode other than default, or a missing or wrong-sized query embedding.
        """
        if query.mode != VectorStoreQueryMode.DEFAULT:
            raise ValueError(f"NestVectorStore supports only the default (dense) query mode, not {query.mode.value!r}")
        if query.query_embedding is None:
            raise ValueError("NestVectorStore needs a query embedding")
        with self._lock:
            ids, matrix = self._unit_table()
            # VectorIndexRetriever sends node_ids=[] for "no restriction".
            selected = set(
                self._select(node_ids=query.node_ids or None, filters=query.filters, doc_ids=query.doc_ids or None)
            )
            rows = [row for row, node_id in enumerate(ids) if node_id in selected]
            if not rows or query.similarity_top_k <= 0:
                return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
            q = unit_rows(np.asarray([query.query_embedding]))[0]
            if q.shape[0] != matrix.shape[1]:
                raise ValueError(f"query embedding is {q.shape[0]}-d; the store holds {matrix.shape[1]}-d vectors")
            scores = matrix[rows] @ q
            best = np.argsort(-scores, kind="stable")[: query.similarity_top_k]
            top_ids = [ids[rows[b]] for b in best]
            return VectorStoreQueryResult(
                nodes=[metadata_dict_to_node(self._records[i]) for i in top_ids],
                similarities=[float(scores[b]) for b in best],
                ids=top_ids,
            )

    # ------------------------------------------------------------------ persistence
    def persist(self, persist_path: str, fs: Optional[fsspec.AbstractFileSystem] = None) -> None:
        """Write the store: data files beside ``persist_path``, then the manifest at it.

        The switch is atomic as a whole: data files have content-addressed names,
        so the old manifest keeps naming complete old files until the new
        manifest replaces it in one rename (fsynced first on a local disk);
        files no manifest names any more are removed afterwards, or by the next
        persist or load. A store already persisted at ``persist_path`` is
        replaced (``StorageContext.persist`` writes the current state); any other
        file there is refused.

        Raises:
            ValueError: ``persist_path`` holds a file that is not a NestVectorStore manifest.
        """
        fs = fs or fsspec.filesystem("file")
        with self._lock:
            ids = list(self._records)
            records = json.dumps([{"id": i, "record": self._records[i]} for i in ids], ensure_ascii=False).encode()
            matrix = np.stack([self._vectors[i] for i in ids]) if ids else np.zeros((0, 0), np.float32)
            saved_keys = self._keys.keys_to_save(self._passages())
        data = {"nodes": records, "embeddings": _npy_bytes(matrix)}
        if saved_keys is not None:
            keys, info = saved_keys
            data.update({name: _npy_bytes(getattr(keys, name)) for name in KEY_ARRAYS})
        elif ids and self._keys.bound:
            logger.info("persisting %s without token keys: some nodes have none (see precompute_token_keys)", persist_path)
        names = _data_names(persist_path, data)
        settings = {"key_layer": self.key_layer, "encoding_prefix": self.encoding_prefix, "cache_mb": self.cache_mb}
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": 2 if saved_keys is None else FORMAT_VERSION,  # version 2 readers read key-less stores
            "settings": {**settings, "precompute_keys": self.precompute_keys},
            "count": len(ids),
            "dim": int(matrix.shape[1]),
            "files": names,
            "checksums": {names[key]: _sha256(payload) for key, payload in data.items()},
        }
        if saved_keys is not None:
            manifest["keys"] = info.model_dump()
        folder = posixpath.dirname(persist_path)
        if folder:
            fs.makedirs(folder, exist_ok=True)
        raw_manifest = json.dumps(manifest, indent=2).encode()
        with _persist_lock(fs, folder, blocking=True):
            _check_foreign(fs, persist_path)
            for key, payload in data.items():
                _write_file(fs, posixpath.join(folder, names[key]), payload)
            _write_file(fs, persist_path, raw_manifest)
            _remove_stale(fs, persist_path, keep=set(names.values()))
            calibrations, calibration_path = self._calibrations.to_save(), _calibration_path(persist_path)
            if calibrations is not None:
                _write_file(fs, calibration_path, calibrations)
            elif fs.exists(calibration_path):
                fs.rm(calibration_path)  # a store persisted in place of another: not its calibrations
        self._calibrations.saved_to(_calibrations_file(fs, persist_path, raw_manifest))
        logger.info("persisted %d node(s) to %s", len(ids), persist_path)

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str = DEFAULT_PERSIST_DIR,
        namespace: str = DEFAULT_NAMESPACE,
        fs: Optional[fsspec.AbstractFileSystem] = None,
        lm: Optional[LoadedLM] = None,
        *,
        load_keys: bool = True,
    ) -> NestVectorStore:
        """Load the store ``StorageContext.persist(persist_dir)`` wrote for ``namespace``
        (see :meth:`from_persist_path`)."""
        path = os.path.join(persist_dir, f"{namespace}{_MANIFEST_SUFFIX}")
        return cls.from_persist_path(path, fs=fs, lm=lm, load_keys=load_keys)

    @classmethod
    def from_persist_path(
        cls,
        persist_path: str,
        fs: Optional[fsspec.AbstractFileSystem] = None,
        lm: Optional[LoadedLM] = None,
        *,
        load_keys: bool = True,
    ) -> NestVectorStore:
        """Load a store written by :meth:`persist` (manifest path); nothing in it is trusted.

        Args:
            lm: LM for the token datastore. Persisted token keys are checked
                against it (now, or when an LM binds the store later); without
                persisted keys they are encoded as ``precompute_keys`` says.
            load_keys: False ignores persisted token keys (e.g. to key the store
                with another LM: they are encoded again).

        Raises:
            ValueError: missing files, not a NestVectorStore manifest, a newer or
                malformed one, a data file unlisted or not matching its checksum,
                records inconsistent with the embeddings or the keys, or
                persisted keys that another LM (``lm``) encoded.
        """
        fs = fs or fsspec.filesystem("file")
        folder = posixpath.dirname(persist_path)
        if _is_local(fs):
            manifest_name = posixpath.basename(persist_path)
            files: Callable[[], Any] = lambda: FolderSnapshot(folder or ".", what="NestVectorStore", manifest=manifest_name)
        else:
            files = lambda: _RemoteFiles(fs, persist_path)
        saved = read_consistently(
            files, lambda snapshot: _read_persisted(snapshot, persist_path, lambda: _persist_lock(fs, folder, blocking=True), load_keys=load_keys),
            where=persist_path,
        )
        manifest, entries = saved.manifest, saved.entries
        store = cls(lm=lm, **manifest.settings.model_dump())
        with store._lock:
            for entry, vector in zip(entries, saved.matrix, strict=True):
                store._records[entry["id"]] = entry["record"]
                store._vectors[entry["id"]] = np.asarray(vector, dtype=np.float32)
            if saved.keys is not None:
                assert manifest.keys is not None
                store._keys.attach_saved(store._passages(), saved.keys, manifest.keys, persist_path)
        store._calibrations.load(_calibrations_file(fs, persist_path, saved.raw_manifest), saved.calibration)
        store._keys.after_add()
        with _persist_lock(fs, folder, blocking=False) as acquired:
            listed = _listed_now(fs, persist_path) if acquired else None
            if listed is not None:  # by the manifest there now: a persist since this load read its own may have replaced it
                _remove_stale(fs, persist_path, keep=listed)
        logger.info("loaded %d node(s) from %s", len(entries), persist_path)
        return store
