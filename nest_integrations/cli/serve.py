"""``nest serve``: an index and its LM loaded once, answering ``nest generate`` from a resident process.

A one-shot ``nest generate`` spends most of its time before the first token importing torch and
transformers and loading the LM, the embedder and the index (``nest bench startup``). A server
pays that once: it loads the index and its decoder as ``nest generate`` does
(:func:`~nest_integrations.cli.common.load_index`), then answers on a Unix domain socket
(:mod:`.server_transport`: the socket's place, the handshake, the JSON lines), and ``nest generate``
finds it by itself.

Each connection is answered by a thread of a pool, which prepares its generation (retrieval,
gate, prompt) and streams it through :meth:`NestDecoder.stream`: concurrent requests decode
together in the LM's shared batch (:mod:`nest_integrations.decoding.batching_service`), and a client that
leaves mid-answer ends its own row only (closing the stream cancels it). The threads are kept
between requests, as the batching worker is, because torch's CPU thread pool belongs to the
thread that runs the ops (the query's embedding, a passage's encoding): a fresh thread per
request would build a fresh pool each time. SIGTERM, SIGINT and ``nest
serve --stop`` remove the socket at once (new clients then generate themselves), let the answers
in flight finish and exit, as does ``--idle-timeout`` once that long has passed with no
connection and no answer in flight (``nest generate`` starts its servers so: they hold memory
only while they are used). A socket file whose server is gone is replaced: a running server
holds an exclusive lock on ``SOCKET.lock``, so a socket without a held lock is stale.

A server answers its own user only (the peer's uid), and serves what a client would load itself
(:class:`~.server_transport.ServerIdentity`): before each handshake, and every :data:`FOLLOW_EVERY_S` seconds,
it reads the index's manifest, its calibration file and the LM folder's files again; it takes
up a recalibration (the next answers use the new alpha/tau), and stops when the index was
rebuilt or the LM's files changed, which it cannot take up without loading again (a client then
finds no server at that identity's socket and starts one of the new files).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import signal
import socketserver
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Optional

import typer

from .common import build_default_index, console, default_index_path, fail, load_index, setup_logging
from .server_transport import (
    MAX_LINE_BYTES, PROTOCOL_VERSION, Connection, NoServer, ServerIdentity, UntrustedPath, calibration_digest, check_socket_path,
    default_socket_path, idle_timeout, lock_path, open_private, peer_uid, private_run_folder, read_calibration, server_identity,
)

logger = logging.getLogger(__name__)

app = typer.Typer()
"""The commands of this module, merged into ``nest``."""

REQUEST_TIMEOUT_S = 30.0
"""Seconds a connection may stay silent (its request not sent) or stop reading its answer before
the server drops it: a stuck client neither holds a thread nor delays a shutdown for longer."""

MAX_CLIENTS = 64
"""Connections answered at once; more wait for a thread (their handshake too, so past the
client's handshake timeout a command generates itself). Above the shared batch's rows
(:data:`~nest_integrations.decoding.batching_service.DEFAULT_MAX_BATCH`), so that every row the batch can
hold has a client."""

STOP_WAIT_S = 60.0
"""Seconds ``nest serve --stop`` waits for the server to finish its answers in flight and let go of its socket."""

FOLLOW_EVERY_S = 2.0
"""Seconds between two checks that the index, its calibration and the LM's files are still those
the server holds (each connection checks too, before its handshake), so that a server nobody
reaches any more stops soon: reading a manifest and listing the LM's folder take 0.3 ms for the
default LM."""


class ServerRunning(Exception):
    """Another server holds the socket's lock."""


def claim_socket(path: Path) -> IO[str]:
    """Take ``path`` for a new server: lock ``PATH.lock`` (held until the server closes it; opened
    without following a link, and only when it is this user's alone) and remove a stale socket
    file left by a server that is gone. The folder is made private (0700) when this creates it.

    Raises:
        ServerRunning: a live server holds the lock.
        ValueError: ``path`` exists and is not a socket, or is too long for a Unix socket.
        UntrustedPath: the lock file is a link or another user's (a ValueError too).
    """
    check_socket_path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = os.fdopen(open_private(lock_path(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", encoding="utf-8")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ServerRunning(f"a server already runs at {path} (nest serve --stop stops it)") from None
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return lock
    if not stat.S_ISSOCK(found.st_mode):
        lock.close()
        raise ValueError(f"{path} exists and is not a socket")
    logger.info("replacing the stale socket %s (its server is gone)", path)
    path.unlink()
    return lock


class GenerateServer(socketserver.UnixStreamServer):
    """A Unix-socket server answering generate requests with a decoder of ``index``, each
    connection in a thread of a pool of :data:`MAX_CLIENTS`.

    Args:
        path: the socket to listen on (mode 0600), claimed with :func:`claim_socket` first.
        index: the loaded :class:`~nest_integrations.index.nest_index.NestIndex`; its
            :meth:`decoder` answers (its config is each answer's base, a request's options apply
            on top), made again when the index is recalibrated.
        identity: what it serves, read before the index was loaded (:func:`~.server_transport.server_identity`: a
            file that changed while it loaded reads as changed at the first check, never the
            other way round); the handshake says it.
        folder: the index folder (the handshake names it).
        lock: the lock :func:`claim_socket` returned, released on :meth:`server_close`.
        idle_timeout_s: seconds with no connection and no answer in flight after which the
            server stops itself (None: it answers until stopped), counted from its start and
            checked at each poll of :meth:`serve_forever`.
        warmup: generate one token before listening, so that the first question pays nothing
            lazy (the calibration, the first forward's set-up).

    :meth:`serve_forever` answers until :meth:`stop`; :meth:`server_close` then waits for the
    answers in flight and removes the socket.
    """

    request_queue_size = MAX_CLIENTS

    def __init__(
        self, path: Path, index: Any, identity: ServerIdentity, folder: Path, lock: IO[str], idle_timeout_s: Optional[float] = None, *,
        warmup: bool = False,
    ):
        self.path = path
        self.index = index
        self.decoder = index.decoder()
        if warmup:
            started = time.perf_counter()
            self.decoder.generate("Hello.", max_new_tokens=1)
            logger.info("warmed up in %.2f s", time.perf_counter() - started)
        self.identity = identity
        self.folder = folder
        self.idle_timeout_s = idle_timeout_s
        self.lm_fingerprint = index.lm.fingerprint()
        self._lock = lock
        self._activity = threading.Lock()
        self._following = threading.Lock()
        self._followed_at = time.monotonic()
        self._in_flight = 0
        self._idle_since = time.monotonic()
        self._pool = ThreadPoolExecutor(max_workers=MAX_CLIENTS, thread_name_prefix="nest-serve")
        self.stopping = threading.Event()
        old_umask = os.umask(0o177)  # the socket is born 0600: no moment when others may connect
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old_umask)
        self._inode = path.stat().st_ino

    def handshake(self) -> dict[str, Any]:
        identity = self.identity
        return {
            "protocol": PROTOCOL_VERSION, "index": identity.index, "model": identity.model, "lm_path": identity.lm_path,
            "lm_files": identity.lm_files, "lm_fingerprint": self.lm_fingerprint, "calibration": identity.calibration,
            "folder": str(self.folder), "pid": os.getpid(),
        }

    def follow(self) -> None:
        """Check that the index, its calibration and the LM's files are still those this server
        holds: take up a new calibration file (a fresh decoder with its alpha/tau answers the next
        requests; those in flight finish with the one they started with), and stop when the index
        or the LM changed, or their files cannot be read."""
        with self._following:
            self._followed_at = time.monotonic()
            if self.stopping.is_set():
                return
            try:
                now = self.identity.reread(self.folder)
                if not now.same_build(self.identity):
                    raise ValueError("the index was rebuilt or the LM's files changed")
                if now.calibration != self.identity.calibration:
                    self._recalibrated()
            except ValueError as err:
                logger.warning("stopping, as this server no longer holds what a client would load from %s: %s", self.folder, err)
                self.stop()

    def _recalibrated(self) -> None:
        """Take up the calibration file as it is now: its bytes read once, digested and parsed. The
        decoder is made again only when this LM's calibration changed (not when the server's own
        first generation fitted and saved the one it already uses)."""
        from nest_integrations.policy.calibration import CALIBRATION_FILE, CalibrationFile

        raw = read_calibration(self.folder)
        self.index.calibrations = dict(CalibrationFile.parse(raw, str(self.folder / CALIBRATION_FILE)).calibrations)
        if self.index.calibrations.get(self.lm_fingerprint) != self.decoder.calibration:
            self.decoder = self.index.decoder()
            logger.info("took up the recalibration of %s", self.folder)
        self.identity = dataclasses.replace(self.identity, calibration=calibration_digest(raw))

    def stop(self) -> None:
        """Stop answering (safe from a signal handler or a request's thread): the socket goes at
        once, :meth:`serve_forever` returns at its next poll."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._remove_socket()
        threading.Thread(target=self.shutdown, name="nest-serve-stop", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._activity:  # counted as it is accepted: an idle check never stops under a waiting connection
            self._in_flight += 1
        self._pool.submit(self._answer, request, client_address)

    def _answer(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._activity:
                self._in_flight -= 1
                self._idle_since = time.monotonic()

    def service_actions(self) -> None:
        """At each poll of :meth:`serve_forever`: :meth:`follow` the files every
        :data:`FOLLOW_EVERY_S` seconds, stop once idle for ``idle_timeout_s``."""
        if time.monotonic() - self._followed_at >= FOLLOW_EVERY_S:
            self.follow()
        if self.idle_timeout_s is None or self.stopping.is_set():
            return
        with self._activity:
            idle_s = 0.0 if self._in_flight else time.monotonic() - self._idle_since
        if idle_s >= self.idle_timeout_s:
            logger.info("stopping after %.0f s without a request", idle_s)
            self.stop()

    def server_close(self) -> None:
        super().server_close()  # the listening socket
        self._pool.shutdown(wait=True)  # the answers in flight finish
        self._remove_socket()
        self._lock.close()

    def _remove_socket(self) -> None:
        """Remove the socket file if it is still this server's (not one a later server made)."""
        try:
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass


class _Handler(socketserver.StreamRequestHandler):
    """One connection: the handshake, one request, its answer."""

    timeout = REQUEST_TIMEOUT_S
    server: GenerateServer

    def handle(self) -> None:
        try:
            uid = peer_uid(self.request)
            if uid != os.geteuid():  # the socket is 0600 in a private folder: a connection of another user got past both
                logger.warning("refused a connection of another user (uid %d)", uid)
                return self._refuse("this server answers its own user only")
            self.server.follow()
            self._send(self.server.handshake())
            line = self.rfile.readline(MAX_LINE_BYTES)
            if not line:  # a client that only read the handshake
                return
            try:
                request = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
                request = None
            if not isinstance(request, dict):
                self._refuse("the request is not a JSON object (or is nested too deep to read)")
            elif request.get("op") == "stop":
                self._send({"stopping": True})
                logger.info("stopping on request")
                self.server.stop()
            elif request.get("op") == "generate":
                self._generate(request)
            else:
                self._refuse(f"unknown op {request.get('op')!r}; the server takes generate and stop")
        except OSError as err:  # the client left (or stalled past the timeout): only its answer ends
            logger.info("a client left before its answer was complete (%s); its generation is cancelled", err)

    def _generate(self, request: dict[str, Any]) -> None:
        from nest_integrations.core.config import NestConfig

        prompt, query, options = request.get("prompt"), request.get("query"), request.get("options") or {}
        if not isinstance(options, dict) or not all(isinstance(name, str) for name in options):
            return self._refuse("options must be an object of NestConfig fields")
        if unknown := sorted(set(options) - set(NestConfig.model_fields)):
            return self._refuse(f"unknown options: {', '.join(unknown)}")
        if query is not None and not isinstance(query, str):
            return self._refuse("query must be a string or null")
        started = time.perf_counter()
        chunks = self.server.decoder.stream(prompt, query=query, **options)
        try:
            for chunk in chunks:
                message: dict[str, Any] = {"text": chunk.text, "spans": [span.model_dump(mode="json") for span in chunk.spans]}
                if chunk.output is not None:
                    message["output"] = chunk.output.to_dict()
                    logger.info("answered %d tokens in %.2f s", chunk.output.stats.new_tokens, time.perf_counter() - started)
                self._send(message)
        except (TypeError, ValueError) as err:  # the prompt or the options, checked as the decoder checks them
            self._refuse(str(err))
        except OSError:
            raise
        except Exception as err:  # a failed generation ends this answer only; the client may generate itself
            logger.exception("generation failed")
            self._send({"error": f"the server failed to generate: {err}"})
        finally:
            chunks.close()  # a client gone mid-answer: its row leaves the batch at the next step

    def _send(self, message: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")
        self.wfile.flush()

    def _refuse(self, reason: str) -> None:
        self._send({"error": reason, "refused": True})


def served_index(datastore: Optional[Path], model: Optional[str], socket_path: Optional[Path], *, create: bool) -> tuple[Path, ServerIdentity, Path]:
    """The index folder, the identity and the socket of the server of ``datastore`` and ``model``
    (``socket_path`` when given, else the identity's in the run folder, checked -- and made when
    ``create`` -- by :func:`~.server_transport.private_run_folder`); the default index is built first when
    it is missing. Fails the command on an unreadable index or an untrusted run folder."""
    folder = datastore or default_index_path(model)
    if datastore is None and not (folder / "manifest.json").exists():
        build_default_index(folder, model)
    try:
        identity = server_identity(folder, model)
        if socket_path is None:
            private_run_folder(create=create)
        return folder, identity, socket_path or default_socket_path(identity)
    except ValueError as err:
        fail(str(err))


@app.command()
def serve(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    model: Optional[str] = typer.Option(None, help="LM to decode with (default: the one that built the index)."),
    socket_path: Optional[Path] = typer.Option(
        None, "--socket", help="Unix socket to listen on (default: one per index and LM under $XDG_RUNTIME_DIR/nest-integrations "
        "or ~/.cache/nest-integrations/run, where nest generate looks).",
    ),
    stop: bool = typer.Option(False, "--stop", help="Stop the server of this index and LM (or the one at --socket) instead."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="Generate one token before listening (the first answer then pays nothing lazy)."),
    idle_timeout_text: Optional[str] = typer.Option(
        None, "--idle-timeout", metavar="SECONDS",
        help="Stop after this many seconds with no request and no answer in flight (default, 0 or none: run until stopped).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Keep an index and its LM loaded and answer `nest generate` from this process, until
    Ctrl-C, SIGTERM, `nest serve --stop` or --idle-timeout."""
    if verbose:  # else keep what `nest -v` set
        setup_logging(True)
    if stop:
        _stop(socket_path or served_index(datastore, model, None, create=False)[2])
        return
    try:
        idle_timeout_s = idle_timeout(idle_timeout_text)
    except ValueError as err:
        fail(str(err))
    folder, identity, path = served_index(datastore, model, socket_path, create=True)
    try:
        lock = claim_socket(path)
    except (ServerRunning, ValueError) as err:
        fail(str(err))
    try:
        server = GenerateServer(path, load_index(folder, model), identity, folder, lock, idle_timeout_s, warmup=warmup)
    except BaseException:
        lock.close()
        raise
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    idle = f", or after {idle_timeout_s:g} s idle" if idle_timeout_s is not None else ""
    console.print(f"Serving {folder} with {server.identity.model} at {path} (stop: Ctrl-C or nest serve --stop{idle})", soft_wrap=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.stop()
        server.server_close()
    console.print("Stopped.")


def _stop(path: Path) -> None:
    """``nest serve --stop``: ask the server at ``path`` to stop and wait for its socket to go."""
    try:
        with Connection.open(path, None) as connection:
            pid = connection.handshake.get("pid")
            connection.stop()
    except NoServer as err:
        fail(str(err))
    # The server holds its lock until the answers in flight are done and its socket is gone.
    try:
        lock_fd = open_private(lock_path(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except UntrustedPath as err:
        fail(str(err))
    with os.fdopen(lock_fd, "a") as lock:
        deadline = time.monotonic() + STOP_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    fail(f"the server at {path} (process {pid}) said it stops but still runs after {STOP_WAIT_S:.0f} s")
                time.sleep(0.05)
    console.print(f"Stopped the server at {path} (process {pid}).", soft_wrap=True)
