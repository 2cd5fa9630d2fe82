"""Safe persistence: refuse to clobber, replace atomically, read only what is checked.

Every saved artefact of the project (a NEST index, the LangChain store, the
LlamaIndex store) goes through this module. The contracts:

* **Never delete data.** :func:`atomic_folder` replaces a target only when it
  is absent, an empty folder, or a NEST artefact of the *same kind* (the
  ``format`` in its ``manifest.json``) and the caller passed ``overwrite=True``.
  Anything else, a user's folder, a file, a symbolic link, is refused with a
  ``ValueError``. New folders get the permissions of the user's umask.
* **Old or new, never neither.** The new artefact is written to a hidden
  sibling ``.<name>-tmp-<hex>``, every file and folder in it is fsynced, and it
  is switched with the target in one ``renameat2(RENAME_EXCHANGE)`` call
  (Linux >= 3.15 with glibc >= 2.28, on ext4, xfs, btrfs, tmpfs...). Where the
  exchange is unavailable (macOS, some network or overlay file systems) the
  fallback is two renames, target to ``.<name>-old-<hex>`` then the temporary
  into place; a crash between them leaves no target for an instant, and
  :func:`recover` (run by every save and every load) renames the old folder
  back.
* **Leftovers are cleaned.** Temporaries and old copies of an interrupted save
  are removed by the next save or load of the same path. Only names of exactly
  that pattern are touched. Saves into one parent folder are serialised by an
  ``flock`` on that folder, and a load cleans only when no save holds it.
* **Loading distrusts the folder, and reads one version**: see
  :mod:`nest_integrations.core.folder_snapshot` (:class:`~nest_integrations.core.folder_snapshot.FolderSnapshot`,
  :func:`~nest_integrations.core.folder_snapshot.read_consistently`); :func:`parse_manifest`
  validates a manifest against a typed pydantic schema.

What a manifest protects against, and what it does not:

* **It detects accidents**: a truncated or partly copied file, bit rot, a file
  edited or replaced by hand, files of two saves mixed, a missing file. Each is
  a ``ValueError`` naming the folder and the file (and, for key shards, the shard).
* **It does not detect forgery.** The checksums sit in the folder they check:
  whoever can write the folder can change a file *and* rewrite its sha256 (or a
  codec's parameters, or passages), and the artefact then loads with the changed
  values. What still holds for a forged folder: nothing in it is executed, no
  read leaves the folder, and every array is checked for dtype, shape, ranges and
  agreement with the passages, so a forgery yields wrong outputs, not code
  execution or out-of-bounds reads. Trust a saved folder as much as whoever can
  write it; to detect tampering, keep the manifest's own sha256 somewhere the
  writer cannot reach (:func:`nest_integrations.index.nest_index.index_identity` gives it
  for an index) and compare before loading, or sign the manifest.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, StringConstraints, ValidationError
from typing_extensions import Annotated

try:  # POSIX; elsewhere saves are not serialised between processes
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_LEFTOVER = re.compile(r"\.(?P<name>.+)-(?P<tag>tmp|old)-[0-9a-f]{16}")

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
M = TypeVar("M", bound="ArtefactManifest")


class ArtefactManifest(BaseModel):
    """Fields every artefact manifest has; subclasses add their own, typed."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format: StrictStr
    format_version: StrictInt
    checksums: dict[StrictStr, Sha256]


# --------------------------------------------------------------------------- checksums and reads
def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_manifest(raw: bytes, schema: type[M], *, kind: str, supported_version: int, what: str, where: str) -> M:
    """Validate manifest bytes against ``schema``.

    Args:
        schema: an :class:`ArtefactManifest` subclass whose ``format`` field is
            ``Literal[kind]``.
        kind: the expected ``format``; a manifest naming another is refused
            first (one without a format is left to ``schema``).
        supported_version: the newest ``format_version`` this code reads (from 1).
        what: the artefact's name for messages, e.g. ``"NEST index"``.
        where: the manifest's location for messages.

    Raises:
        ValueError: invalid JSON, not an object, an unsupported version (bools
            are not versions), another kind or a field of the wrong type,
            naming the field.
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{where} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{where} is not a {what} manifest (not a JSON object)")
    if data.get("format", kind) != kind:
        raise ValueError(f"{where} is not a {what} manifest (its format is {data['format']!r}, not {kind!r})")
    if "format_version" not in data:
        raise ValueError(f"{where} is not a {what} manifest (it has no format_version)")
    version = data["format_version"]
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= supported_version:
        raise ValueError(
            f"{where} has {what} format version {version!r}; this nest-integrations reads versions "
            f"1 to {supported_version}. Upgrade the package or save it again."
        )
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ValueError(f"{where} is not a valid {what} manifest: {validation_message(err)}") from None


def validation_message(err: ValidationError) -> str:
    """``"field.sub: problem; ..."`` for a pydantic error, naming every bad field."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())


def manifest_format(folder: Path) -> Optional[str]:
    """The ``format`` named by ``folder/manifest.json``, or None when there is none readable."""
    try:
        raw = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    value = raw.get("format") if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None


