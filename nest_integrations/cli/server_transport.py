"""The transport of ``nest serve``: where a server listens, what it and its clients say, and the
client ``nest generate`` uses when a server holds its index and LM.

A server listens on a Unix domain socket, by default one per index build and LM
(:func:`default_socket_path`) in a folder of its user's (:func:`private_run_folder`), readable by
its user alone. Each connection carries JSON lines, UTF-8, one object a line:

1. the server, as soon as it accepts a connection of its own user: the handshake
   ``{"protocol", "index", "model", "lm_path", "lm_files", "lm_fingerprint", "calibration",
   "folder", "pid"}`` -- :data:`PROTOCOL_VERSION`, what it serves (:class:`ServerIdentity`: the
   index's identity, the LM's name, the folder it was loaded from and its files, the LM's weights
   fingerprint, the calibration file's digest), the index folder and the server's process id;
2. the client, one request: ``{"op": "generate", "prompt", "query", "options"}`` (``prompt`` a
   string or a list of ``{"role", "content"}`` messages, ``query`` a string or null, ``options``
   :class:`~nest_integrations.core.config.NestConfig` fields such as ``mode`` and
   ``max_new_tokens``), or ``{"op": "stop"}``;
3. the server, for a generation: ``{"text", "spans"}`` chunks as the decoder streams them, the
   last one with ``"output"`` too (the output contract, as ``nest generate --json`` prints it);
   for a request it refuses, ``{"error"}``; for a stop, ``{"stopping": true}``.

What a client trusts: a server of its own user (the peer's uid, ``SO_PEERCRED``), in a folder
its user owns and nobody else can write, whose handshake names what the client would load itself
(:meth:`ServerIdentity.difference`); every read has a deadline (:data:`ANSWER_TIMEOUT_S`), after which
the command generates itself. A client that leaves mid-answer only ends its own generation. A
command that found no server can start one for the next command (:func:`start_server`): a
detached ``nest serve`` that stops by itself when idle. This module imports the standard library
and no more of the package than what names an index, an LM and a calibration without loading
them: a client must reach its first token without torch or transformers.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from nest_integrations.core.safe_io import MANIFEST_FILE
from nest_integrations.model.lm import cache_dir, fingerprints_match, lm_folder, weights_stamp
from nest_integrations.policy.calibration import CALIBRATION_FILE

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 2
"""Raised whenever a message changes meaning; a client and a server of two versions do not talk.
2: the handshake names the LM's folder, files and fingerprint and the calibration."""

HANDSHAKE_TIMEOUT_S = 2.0
"""Seconds a client waits to connect and to read the handshake: a server answers it from a thread
of its own, whatever it is generating, so a longer wait means it is not answering."""

