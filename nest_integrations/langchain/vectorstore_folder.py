"""The saved folder of a LangChain :class:`~nest_integrations.langchain.NestVectorStore`:
writing it, reading one version of it back, and checking what was read.

Saved folders hold no pickle: ``documents.json`` (ids, texts, metadata),
``vectors.npy`` (float32, loaded with ``allow_pickle=False``), the precomputed
token keys when every document has them (``keys/*.npy``, the arrays of
:class:`~nest_integrations.store.key_sources.PrecomputedKeys` in document order,
memory-mapped on load), ``calibration.json`` (alpha/tau fitted on the documents) and
``manifest.json`` with the sha256 of every other file and the LM that encoded the
keys; loading checks them all, and the keys are refused by any other LM.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import numpy as np
from pydantic import Field, StrictBool, StrictInt, StrictStr
from typing_extensions import Annotated

from nest_integrations.core.folder_snapshot import FolderSnapshot, read_consistently
from nest_integrations.core.safe_io import MANIFEST_FILE, ArtefactManifest, atomic_folder, recover, sha256_file
from nest_integrations.index.vector_store_calibration import CalibrationsFile, local_calibrations_file
from nest_integrations.index.vector_store_keys import SavedKeysInfo
from nest_integrations.store.key_sources import PrecomputedKeys
from nest_integrations.store.shards import KEY_ARRAYS

FORMAT = "nest-langchain-vectorstore"
FORMAT_VERSION = 2
"""Newest version read. 1: documents and vectors; 2 adds the token keys (still 1 without them)."""
_DOCUMENTS_FILE = "documents.json"
_VECTORS_FILE = "vectors.npy"
_KEYS_FOLDER = "keys"
_CALIBRATION_FILE = "calibration.json"
"""alpha/tau fitted on the store's documents, by LM fingerprint: a cache, so outside the checksums
(an invalid entry is fitted again, see :mod:`nest_integrations.index.vector_store_calibration`; a path that
is not a regular file is a ``ValueError``)."""


@dataclass
class SavedStore:
    """The files of one saved version of a store, read (key arrays memory-mapped), not yet in a store.

    Attributes:
        keys: the key arrays; None when none are saved or ``load_keys`` is False.
        calibration: the bytes of ``calibration.json``; None when there is none.
    """

    manifest: "_StoreManifest"
    raw_manifest: bytes
    records: list[dict[str, Any]]
    vectors: np.ndarray
    keys: Optional[dict[str, np.ndarray]]
    calibration: Optional[bytes]


def _read_snapshot(snapshot: FolderSnapshot, *, load_keys: bool) -> SavedStore:
    """Read every file of the store in ``snapshot`` once (:class:`~nest_integrations.core.folder_snapshot.FolderSnapshot`).

    Raises:
        ValueError: an invalid manifest, a missing, unlisted, damaged or unreadable file, or inconsistent contents.
    """
    base = snapshot.folder
    manifest = snapshot.read_manifest(_StoreManifest, kind=FORMAT, supported_version=FORMAT_VERSION)
    with_keys = load_keys and manifest.keys is not None
    snapshot.require([_DOCUMENTS_FILE, _VECTORS_FILE, *(_key_files() if with_keys else [])])
    with snapshot.stream(_DOCUMENTS_FILE) as stream:
        try:
            records = json.load(stream)["documents"]
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise ValueError(f"{base}: unreadable store files ({err})") from err
    vectors = snapshot.array(_VECTORS_FILE, mmap=False)
    _check_contents(base, manifest, records, vectors)
    keys = {name: snapshot.array(f"{_KEYS_FOLDER}/{name}.npy", mmap=True) for name in KEY_ARRAYS} if with_keys else None
    assert snapshot.manifest_raw is not None
    return SavedStore(manifest, snapshot.manifest_raw, records, vectors, keys, snapshot.optional(_CALIBRATION_FILE))


def calibrations_file(folder: Path, raw_manifest: bytes) -> CalibrationsFile:
    """The calibrations file of the store saved in ``folder`` whose manifest is ``raw_manifest``."""
    return local_calibrations_file(
        folder / _CALIBRATION_FILE, manifest=folder / MANIFEST_FILE, digest=hashlib.sha256(raw_manifest).hexdigest(),
        lock=Path(os.path.abspath(folder)).parent,
    )


class _StoreManifest(ArtefactManifest):
    """``manifest.json`` of a saved store, typed."""

    format: Literal["nest-langchain-vectorstore"]
    count: Annotated[StrictInt, Field(ge=0)]
    dimensions: Annotated[StrictInt, Field(ge=0)]
    key_layer: StrictStr = "ffn_input"
    encoding_prefix: Optional[StrictStr] = "auto"
    precompute_keys: StrictBool = False
    """Absent in version 1, whose stores encoded keys lazily."""
    keys: Optional[SavedKeysInfo] = None
    """The saved token keys (format 2); None: none saved."""


def _key_files() -> list[str]:
    """The key arrays' paths in a saved store folder."""
    return [f"{_KEYS_FOLDER}/{name}.npy" for name in KEY_ARRAYS]


