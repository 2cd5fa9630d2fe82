"""Reading a saved folder as one checked version, and updating a file only while its version is current.

* **Loading distrusts the folder.** A :class:`FolderSnapshot` reads a file only
  if the manifest lists it with a sha256, its path stays inside the folder, no
  symbolic link is on the way and it is a regular file; :func:`~nest_integrations.core.safe_io.parse_manifest`
  validates the manifest against a typed pydantic schema. No pickle anywhere:
  loading never executes code from the folder.
* **A load reads one version.** A save may replace the folder while a load
  reads it. A :class:`FolderSnapshot` holds the folder open and opens every
  file relative to it, and reads each file once: the bytes hashed are the
  bytes parsed, or the pages mapped. A file that a concurrent save removed
  meanwhile, or a manifest replaced underneath (a store whose files sit beside
  their manifest), makes :func:`read_consistently` read the new version from
  the start; so a load returns the old version or the new one, never a mix.

:func:`update_if_current` changes one file of a saved artefact only while the
artefact is still the version it was read from, under the save lock of
:mod:`nest_integrations.core.safe_io`.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import math
import mmap
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, ContextManager, Iterable, Iterator, Mapping, Optional, Protocol, TypeVar

import numpy as np

from .safe_io import MANIFEST_FILE, ArtefactManifest, locked_folder, parse_manifest, write_file_atomic

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=ArtefactManifest)
T = TypeVar("T")
S = TypeVar("S", bound="Snapshot")

READ_ATTEMPTS = 8
"""Versions a load starts reading, at most, while saves keep replacing what it reads."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_DIRECTORY", 0)
# A FIFO planted in a folder would block an open for reading until a writer comes: O_NONBLOCK
# opens it at once, and the regular-file check then refuses it.
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
_NPY_VERSIONS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class FolderReplaced(ValueError):
    """What a load read was replaced by a save meanwhile (:func:`read_consistently` reads it again)."""


class Snapshot(Protocol):
    """What :func:`read_consistently` asks of a snapshot besides being a context manager."""

    def replaced(self) -> bool:
        """Whether a save replaced what this snapshot read, since it was opened."""
        ...


def _plain_parts(folder: Path, rel: str) -> list[str]:
    """The parts of ``rel``, once it is shown to be a plain relative path (for messages: ``folder``).

    Raises:
        ValueError: ``rel`` is absolute, or has ``..`` / ``.`` / empty parts or a backslash.
    """
    parts = rel.split("/")
    if not rel or "\\" in rel or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{folder}: the manifest names {rel!r}, which is not a plain relative path inside the folder")
    return parts