ANSWER_TIMEOUT_S = 30.0
"""Seconds a client waits for each message of an answer, and for each send, once the handshake is
read: a server streams an answer token by token, so a longer silence is a server frozen,
deadlocked or swapping, and the command says so and generates itself."""

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest request line a server reads (a conversation's messages included)."""

MAX_SOCKET_PATH_BYTES = 107
"""The longest Unix socket path: ``sun_path`` holds 108 bytes on Linux, the final NUL included."""

LOG_MAX_BYTES = 1 << 20
"""Size past which :func:`start_server` moves a server log to ``SOCKET.log.1`` before the next
server appends to a fresh one (servers append: two started at once never empty each other's)."""


class NoServer(Exception):
    """No server answers at a path, it serves another index, LM or protocol, or it went away
    before its answer was complete: the command can generate itself."""


class RequestRefused(Exception):
    """The server read the request and refused it (a malformed prompt, an unknown option): the
    same request would fail locally too."""


class UntrustedPath(ValueError):
    """A folder or file where servers keep their sockets, locks and logs that another user made,
    can write, or reaches through a link: nothing in it is used."""


@dataclass(frozen=True)
class ServerIdentity:
    """What a server must hold for a client to use it: what the client would load itself.

    Read from files alone (no LM loaded): a client compares it with a server's handshake
    (:meth:`difference`), and a server with the files now to notice that what it holds changed."""

    index: str
    """The index's identity: the sha256 of its ``manifest.json`` (a rebuild gets a new one)."""
    model: str
    """The LM's name: the one given with ``--model``, else the one the index was built with."""
    lm_path: str
    """The folder the LM is loaded from, resolved (a relative ``--model lm`` names another LM in
    another working directory), or the name itself for a hub id (:func:`~nest_integrations.model.lm.lm_folder`)."""
    lm_files: Optional[str]
    """The identity of that folder's weight, config and tokenizer files (their sizes, times and
    inodes: :func:`~nest_integrations.model.lm.weights_stamp`): a folder replaced in place gets a
    new one. None for a hub id."""
    lm_fingerprint: str
    """The weights fingerprint the index's keys were built with (its manifest's); a server's LM
    must match it as :func:`~nest_integrations.model.lm.fingerprints_match` says, as loading the
    index here requires."""
    calibration: Optional[str]
    """The sha256 of the index's ``calibration.json`` (None: there is none): a server follows a
    recalibration, and a client never takes an answer made with other alpha/tau."""

    def same_build(self, other: "ServerIdentity") -> bool:
        """Whether ``other`` names the same index build and LM files (the calibration aside): what
        a running server cannot take up, unlike a recalibration."""
        return (self.index, self.model, self.lm_path, self.lm_files) == (other.index, other.model, other.lm_path, other.lm_files)

    def difference(self, handshake: dict[str, Any]) -> Optional[str]:
        """What the server that sent ``handshake`` serves that this identity does not name, in words
        (None: it serves this identity)."""
        if handshake.get("index") != self.index:
            return f"another index build ({handshake.get('folder')})"
        if (handshake.get("model"), handshake.get("lm_path")) != (self.model, self.lm_path):
            return f"another LM ({handshake.get('model')} from {handshake.get('lm_path')}, not {self.lm_path})"
        if handshake.get("lm_files") != self.lm_files:
            return f"the LM {self.lm_path} as its files were before they changed"
        if not fingerprints_match(str(handshake.get("lm_fingerprint")), self.lm_fingerprint):
            return f"an LM whose weights ({handshake.get('lm_fingerprint')}) are not those the index was built with"
        if handshake.get("calibration") != self.calibration:
            return "another calibration of the index (it was recalibrated)"
        return None

    def reread(self, folder: Path) -> "ServerIdentity":
        """This identity as the files are now: the index at ``folder`` and its calibration, and the LM
        folder this identity names (its resolved path: whatever the working directory is now).

        Raises:
            ValueError: as :func:`server_identity`.
        """
        index, _, fingerprint = manifest_identity(folder)
        lm_path = Path(self.lm_path) if self.lm_files is not None else None
        return dataclasses.replace(
            self, index=index, lm_files=lm_files(lm_path), lm_fingerprint=fingerprint, calibration=calibration_digest(read_calibration(folder)),
        )


def server_identity(folder: Path, model: Optional[str]) -> ServerIdentity:
    """The identity of the index at ``folder`` decoded with ``model`` (None: the LM it was built with),
    read from its manifest, its calibration file and the LM's folder, as they are now.

    Raises:
        ValueError: ``folder`` holds no readable index manifest, or its calibration file cannot be read.
    """
    index, built_with, fingerprint = manifest_identity(folder)
    name = model or built_with
    lm_path = lm_folder(name)
    return ServerIdentity(
        index=index, model=name, lm_path=str(lm_path or name), lm_files=lm_files(lm_path),
        lm_fingerprint=fingerprint, calibration=calibration_digest(read_calibration(folder)),
    )


def manifest_identity(folder: Path) -> tuple[str, str, str]:
    """The index at ``folder``'s identity (the sha256 of its manifest), the name of the LM it was
    built with and that LM's fingerprint, from one read of its manifest.

    Raises:
        ValueError: ``folder`` holds no readable index manifest.
    """
    manifest = folder / MANIFEST_FILE
    try:
        raw = manifest.read_bytes()
        lm = json.loads(raw)["lm"]
        return hashlib.sha256(raw).hexdigest(), str(lm["name"]), str(lm["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{folder} is not a NEST index ({MANIFEST_FILE}: {err})") from None


def lm_files(folder: Optional[Path]) -> Optional[str]:
    """:attr:`ServerIdentity.lm_files` of an LM folder (None: no folder, or it is gone): the weights
    stamp of its files, with the load left out (the same files loaded as float16 are the same files)."""
    if folder is None or not folder.is_dir():
        return None
    return weights_stamp(folder, "files")


def read_calibration(folder: Path) -> Optional[bytes]:
    """The bytes of the index's ``calibration.json`` (None: there is none), read once, so that a
    digest and the calibrations parsed from them are of one version of the file.

    Raises:
        ValueError: it exists and cannot be read (a folder, no permission).
    """
    path = folder / CALIBRATION_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err})") from None


