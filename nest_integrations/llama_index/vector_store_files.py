"""The persisted files of a LlamaIndex :class:`~nest_integrations.llama_index.NestVectorStore`:
writing them, reading one finished version back, and cleaning what no manifest names.

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
the manifest (see :func:`write_persisted`). Loading never executes code
from the files and reads only files the manifest lists with a checksum, so a
modified or truncated file is a ``ValueError``, never silent garbage. A load
reads the manifest and the calibrations under the folder's save lock, then each
data file once (:class:`~nest_integrations.core.folder_snapshot.FolderSnapshot`), so a
persist running meanwhile never mixes into it; it cleans stale files only by the
manifest there at its end (:func:`remove_stale_after_load`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import posixpath
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Literal, Optional

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, StringConstraints
from typing_extensions import Annotated
from llama_index.core.bridge.pydantic import Field

from nest_integrations.core.folder_snapshot import FolderReplaced, FolderSnapshot, read_consistently
from nest_integrations.core.safe_io import ArtefactManifest, locked_folder, parse_manifest, write_file_atomic
from nest_integrations.index.vector_store_calibration import CalibrationsFile, local_calibrations_file
from nest_integrations.index.vector_store_keys import SavedKeysInfo
from nest_integrations.store.shards import KEY_ARRAYS

logger = logging.getLogger(__name__)

FORMAT = "nest-integrations/llama-index-vector-store"
FORMAT_VERSION = 3
"""3: token keys among the data files (written only with keys); 2: content-addressed data file
names listed under ``files``; 1: fixed names. All are read."""
DEFAULT_NAMESPACE = "default"
MANIFEST_SUFFIX = "__vector_store.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stem(persist_path: str) -> str:
    name = posixpath.basename(persist_path)
    return name[: -len(".json")] if name.endswith(".json") else name


def _calibration_path(persist_path: str) -> str:
    """The calibrations file beside the manifest at ``persist_path``: one per namespace, as its nodes are."""
    return posixpath.join(posixpath.dirname(persist_path), f"{_stem(persist_path)}.calibration.json")


def calibrations_file(fs: fsspec.AbstractFileSystem, persist_path: str, raw_manifest: bytes) -> CalibrationsFile:
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


def npy_bytes(array: np.ndarray) -> bytes:
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
class PersistedStore:
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
) -> PersistedStore:
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
    return PersistedStore(manifest, snapshot.manifest_raw, entries, matrix, keys, calibration)


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


def write_persisted(
    fs: fsspec.AbstractFileSystem,
    persist_path: str,
    data: dict[str, bytes],
    *,
    settings: dict[str, Any],
    count: int,
    dim: int,
    keys: Optional[SavedKeysInfo],
    calibrations: Callable[[], Optional[bytes]],
) -> bytes:
    """Write one version of a store: its data files beside ``persist_path``, then the manifest at it,
    then its calibrations, all under the folder's save lock; returns the manifest's bytes.

    Args:
        data: the data files' contents by key: ``nodes`` (JSON), ``embeddings`` and, with ``keys``,
            the key arrays (``.npy`` bytes, :func:`npy_bytes`).
        settings: the store's settings, as the manifest records them.
        count: how many nodes the store holds; ``dim``: their embeddings' width.
        keys: what the saved token keys are (format 3); None: none saved (format 2).
        calibrations: the calibrations file's bytes, asked for under the lock; None removes the file.

    Raises:
        ValueError: ``persist_path`` holds a file that is not a NestVectorStore manifest.
    """
    names = _data_names(persist_path, data)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": 2 if keys is None else FORMAT_VERSION,  # version 2 readers read key-less stores
        "settings": settings,
        "count": count,
        "dim": dim,
        "files": names,
        "checksums": {names[key]: _sha256(payload) for key, payload in data.items()},
    }
    if keys is not None:
        manifest["keys"] = keys.model_dump()
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
        saved_calibrations, calibration_path = calibrations(), _calibration_path(persist_path)
        if saved_calibrations is not None:
            _write_file(fs, calibration_path, saved_calibrations)
        elif fs.exists(calibration_path):
            fs.rm(calibration_path)  # a store persisted in place of another: not its calibrations
    return raw_manifest


def read_persisted(fs: fsspec.AbstractFileSystem, persist_path: str, *, load_keys: bool) -> PersistedStore:
    """The files of the version of the store persisted at ``persist_path`` that is there now, each read once
    (:func:`_read_persisted`), read again from the start when a persist replaced them meanwhile.

    Raises:
        ValueError: as :func:`_read_persisted`.
    """
    folder = posixpath.dirname(persist_path)
    if _is_local(fs):
        manifest_name = posixpath.basename(persist_path)
        files: Callable[[], Any] = lambda: FolderSnapshot(folder or ".", what="NestVectorStore", manifest=manifest_name)
    else:
        files = lambda: _RemoteFiles(fs, persist_path)
    return read_consistently(
        files, lambda snapshot: _read_persisted(snapshot, persist_path, lambda: _persist_lock(fs, folder, blocking=True), load_keys=load_keys),
        where=persist_path,
    )


def remove_stale_after_load(fs: fsspec.AbstractFileSystem, persist_path: str) -> None:
    """After a load, remove the data files and temporaries beside ``persist_path`` that the manifest there now
    does not name (:func:`_remove_stale`); nothing when the folder's save lock is taken (a persist is running)
    or the manifest is not a readable store manifest."""
    folder = posixpath.dirname(persist_path)
    with _persist_lock(fs, folder, blocking=False) as acquired:
        listed = _listed_now(fs, persist_path) if acquired else None
        if listed is not None:  # by the manifest there now: a persist since this load read its own may have replaced it
            _remove_stale(fs, persist_path, keep=listed)
