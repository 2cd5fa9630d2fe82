"""The transport of ``nest serve``: where a server listens, what it and its clients say, and the
client ``nest generate`` uses when a server holds its index and LM.

A server listens on a Unix domain socket, by default one per index build and LM
(:func:`default_socket_path`), readable by its user alone. Each connection carries JSON lines,
UTF-8, one object a line:

1. the server, as soon as it accepts: the handshake ``{"protocol", "index", "model", "folder",
   "pid"}`` -- :data:`PROTOCOL_VERSION`, the index's identity (the sha256 of its manifest,
   :func:`server_key`), the LM's name, the index folder and the server's process id;
2. the client, one request: ``{"op": "generate", "prompt", "query", "options"}`` (``prompt`` a
   string or a list of ``{"role", "content"}`` messages, ``query`` a string or null, ``options``
   :class:`~nest_integrations.core.config.NestConfig` fields such as ``mode`` and
   ``max_new_tokens``), or ``{"op": "stop"}``;
3. the server, for a generation: ``{"text", "spans"}`` chunks as the decoder streams them, the
   last one with ``"output"`` too (the output contract, as ``nest generate --json`` prints it);
   for a request it refuses, ``{"error"}``; for a stop, ``{"stopping": true}``.

A client that leaves mid-answer only ends its own generation. A command that found no server
can start one for the next command (:func:`start_server`): a detached ``nest serve`` that stops
by itself when idle. This module imports the standard library and no more of the package than a
manifest's digest and the cache folder: a client must reach its first token without torch or
transformers.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from nest_integrations.core.safe_io import MANIFEST_FILE, sha256_file
from nest_integrations.model.lm import cache_dir

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
"""Raised whenever a message changes meaning; a client and a server of two versions do not talk."""

HANDSHAKE_TIMEOUT_S = 2.0
"""Seconds a client waits to connect and to read the handshake: a server answers it from a thread
of its own, whatever it is generating, so a longer wait means it is not answering."""

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest request line a server reads (a conversation's messages included)."""


class NoServer(Exception):
    """No server answers at a path, it serves another index, LM or protocol, or it went away
    before its answer was complete: the command can generate itself."""


class RequestRefused(Exception):
    """The server read the request and refused it (a malformed prompt, an unknown option): the
    same request would fail locally too."""


@dataclass(frozen=True)
class ServerKey:
    """What a server must hold for a client to use it: one build of an index and one LM."""

    index: str
    """The index's identity: the sha256 of its ``manifest.json`` (a rebuild gets a new one)."""
    model: str
    """The LM's name: the one given with ``--model``, else the one the index was built with."""


def server_key(folder: Path, model: Optional[str]) -> ServerKey:
    """The key of the index at ``folder`` decoded with ``model`` (None: the LM it was built with),
    read from its manifest alone.

    Raises:
        ValueError: ``folder`` holds no readable index manifest.
    """
    manifest = folder / MANIFEST_FILE
    try:
        identity = sha256_file(manifest)
        built_with = json.loads(manifest.read_text(encoding="utf-8"))["lm"]["name"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{folder} is not a NEST index ({MANIFEST_FILE}: {err})") from None
    return ServerKey(index=identity, model=model or str(built_with))


def run_folder() -> Path:
    """Where servers put their sockets: ``$XDG_RUNTIME_DIR/nest-integrations`` (a per-user folder
    the system empties at logout), else ``run/`` in the cache folder (``~/.cache/nest-integrations``)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "nest-integrations" if runtime else cache_dir() / "run"


def default_socket_path(key: ServerKey) -> Path:
    """The socket of the server of ``key``: a name derived from the index identity and the LM, so
    that a client finds the server of its index and LM, and of no other, without asking."""
    digest = hashlib.sha256(f"{key.index}\n{key.model}".encode("utf-8")).hexdigest()[:20]
    return run_folder() / f"nest-{digest}.sock"


def lock_path(path: Path) -> Path:
    """The lock file of the socket ``path``, held by its server from before it loads until it has
    let go of the socket; it stays when its server exits (removing it would let a second server
    lock a file a third one no longer sees)."""
    return path.with_name(path.name + ".lock")


def lock_held(path: Path) -> bool:
    """Whether a server holds the lock of the socket ``path``: it runs, or it is loading and will listen."""
    try:
        lock = os.open(lock_path(path), os.O_RDONLY)
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
    no input, its output in ``SOCKET.log`` beside its socket; this returns without waiting for
    it to load. Two commands that check at the same moment may both start one: the second finds
    the lock taken and exits.

    Raises:
        ValueError: ``folder`` holds no readable index manifest.
    """
    path = default_socket_path(server_key(folder, model))
    if lock_held(path):
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = path.with_name(path.name.removesuffix(".sock") + ".log")
    command = [sys.executable, "-m", "nest_integrations.cli", "serve", "--datastore", str(folder.resolve())]
    command += ["--model", model] if model else []
    command += ["--idle-timeout", "none" if idle_timeout_s is None else f"{idle_timeout_s:g}"]
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as output:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    logger.info("started a server of %s in the background (log: %s)", folder, log)
    return log


class Connection:
    """One client connection: the server's handshake read, then one request and its answer."""

    def __init__(self, sock: socket.socket, handshake: dict[str, Any]):
        self.sock = sock
        self.handshake = handshake
        self._reader = sock.makefile("rb")

    @classmethod
    def open(cls, path: Path, key: Optional[ServerKey], timeout_s: float = HANDSHAKE_TIMEOUT_S) -> "Connection":
        """Connect to the server at ``path`` and read its handshake; ``key``: what it must serve
        (None: any index and LM, as ``nest serve --stop`` asks).

        Raises:
            NoServer: nothing answers at ``path`` within ``timeout_s``, or it speaks another
                protocol, or it serves another index or LM.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            reader = sock.makefile("rb")
            line = reader.readline(MAX_LINE_BYTES)
            reader.close()
            handshake = json.loads(line) if line else None
        except (OSError, ValueError) as err:
            sock.close()
            raise NoServer(f"no server answers at {path} ({err})") from None
        if not isinstance(handshake, dict) or handshake.get("protocol") != PROTOCOL_VERSION:
            sock.close()
            raise NoServer(f"the server at {path} speaks another protocol than version {PROTOCOL_VERSION}")
        if key is not None and (handshake.get("index"), handshake.get("model")) != (key.index, key.model):
            sock.close()
            raise NoServer(f"the server at {path} serves another index or LM ({handshake.get('folder')}, {handshake.get('model')})")
        sock.settimeout(None)  # an answer takes as long as its generation
        return cls(sock, handshake)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")

    def receive(self) -> dict[str, Any]:
        """The server's next message.

        Raises:
            NoServer: the server closed the connection or sent something unreadable.
        """
        try:
            line = self._reader.readline(MAX_LINE_BYTES)
            message = json.loads(line) if line else None
        except (OSError, ValueError) as err:
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