def _check_contents(folder: Path, manifest: _StoreManifest, records: Any, vectors: np.ndarray) -> None:
    if not isinstance(records, list) or not all(
        isinstance(r, dict)
        and isinstance(r.get("id"), str)
        and r["id"]
        and isinstance(r.get("page_content"), str)
        and isinstance(r.get("metadata"), dict)
        for r in records
    ):
        raise ValueError(f"{folder}/{_DOCUMENTS_FILE}: every document needs a non-empty string id, a string page_content and a metadata object")
    if len({r["id"] for r in records}) != len(records):
        raise ValueError(f"{folder}/{_DOCUMENTS_FILE}: duplicate document ids")
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape[0] != len(records):
        raise ValueError(
            f"{folder}/{_VECTORS_FILE}: expected float32 vectors of shape ({len(records)}, d), got {vectors.dtype} {vectors.shape}"
        )
    if manifest.count != len(records) or (records and manifest.dimensions != vectors.shape[1]):
        raise ValueError(
            f"{folder}: the manifest says {manifest.count} documents of {manifest.dimensions} dimensions, "
            f"found {len(records)} of {vectors.shape[1]}"
        )
    if not np.isfinite(vectors).all():
        raise ValueError(f"{folder}/{_VECTORS_FILE}: vectors must be finite")


def write_store_folder(
    target: Path,
    *,
    overwrite: bool,
    payload: str,
    matrix: np.ndarray,
    settings: dict[str, Any],
    saved_keys: Optional[tuple[PrecomputedKeys, SavedKeysInfo]],
    calibrations: Callable[[], Optional[bytes]],
) -> bytes:
    """Write a store's folder at ``target`` atomically (:func:`~nest_integrations.core.safe_io.atomic_folder`);
    returns the manifest's bytes.

    Args:
        overwrite: replace a store already saved at ``target`` (anything else is always refused).
        payload: ``documents.json``: the documents' ids, texts and metadata as JSON.
        matrix: float32 (n, d) vectors, in the documents' order.
        settings: the store's settings, as the manifest records them.
        saved_keys: the token keys and what they are; None: saved without keys (format 1).
        calibrations: the bytes of ``calibration.json``, asked for while the folder is written; None: no file.

    Raises:
        ValueError: ``target`` holds something other than an empty folder or (with ``overwrite``) a saved store.
    """
    with atomic_folder(target, kind=FORMAT, overwrite=overwrite) as tmp:
        (tmp / _DOCUMENTS_FILE).write_text(payload, encoding="utf-8")
        np.save(tmp / _VECTORS_FILE, np.ascontiguousarray(matrix, dtype=np.float32), allow_pickle=False)
        files = [_DOCUMENTS_FILE, _VECTORS_FILE]
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": 1 if saved_keys is None else FORMAT_VERSION,  # version 1 readers read key-less stores
            "count": len(matrix),
            "dimensions": int(matrix.shape[1]),
            **settings,
        }
        if saved_keys is not None:
            keys, info = saved_keys
            (tmp / _KEYS_FOLDER).mkdir()
            for name in KEY_ARRAYS:
                np.save(tmp / _KEYS_FOLDER / f"{name}.npy", np.ascontiguousarray(getattr(keys, name)), allow_pickle=False)
            files += _key_files()
            manifest["keys"] = info.model_dump()
        saved_calibrations = calibrations()
        if saved_calibrations is not None:
            (tmp / _CALIBRATION_FILE).write_bytes(saved_calibrations)  # fsynced with the folder
        manifest["checksums"] = {name: sha256_file(tmp / name) for name in files}
        raw_manifest = json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8")
        (tmp / MANIFEST_FILE).write_bytes(raw_manifest)
    return raw_manifest


def read_store_folder(base: Path, *, load_keys: bool) -> SavedStore:
    """The files of the store saved in ``base``, after finishing or undoing an interrupted save there
    (:func:`~nest_integrations.core.safe_io.recover`): one version, each file read once (:func:`_read_snapshot`).

    Raises:
        ValueError: as :func:`_read_snapshot`.
    """
    recover(base)
    return read_consistently(
        lambda: FolderSnapshot(base, what="saved NestVectorStore"), lambda snapshot: _read_snapshot(snapshot, load_keys=load_keys),
        where=str(base),
    )