def _fd_path(fd: int) -> str:
    """A path that opens the file behind the descriptor ``fd`` itself (Linux ``/proc/self/fd``, else ``/dev/fd``),
    for a reader that takes only a path: it reads that file even after a save removed or replaced its name."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"


class VerifiedStream:
    """A file read once, from its start: every byte read is hashed, and :meth:`finish` reads the
    rest and compares the digest with the manifest's.

    Offers ``read``, ``readinto``, ``readline`` and iteration over lines, as a binary file does.

    Args:
        handle: the file, at its start.
        expected: its sha256 from the manifest; None reads it unchecked.
        folder, rel: where it lies, for messages.
    """

    def __init__(self, handle: BinaryIO, expected: Optional[str], folder: Path, rel: str):
        self._handle = handle
        self._expected = expected
        self._digest = hashlib.sha256() if expected is not None else None
        self._folder, self._rel = folder, rel
        self.position = 0
        """Bytes read (or mapped by :meth:`map_next`) so far."""

    def fileno(self) -> int:
        return self._handle.fileno()

    def _seen(self, data: bytes | memoryview) -> None:
        if self._digest is not None:
            self._digest.update(data)
        self.position += len(data)

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._seen(data)
        return data

    def readinto(self, buffer: bytearray) -> int:
        """Fill ``buffer`` from the file; returns how many bytes came (fewer only at its end)."""
        view = memoryview(buffer)
        filled = 0
        while filled < len(view):
            count = self._handle.readinto(view[filled:])
            if not count:
                break
            filled += count
        self._seen(view[:filled])
        return filled

    def readline(self, size: int = -1) -> bytes:
        line = self._handle.readline(size)
        self._seen(line)
        return line

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")

    def map_next(self, size: int) -> np.ndarray:
        """The next ``size`` bytes of the file, memory-mapped read-only as a flat uint8 ``np.memmap``,
        taken as read: they are hashed through the mapping, so the pages checked are the pages used."""
        mapped = np.memmap(self._handle, dtype=np.uint8, mode="r", offset=self.position, shape=(size,))
        if self._digest is not None:
            for start in range(0, size, 1 << 20):
                self._digest.update(memoryview(mapped[start : start + (1 << 20)]))
        self.position += size
        self._handle.seek(self.position)  # np.memmap moved it to the end
        return mapped

    def finish(self) -> None:
        """Read the rest of the file and check the digest of all of it (once; later calls do nothing).

        Raises:
            ValueError: the file does not match its checksum.
        """
        if self._digest is None:
            return
        for block in iter(lambda: self._handle.read(1 << 20), b""):
            self._digest.update(block)
        digest, self._digest = self._digest.hexdigest(), None
        if digest != self._expected:
            raise ValueError(f"{self._folder} is corrupted: {self._rel} does not match its checksum")


class FolderSnapshot:
    """One version of a saved folder: the folder held open, every file read through it, once.

    The folder is opened once; each file is opened relative to that descriptor
    (``openat``), without following a symbolic link, and must be a regular file.
    A save that switches a new folder in (:func:`~nest_integrations.core.safe_io.atomic_folder`) leaves the
    snapshot on the old one, whose files stay readable once open; a file the
    save removed before it was opened is a ValueError, and :meth:`replaced`
    then says that the path names another folder, so :func:`read_consistently`
    reads the new one. For files that sit beside their manifest (replaced
    last), :meth:`replaced` compares the manifest too.

    Once :meth:`read_manifest` has read the manifest, every file read must be
    listed in its checksums and is hashed as it is read (:meth:`require` can
    turn hashing off); the bytes hashed are the bytes returned (or, for a
    memory-mapped array, the pages mapped). A snapshot of a folder without a
    manifest reads its files unchecked.

    Args:
        folder: the saved folder (a symbolic link to it is followed).
        what: the artefact's name for messages, e.g. ``"NEST index"``.
        manifest: the manifest's file name in ``folder``.

    Raises:
        ValueError: ``folder`` is not a folder.
    """

    def __init__(self, folder: str | os.PathLike[str], *, what: str, manifest: str = MANIFEST_FILE):
        self.folder = Path(folder)
        self.what = what
        self.manifest_name = manifest
        try:
            self._fd = os.open(self.folder, _FOLDER_FLAGS)
        except OSError:
            raise ValueError(f"{self.folder} is not a {what} (no {manifest})") from None
        status = os.fstat(self._fd)
        self._identity = (status.st_dev, status.st_ino)
        self.manifest_raw: Optional[bytes] = None
        """The manifest's bytes, once :meth:`read_manifest` read them."""
        self._checksums: Optional[Mapping[str, str]] = None
        self._hash = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "FolderSnapshot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the manifest
    def read_manifest(self, schema: type[M], *, kind: str, supported_version: int) -> M:
        """Read and validate the manifest (:func:`~nest_integrations.core.safe_io.parse_manifest`);
        every file read afterwards must be listed in its checksums.

        Raises:
            ValueError: no manifest; a listed path that is not a plain relative path (read
                or not: such a manifest is not one this package writes); or as
                :func:`~nest_integrations.core.safe_io.parse_manifest`.
        """
        fd = self._open_or_none(self.manifest_name)
        if fd is None:
            raise ValueError(f"{self.folder} is not a {self.what} (no {self.manifest_name})")
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read()
        manifest = parse_manifest(
            raw, schema, kind=kind, supported_version=supported_version, what=self.what, where=str(self.folder / self.manifest_name)
        )
        for rel in manifest.checksums:
            _plain_parts(self.folder, rel)
        self.manifest_raw, self._checksums = raw, manifest.checksums
        return manifest

    def require(self, needed: Iterable[str], *, hash_files: bool = True) -> None:
        """Refuse, before anything is read, a file the loader needs that the manifest does not list.

        Args:
            hash_files: False reads files unhashed (paths, file types and ``.npy`` sizes are
                still checked).

        Raises:
            ValueError: a needed file without checksum.
        """
        unlisted = sorted(set(needed) - set(self._checksums or {}))
        if unlisted:
            raise ValueError(f"{self.folder}: {', '.join(unlisted)} not listed in the manifest's checksums; refusing to read it")
        self._hash = hash_files

    def replaced(self) -> bool:
        """Whether the folder's path now names another folder, or its manifest holds other bytes than those read."""
        try:
            status = os.stat(self.folder)
        except OSError:
            return True
        if (status.st_dev, status.st_ino) != self._identity:
            return True
        if self.manifest_raw is None:
            return False
        try:
            with open(os.open(self.folder / self.manifest_name, _FILE_FLAGS), "rb") as handle:
                return handle.read() != self.manifest_raw
        except OSError:
            return True

    # ------------------------------------------------------------------ files
    def _expected(self, rel: str) -> Optional[str]:
        """The sha256 ``rel`` must have (None: read unchecked)."""
        if self._checksums is None:
            return None
        if rel not in self._checksums:
            raise ValueError(f"{self.folder}: {rel} not listed in the manifest's checksums; refusing to read it")
        return self._checksums[rel] if self._hash else None

    def _open_or_none(self, rel: str) -> Optional[int]:
        """A descriptor of the regular file ``rel``; None when it does not exist.

        Raises:
            ValueError: ``rel`` is not a plain relative path, passes through a symbolic
                link, is not a regular file or cannot be opened.
        """
        parts = _plain_parts(self.folder, rel)
        current = self._fd
        try:
            for depth, part in enumerate(parts):
                last = depth == len(parts) - 1
                try:
                    opened = os.open(part, _FILE_FLAGS if last else _FOLDER_FLAGS | _NOFOLLOW, dir_fd=current)
                except FileNotFoundError:
                    return None
                except OSError as err:
                    raise self._open_error(rel, part, current, err) from None
                if current != self._fd:
                    os.close(current)
                current = opened
            if not stat.S_ISREG(os.fstat(current).st_mode):
                raise ValueError(f"{self.folder / rel} is not a regular file; refusing to read it")
            opened, current = current, self._fd
            return opened
        finally:
            if current != self._fd:
                os.close(current)

    def _open_error(self, rel: str, part: str, parent: int, err: OSError) -> ValueError:
        try:
            link = stat.S_ISLNK(os.lstat(part, dir_fd=parent).st_mode)
        except OSError:
            link = False
        if link:
            return ValueError(f"{self.folder}: {rel!r} passes through a symbolic link; refusing to read it")
        return ValueError(f"{self.folder / rel} cannot be read ({err.strerror})")

    def _open(self, rel: str) -> int:
        fd = self._open_or_none(rel)
        if fd is None:
            raise ValueError(f"{self.folder} is incomplete: {rel} is missing")
        return fd

    @contextmanager
    def stream(self, rel: str) -> Iterator[VerifiedStream]:
        """The listed file ``rel``, read once: what the block reads is hashed; leaving the block
        reads the rest and checks the digest. A ValueError of the block (a parse error) on a
        file that does not match its checksum is reported as that mismatch.

        Raises:
            ValueError: as :meth:`require` and :meth:`_open_or_none`; a missing file; an
                I/O error; a file that does not match its checksum.
        """
        expected = self._expected(rel)
        raw = io.FileIO(self._open(rel), "r")
        raw.name = str(self.folder / rel)  # np.memmap takes it as its filename, for messages (check_mapping)
        with io.BufferedReader(raw) as handle:
            stream = VerifiedStream(handle, expected, self.folder, rel)
            try:
                try:
                    yield stream
                except ValueError:
                    stream.finish()  # a damaged file is reported as damaged, not by what its parse tripped over
                    raise
                stream.finish()
            except OSError as err:
                raise ValueError(f"{self.folder / rel} cannot be read ({err})") from err

    def read(self, rel: str) -> bytes:
        """All the bytes of the listed file ``rel``, checked (see :meth:`stream`)."""
        with self.stream(rel) as stream:
            return stream.read()

    def optional(self, rel: str) -> Optional[bytes]:
        """The bytes of ``rel``, a file outside the checksums (a cache); None when there is none.

        Raises:
            FolderReplaced: ``rel`` is missing and a save replaced the folder meanwhile (the
                version read may have had it: a save removes the folder it replaces).
            ValueError: ``rel`` is not a regular file (a folder, a link, a FIFO) or cannot be read.
        """
        fd = self._open_or_none(rel)
        if fd is None:
            if self.replaced():
                raise FolderReplaced(f"{self.folder} was replaced while {rel} was read")
            return None
        try:
            with os.fdopen(fd, "rb") as handle:
                return handle.read()
        except OSError as err:
            raise ValueError(f"{self.folder / rel} cannot be read ({err.strerror})") from err

    def array(self, rel: str, *, mmap: bool) -> np.ndarray:
        """The listed ``.npy`` file ``rel`` (no pickle): memory-mapped read-only when ``mmap``, else read into memory.

        The file's size must be the one its header describes before anything is
        mapped: a truncated file is a ValueError naming it, not a SIGBUS at its first use.

        Raises:
            ValueError: as :meth:`stream`; not a ``.npy`` file, an object dtype, or a size
                other than its header's.
        """
        where = self.folder / rel
        with self.stream(rel) as stream:
            try:
                version = np.lib.format.read_magic(stream)
                if version not in _NPY_VERSIONS:
                    raise ValueError(f"unsupported .npy format version {version}")
                shape, fortran, dtype = _NPY_VERSIONS[version](stream)
            except (ValueError, SyntaxError, TypeError, EOFError) as err:  # numpy's words for a foreign or cut header
                raise ValueError(f"{where} is not a readable .npy file ({err})") from err
            if dtype.hasobject:
                raise ValueError(f"{where} holds Python objects; refusing to load it (no pickle)")
            nbytes = dtype.itemsize * math.prod(shape)
            size = os.fstat(stream.fileno()).st_size
            if size != stream.position + nbytes:
                raise ValueError(
                    f"{where} holds {size} bytes; its header describes {stream.position + nbytes}: the file was truncated "
                    "or damaged (save it again)"
                )
            if mmap:
                flat = stream.map_next(nbytes)
            else:
                buffer = bytearray(nbytes)
                stream.readinto(buffer)
                flat = np.frombuffer(buffer, dtype=np.uint8)
        return flat.view(dtype).reshape(shape, order="F" if fortran else "C")

    @contextmanager
    def path(self, rel: str) -> Iterator[str]:
        """A path that opens the very file ``rel`` of this snapshot (:func:`_fd_path`), once it
        is checked, for a reader that takes only a path (a FAISS memory map). The file is
        read twice, hashed then used, both times the same file: saves never rewrite one in place.

        Raises:
            ValueError: as :meth:`stream`.
        """
        with self.stream(rel) as stream:
            stream.finish()
            yield _fd_path(stream.fileno())