def calibration_digest(raw: Optional[bytes]) -> Optional[str]:
    """The sha256 of a calibration file's bytes; None for no file."""
    return hashlib.sha256(raw).hexdigest() if raw is not None else None


def run_folder() -> Path:
    """Where servers put their sockets: ``$XDG_RUNTIME_DIR/nest-integrations`` (a per-user folder
    the system empties at logout), else ``run/`` in the cache folder (``~/.cache/nest-integrations``)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "nest-integrations" if runtime else cache_dir() / "run"


def private_run_folder(create: bool = False) -> Path:
    """:func:`run_folder`, made (mode 0700) when ``create`` and missing, and checked: a folder,
    not a link, of this process's user, that group and others cannot write. A team cache or a
    runtime folder others can write may hold a ``run/`` another user made first: its sockets
    and logs would be theirs to plant or replace.

    Raises:
        UntrustedPath: it exists and fails the check.
    """
    folder = run_folder()
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        check_private(os.lstat(folder), folder)
    except FileNotFoundError:
        pass
    return folder


def check_private(status: os.stat_result, path: Path) -> None:
    """Refuse ``path`` (its ``lstat`` or ``fstat``) unless it is this user's, not a link, and not
    writable by group or others.

    Raises:
        UntrustedPath: it fails one of these, named.
    """
    advice = "nest serves and reads nothing there; remove it, `chmod go-w` it, or set XDG_RUNTIME_DIR (NEST_CACHE_DIR) to a folder of yours"
    if stat.S_ISLNK(status.st_mode):
        raise UntrustedPath(f"{path} is a symbolic link: {advice}")
    if status.st_uid != os.geteuid():
        raise UntrustedPath(f"{path} belongs to another user (uid {status.st_uid}): {advice}")
    if status.st_mode & 0o022:
        raise UntrustedPath(f"{path} is writable by group or others (mode {stat.S_IMODE(status.st_mode):04o}): {advice}")


def open_private(path: Path, flags: int) -> int:
    """Open (``os.open``) the lock or log file ``path`` without following a link (a link planted
    there would make this truncate or lock a file of the link's choosing), and check what was
    opened: a regular file of this user's, with no second name (a hard link), that group and
    others cannot write. A file this creates is 0600; one that was readable by others is made so.

    Raises:
        UntrustedPath: ``path`` is a link or fails the check.
        OSError: it cannot be opened (FileNotFoundError without ``O_CREAT``).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UntrustedPath(f"{path} is a symbolic link; not followed") from None
        raise
    try:
        status = os.fstat(fd)
        check_private(status, path)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            raise UntrustedPath(f"{path} is not a plain file of one name; not used")
        if status.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of the connected Unix socket ``sock``, as the
    kernel gives it (``SO_PEERCRED``; where the system has no such option, the socket file's
    owner, which a folder nobody else can write vouches for)."""
    if hasattr(socket, "SO_PEERCRED"):
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return uid
    return os.stat(sock.getpeername()).st_uid


def check_socket_path(path: Path) -> None:
    """Refuse a socket path the system cannot bind.

    Raises:
        ValueError: ``path`` is longer than :data:`MAX_SOCKET_PATH_BYTES`.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"the socket path {path} is longer than a Unix socket allows ({MAX_SOCKET_PATH_BYTES} bytes); "
            "give a shorter --socket, or a shorter XDG_RUNTIME_DIR or NEST_CACHE_DIR"
        )