# --------------------------------------------------------------------------- guards
def check_replaceable(target: Path, kind: str, *, overwrite: bool, found_kind: Optional[str] = None) -> None:
    """Refuse to replace ``target`` unless doing so loses nothing but a same-kind artefact.

    Allowed: no target, an empty folder, or (with ``overwrite``) an artefact
    whose kind is ``kind``. ``found_kind`` is the target's kind when the caller
    already knows it (default: :func:`manifest_format` of the folder).

    Raises:
        ValueError: anything else, with the reason.
    """
    if not os.path.lexists(target):
        return
    if target.is_symlink() or not target.is_dir():
        raise ValueError(f"{target} exists and is not a folder; refusing to replace it")
    if not any(target.iterdir()):
        return
    kind_there = found_kind if found_kind is not None else manifest_format(target)
    if kind_there != kind:
        raise ValueError(
            f"{target} exists and is not a saved {kind} (its manifest says {kind_there!r}); refusing to replace it. "
            "Choose another path, or empty it yourself."
        )
    if not overwrite:
        raise ValueError(f"{target} already holds a saved {kind}; pass overwrite=True (CLI: --force) to replace it")


# --------------------------------------------------------------------------- durability
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:  # some file systems refuse fsync on folders
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (deepest first), ``folder`` included."""
    for dirpath, _dirnames, filenames in os.walk(folder, topdown=False):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def write_file_atomic(path: Path, data: bytes) -> None:
    """Replace the file ``path`` with ``data``: temporary sibling, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}-tmp-{secrets.token_hex(8)}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()
    _fsync_path(path.parent)


# --------------------------------------------------------------------------- switching
def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    renameat2 = getattr(_libc(), "renameat2", None) if os.name == "posix" else None
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


_LIBC: list[Any] = []


def _libc() -> Any:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _sibling(target: Path, tag: str) -> Path:
    return target.with_name(f".{target.name}-{tag}-{secrets.token_hex(8)}")


def _new_folder(target: Path) -> Path:
    """A fresh empty temporary sibling of ``target`` (permissions from the umask)."""
    while True:
        tmp = _sibling(target, "tmp")
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:  # pragma: no cover - 64 random bits
            continue


def _switch(tmp: Path, target: Path) -> None:
    """Put ``tmp`` at ``target``; afterwards ``tmp`` is gone or holds the old target."""
    if not os.path.lexists(target):
        os.rename(tmp, target)
    elif not _exchange(tmp, target):
        logger.debug("renameat2(RENAME_EXCHANGE) unavailable for %s: two-rename fallback", target)
        old = _sibling(target, "old")
        os.rename(target, old)
        os.rename(tmp, target)
        _remove(old)
    _fsync_path(target.parent)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def locked_folder(parent: Path, *, blocking: bool) -> Iterator[bool]:
    """Exclusive ``flock`` on the folder ``parent`` (saves into it hold it); yields False when
    not ``blocking`` and another holder has it."""
    if fcntl is None:  # pragma: no cover
        yield True
        return
    fd = os.open(parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def leftovers(target: Path) -> list[Path]:
    """Temporaries and old copies an interrupted save of ``target`` left beside it."""
    if not target.parent.is_dir():
        return []
    found = []
    for entry in target.parent.iterdir():
        match = _LEFTOVER.fullmatch(entry.name)
        if match and match["name"] == target.name:
            found.append(entry)
    return found


def _recover_locked(target: Path) -> None:
    remains = leftovers(target)
    if not os.path.lexists(target):
        olds = sorted((p for p in remains if "-old-" in p.name), key=lambda p: p.stat().st_mtime)
        if olds:
            os.rename(olds[-1], target)
            logger.warning("restored %s from %s, left by an interrupted save", target, olds[-1].name)
            remains.remove(olds[-1])
    for path in remains:
        _remove(path)
        logger.info("removed %s, left by an interrupted save", path)


def recover(target: str | os.PathLike[str]) -> None:
    """Restore or clean what an interrupted save of ``target`` left; a no-op when a save is running.

    A missing target with an old copy beside it gets the old copy back (the
    fallback's crash window); every other leftover is removed. Called by
    every load; errors (a read-only location) are logged, never raised.
    """
    target = Path(os.path.abspath(target))
    if not leftovers(target):
        return
    try:
        with locked_folder(target.parent, blocking=False) as acquired:
            if acquired:
                _recover_locked(target)
    except OSError as err:
        logger.warning("could not clean the leftovers of an interrupted save of %s: %s", target, err)


@contextmanager
def atomic_folder(target: str | os.PathLike[str], *, kind: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder that atomically replaces ``target`` when the block succeeds.

    Args:
        kind: the artefact's ``format``; the block must write ``manifest.json``
            with that ``format`` (see :func:`check_replaceable` for what may be
            replaced).
        overwrite: replace an existing artefact of the same kind.

    Raises:
        ValueError: the target may not be replaced (checked before the block
            runs and again just before the switch).

    A failure or a crash in the block leaves ``target`` as it was; at every
    instant the path holds the old or the new folder (see the module notes for
    the fallback without ``RENAME_EXCHANGE``).
    """
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked_folder(target.parent, blocking=True):
        _recover_locked(target)
        check_replaceable(target, kind, overwrite=overwrite)
        tmp = _new_folder(target)
        try:
            yield tmp
            if manifest_format(tmp) != kind:
                raise RuntimeError(f"the new {kind} at {tmp} has no manifest of its kind")  # a bug, not user input
            fsync_tree(tmp)
            check_replaceable(target, kind, overwrite=overwrite)
            _switch(tmp, target)
        finally:
            if os.path.lexists(tmp):
                _remove(tmp)