def check_mapping(array: np.ndarray) -> None:
    """Raise ValueError when ``array`` is memory-mapped from a file that something truncated in place
    since it was mapped (a save never does): reading the lost pages would kill the process with
    SIGBUS. One ``fstat``; an array that is not mapped passes. What a read right after the check
    meets is not covered: replace files, never rewrite them in place.

    Raises:
        ValueError: naming the file, when it is shorter than its mapping.
    """
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, mmap.mmap) and not base.closed and base.size() < len(base):
        name = getattr(array, "filename", None) or "a memory-mapped file"
        raise ValueError(
            f"{name} was truncated after it was loaded ({base.size()} bytes left of {len(base)} mapped); "
            "load it again (or save it again, if it was damaged)"
        )


def read_consistently(open_snapshot: Callable[[], ContextManager[S]], read: Callable[[S], T], *, where: str, attempts: int = READ_ATTEMPTS) -> T:
    """``read(snapshot)`` on a fresh snapshot, again while saves replace what it reads.

    ``read`` reads every file it needs from the snapshot (parsing is fine; loading
    models is better left until after). When it fails with a ValueError and the
    snapshot was replaced meanwhile (or it raises :class:`FolderReplaced`), the
    failure came from a concurrent save, not from the folder: it starts again on the
    new version.

    Args:
        open_snapshot: makes a snapshot, e.g. ``lambda: FolderSnapshot(folder, what=...)``.
        where: the artefact, for messages.
        attempts: versions started at most.

    Raises:
        ValueError: ``read``'s own error when nothing was replaced; or, after
            ``attempts`` versions each replaced while it was read, one saying so.
    """
    for _ in range(attempts):
        with open_snapshot() as snapshot:
            try:
                return read(snapshot)
            except ValueError as err:
                if not isinstance(err, FolderReplaced) and not snapshot.replaced():
                    raise
                logger.info("%s was replaced while it was read (%s); reading the new version", where, err)
    raise ValueError(f"{where} was replaced {attempts} times while it was being loaded; load it again once the saves end")