def default_socket_path(identity: ServerIdentity) -> Path:
    """The socket of the server of ``identity``: a name derived from the index identity and the LM (its
    name, folder and files), so that a client finds the server of its index and LM, and of no
    other, without asking. The calibration is not part of it: a server follows a recalibration."""
    named = "\n".join([identity.index, identity.model, identity.lm_path, identity.lm_files or ""])
    digest = hashlib.sha256(named.encode("utf-8")).hexdigest()[:20]
    return run_folder() / f"nest-{digest}.sock"


def log_path(path: Path) -> Path:
    """The log of the server started in the background for the socket ``path``: ``nest-<digest>.log`` beside it."""
    return path.with_name(path.name.removesuffix(".sock") + ".log")


def lock_path(path: Path) -> Path:
    """The lock file of the socket ``path``, held by its server from before it loads until it has
    let go of the socket; it stays when its server exits (removing it would let a second server
    lock a file a third one no longer sees)."""
    return path.with_name(path.name + ".lock")


def lock_held(path: Path) -> bool:
    """Whether a server holds the lock of the socket ``path``: it runs, or it is loading and will listen.

    Raises:
        UntrustedPath: the lock file is a link, or not this user's alone.
    """
    try:
        lock = open_private(lock_path(path), os.O_RDONLY)
    except FileNotFoundError:  # a server makes it before it loads: none has run here
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(lock)  # which releases the lock this took
    return False


def idle_timeout(value: Optional[str]) -> Optional[float]:
    """An idle timeout as ``nest serve --idle-timeout`` and ``$NEST_SERVE_IDLE_S`` give it, in
    seconds: None for ``none``, ``0`` or nothing (no timeout).

    Raises:
        ValueError: neither a positive finite number nor ``none``.
    """
    if value is None or value.strip().lower() in ("", "none"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"the idle timeout {value!r} is neither a number of seconds nor 'none'") from None
    if seconds == 0:
        return None
    if not 0 < seconds < float("inf"):
        raise ValueError("an idle timeout is a positive number of seconds, or 0 / none for no timeout")
    return seconds