def read_regular_file(path: Path, *, what: str = "folder") -> Optional[bytes]:
    """The bytes of the file ``path``, not through a symbolic link; None when it does not exist.

    Raises:
        ValueError: ``path`` is a folder, a link or another non-regular file, or cannot be read.
    """
    with FolderSnapshot(path.parent, what=what) as folder:
        return folder.optional(path.name)


UPDATE_WAIT_S = 10.0
"""How long :func:`update_if_current` waits for a save holding the lock (a build can hold it for
hours; the artefact it writes is another version anyway)."""


@contextmanager
def _locked_within(folder: Path, seconds: float) -> Iterator[None]:
    """:func:`~nest_integrations.core.safe_io.locked_folder`, waiting at most ``seconds`` for it.

    Raises:
        TimeoutError: another holder kept it that long.
    """
    deadline = time.monotonic() + seconds
    while True:
        with locked_folder(folder, blocking=False) as acquired:
            if acquired:
                yield
                return
        if time.monotonic() >= deadline:
            raise TimeoutError(errno.ETIMEDOUT, f"a save held {folder} for {seconds:g} s")
        time.sleep(0.05)


def update_if_current(
    path: Path, update: Callable[[Optional[bytes]], bytes], *, manifest: Path, digest: str, lock: Path
) -> bool:
    """Replace the file ``path`` that belongs to a saved artefact with ``update(its bytes, or None)``,
    only while the artefact is still the version whose manifest's sha256 is ``digest``.

    Runs under the save lock on ``lock`` (:func:`~nest_integrations.core.safe_io.locked_folder`: the parent of a
    folder :func:`~nest_integrations.core.safe_io.atomic_folder` replaces, or the folder whose manifest is replaced),
    so no save switches a new version in between the check and the write, and two
    updates do not lose each other's change; it waits :data:`UPDATE_WAIT_S` at most for it.

    Returns:
        False, writing nothing, when the artefact was replaced or removed: a process
        holding an old version never writes into the new one.

    Raises:
        ValueError: ``path`` is not a regular file, or as ``update``.
        OSError: the file cannot be written; TimeoutError: a save held the lock too long.
    """
    with _locked_within(lock, UPDATE_WAIT_S):
        try:
            found = hashlib.sha256(manifest.read_bytes()).hexdigest()
        except OSError:
            return False
        if found != digest:
            return False
        write_file_atomic(path, update(read_regular_file(path)))
    return True


def create_private_file(path: Path) -> None:
    """Make sure the file ``path`` exists, readable and writable by its owner only (0600),
    without following a symbolic link there (a history, a log).

    Raises:
        OSError: ``path`` is a symbolic link (ELOOP), a folder, or the file cannot be
            created or is another user's.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