def start_server(folder: Path, model: Optional[str], idle_timeout_s: Optional[float]) -> Optional[Path]:
    """Start ``nest serve`` of the index at ``folder`` decoded with ``model`` in the background,
    stopping after ``idle_timeout_s`` seconds without a request (None: never), unless a server
    already holds its socket's lock; returns the log file it writes to, or None when it started none.

    The server runs in a session of its own (a Ctrl-C in the terminal does not reach it) with
    no input, its output appended to ``nest-<digest>.log`` beside its socket (:func:`log_path`,
    0600, opened without following a link); this returns without waiting for it to load. Two
    commands that check at the same moment may both start one: the second finds the lock taken,
    says so in the same log and exits.

    Raises:
        ValueError: ``folder`` holds no readable index manifest, or the socket path is too long.
        UntrustedPath: the run folder, the lock or the log is not this user's alone (a ValueError too).
    """
    path = default_socket_path(server_identity(folder, model))
    check_socket_path(path)
    private_run_folder(create=True)
    if lock_held(path):
        return None
    log = log_path(path)
    try:
        if os.lstat(log).st_size > LOG_MAX_BYTES:
            os.replace(log, log.with_name(log.name + ".1"))  # a server still writing there keeps writing to the old one
    except FileNotFoundError:
        pass
    command = server_command(folder, model, idle_timeout_s)
    with os.fdopen(open_private(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", encoding="utf-8") as output:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    logger.info("started a server of %s in the background (log: %s)", folder, log)
    return log


def server_command(folder: Path, model: Optional[str], idle_timeout_s: Optional[float]) -> list[str]:
    """The command line :func:`start_server` runs: ``nest serve --datastore FOLDER [--model M]
    --idle-timeout S``, through this environment's ``nest`` script when it has one, so that ``ps``
    names the process ``nest`` and shows ``nest serve`` in its command line (else through this
    interpreter, ``python -m nest_integrations.cli serve ...``, e.g. from a source tree not installed)."""
    script = Path(sysconfig.get_path("scripts")) / "nest"
    launcher = [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "nest_integrations.cli"]
    command = [*launcher, "serve", "--datastore", str(folder.resolve())]
    command += ["--model", model] if model else []
    return command + ["--idle-timeout", "none" if idle_timeout_s is None else f"{idle_timeout_s:g}"]


class Connection:
    """One client connection: the server's handshake read, then one request and its answer, each
    read and send within ``answer_timeout_s`` seconds."""

    def __init__(self, sock: socket.socket, handshake: dict[str, Any], answer_timeout_s: float):
        self.sock = sock
        self.handshake = handshake
        self.answer_timeout_s = answer_timeout_s
        sock.settimeout(answer_timeout_s)
        self._reader = sock.makefile("rb")

    @classmethod
    def open(
        cls, path: Path, identity: Optional[ServerIdentity], timeout_s: float = HANDSHAKE_TIMEOUT_S, answer_timeout_s: Optional[float] = None,
    ) -> "Connection":
        """Connect to the server at ``path`` and read its handshake; ``identity``: what it must serve
        (None: any index and LM, as ``nest serve --stop`` asks); ``answer_timeout_s``: the
        deadline of each later read and send (None: :data:`ANSWER_TIMEOUT_S`).

        Raises:
            NoServer: nothing answers at ``path`` within ``timeout_s``, or the process answering
                is another user's, or it speaks another protocol, or it serves anything but ``identity``.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            uid = peer_uid(sock)
            if uid != os.geteuid():  # before a byte is read: its handshake could say anything
                sock.close()
                raise NoServer(f"the server at {path} runs as another user (uid {uid}); not used")
            reader = sock.makefile("rb")
            line = reader.readline(MAX_LINE_BYTES)
            reader.close()
            handshake = json.loads(line) if line else None
        except (OSError, ValueError, RecursionError) as err:
            sock.close()
            raise NoServer(f"no server answers at {path} ({err})") from None
        if not isinstance(handshake, dict) or handshake.get("protocol") != PROTOCOL_VERSION:
            sock.close()
            raise NoServer(f"the server at {path} speaks another protocol than version {PROTOCOL_VERSION}")
        if identity is not None and (difference := identity.difference(handshake)) is not None:
            sock.close()
            raise NoServer(f"the server at {path} serves {difference}")
        return cls(sock, handshake, ANSWER_TIMEOUT_S if answer_timeout_s is None else answer_timeout_s)

    def send(self, message: dict[str, Any]) -> None:
        """Send one message (OSError, TimeoutError included, when it cannot within ``answer_timeout_s``)."""
        self.sock.sendall(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")

    def receive(self) -> dict[str, Any]:
        """The server's next message.

        Raises:
            NoServer: the server sent nothing for ``answer_timeout_s`` seconds, closed the
                connection or sent something unreadable.
        """
        try:
            line = self._reader.readline(MAX_LINE_BYTES)
            message = json.loads(line) if line else None
        except TimeoutError:
            raise NoServer(f"the server sent nothing for {self.answer_timeout_s:g} s") from None
        except (OSError, ValueError, RecursionError) as err:
            raise NoServer(f"the server's answer broke off ({err})") from None
        if not isinstance(message, dict):
            raise NoServer("the server closed the connection before its answer was complete")
        return message

    def generate(self, prompt: Any, query: Optional[str], options: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Send one generate request and yield the answer's chunks, ``{"text", "spans"}``, the last
        one with ``"output"`` (the output contract as a dict).

        Raises:
            RequestRefused: the server refused the request (its message says why).
            NoServer: the server went away or stopped before the last chunk.
        """
        try:
            self.send({"op": "generate", "prompt": prompt, "query": query, "options": options})
        except OSError as err:
            raise NoServer(f"the server closed the connection ({err})") from None
        while True:
            message = self.receive()
            if "error" in message:
                if message.get("refused"):
                    raise RequestRefused(str(message["error"]))
                raise NoServer(str(message["error"]))
            yield message
            if "output" in message:
                return

    def stop(self) -> None:
        """Ask the server to stop (it answers, removes its socket, lets the answers in flight finish and exits).

        Raises:
            NoServer: the server did not confirm.
        """
        try:
            self.send({"op": "stop"})
        except OSError as err:
            raise NoServer(f"the server closed the connection ({err})") from None
        if not self.receive().get("stopping"):
            raise NoServer("the server did not confirm that it stops")

    def close(self) -> None:
        self._reader.close()
        self.sock.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
