"""What a ``nest generate`` client trusts of a ``nest serve``: only a server of its own user, in a
run folder nobody else can write, serving the index, LM files and calibration the client would
load itself; never a read without a deadline; never a log or lock reached through a link. And
what a server does when its files change under it, or a request is nested too deep to read."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from test_serve import PROMPT, generate, index_folder, serving  # noqa: F401 (index_folder: a fixture)
from typer.testing import CliRunner

from conftest import make_tiny_lm
from nest_integrations.cli import app
from nest_integrations.cli import server_transport
from nest_integrations.cli.server_transport import (
    Connection, NoServer, UntrustedPath, default_socket_path, log_path, private_run_folder, server_identity, start_server,
)

OTHER_UID = 65534
"""The user a second local user's process runs as (``nobody``), when the tests run as root."""

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a process of a second local user needs root to start")


def invoke(*args: str, timeout_s: float = 60.0):
    """``nest ARGS`` in this process, in a thread joined within ``timeout_s`` (a client that
    waited forever fails the test instead of hanging it)."""
    results = []
    runner = threading.Thread(target=lambda: results.append(CliRunner().invoke(app, list(args))), daemon=True)
    runner.start()
    runner.join(timeout_s)
    assert results, f"nest {' '.join(args)} still ran after {timeout_s:g} s"
    return results[0]


def as_other_user(work) -> str:
    """Run ``work()`` in a forked child as :data:`OTHER_UID` and return what it returned (a
    string), or the error it raised; the child never returns into the test."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        try:
            os.close(read_end)
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            said = str(work())
        except BaseException as err:  # noqa: BLE001 -- reported to the parent, whatever it is
            said = f"error: {err!r}"
        os.write(write_end, said.encode("utf-8", "replace"))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reading:
        said = reading.read().decode("utf-8")
    os.waitpid(pid, 0)
    return said


# ---------------------------------------------------------------- the LM a client would load


@pytest.fixture
def two_lm_folders(smol_tokenizer, small_passages, tmp_path, monkeypatch):
    """Two working directories, ``a`` and ``b``, each with an LM folder ``lm`` (different random
    weights), and an index built with ``a/lm``; sockets in a short private folder."""
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.model.lm import load_lm

    for name, seed in (("a", 0), ("b", 1)):
        folder = tmp_path / name / "lm"
        make_tiny_lm(smol_tokenizer, seed=seed).model.save_pretrained(folder)
        smol_tokenizer.save_pretrained(folder)
    run_dir = Path(tempfile.mkdtemp(prefix="nest-run-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    lm = load_lm(str(tmp_path / "a" / "lm"), device="cpu")
    index = NestIndex.build(small_passages, lm, precompute_keys=True, retriever_kind="bm25", show_progress=False).save(tmp_path / "index")
    yield tmp_path, index
    shutil.rmtree(run_dir, ignore_errors=True)


def test_a_client_reaches_only_a_server_of_the_lm_it_would_load(monkeypatch, two_lm_folders):
    from nest_integrations.cli.common import load_index
    from nest_integrations.cli.serve import GenerateServer, claim_socket

    root, index = two_lm_folders
    monkeypatch.chdir(root / "a")
    identity = server_identity(index, "lm")
    assert identity.lm_path == str(root / "a" / "lm") and identity.lm_files
    path = default_socket_path(identity)
    server = GenerateServer(path, load_index(index, "lm"), identity, index, claim_socket(path))
    thread = threading.Thread(target=lambda: (server.serve_forever(poll_interval=0.05), server.server_close()))
    thread.start()
    try:
        ask = ["generate", PROMPT, "-d", str(index), "--model", "lm", "--max-new-tokens", "4", "--json", "-v"]
        served = invoke(*ask)  # from a: a's LM, served
        assert served.exit_code == 0 and f"answered by the server at {path}" in served.stderr, served.output
        monkeypatch.chdir(root / "b")  # `lm` here is another model, which the index refuses
        refused = invoke(*ask)
        assert refused.exit_code == 2 and "was built with LM" in " ".join(refused.output.split()), refused.output
        named = invoke(*ask, "--server", str(path))
        assert named.exit_code == 2 and "serves another LM" in " ".join(named.output.split()), named.output
        monkeypatch.chdir(root / "a")
        shutil.rmtree(root / "a" / "lm")  # the LM folder replaced in place by b's model
        shutil.copytree(root / "b" / "lm", root / "a" / "lm")
        replaced = invoke(*ask)
        assert replaced.exit_code == 2 and "was built with LM" in " ".join(replaced.output.split()), replaced.output
        assert "answered by the server" not in refused.output + named.output + replaced.output
        thread.join(10)  # the server saw its LM's files change: it stopped by itself
        assert not thread.is_alive() and not path.exists()
    finally:
        server.stop()
        thread.join(30)


def write_calibration(folder: Path, lm, alpha: float) -> None:
    """An index's ``calibration.json`` giving ``lm`` this alpha (tau 0.01: the mixture all LM or all retrieval)."""
    from nest_integrations.policy.calibration import Calibration, CalibrationFile

    fitted = Calibration(
        lm_name=lm.name, lm_fingerprint=lm.fingerprint(), alpha=alpha, tau=0.01, separating_alpha=alpha, balanced_accuracy=0.9,
        known_ratio_quantiles={}, unknown_ratio_quantiles={}, passages=4, tokens=32, seconds=1.0,
    )
    CalibrationFile(calibrations={lm.fingerprint(): fitted}).write(folder)


def test_a_server_follows_a_recalibration_of_its_index(index_folder, tiny_lm):
    answers = {}
    write_calibration(index_folder, tiny_lm, alpha=0.99)
    with serving(index_folder):
        for alpha in (0.99, 0.01):
            write_calibration(index_folder, tiny_lm, alpha=alpha)
            ask = ("--json", "--max-new-tokens", "24")  # a prompt the mixture's alpha decides, on the tiny LM
            local = json.loads(generate(index_folder, *ask, "--server", "never", prompt="Marie Curie was born in"))
            served = json.loads(generate(index_folder, *ask, prompt="Marie Curie was born in"))
            answers[alpha] = (local["text"], local["spans"])
            assert (served["text"], served["spans"]) == answers[alpha], f"alpha {alpha}: the server answered with another calibration"
    assert answers[0.99] != answers[0.01]  # the two calibrations answer differently


# ---------------------------------------------------------------- deadlines


def test_a_client_gives_up_on_a_server_that_stalls_mid_answer(monkeypatch, index_folder):
    local = json.loads(generate(index_folder, "--json", "--server", "never"))
    monkeypatch.setattr(server_transport, "ANSWER_TIMEOUT_S", 0.5)
    stalled = threading.Event()
    with serving(index_folder) as server:
        stream = server.decoder.stream

        def stalling(*args, **kwargs):  # one chunk, then frozen
            chunks = stream(*args, **kwargs)
            yield next(chunks)
            stalled.wait(30)
            yield from chunks

        monkeypatch.setattr(server.decoder, "stream", stalling)
        try:
            result = invoke("generate", PROMPT, "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "12", "--json", timeout_s=30)
        finally:
            stalled.set()
    assert result.exit_code == 0, result.output
    assert "the server sent nothing for 0.5 s" in result.stderr and "generating here" in result.stderr
    assert json.loads(result.stdout)["text"] == local["text"]


# ---------------------------------------------------------------- the run folder and its files


def test_a_run_folder_another_user_made_or_can_write_is_not_used(monkeypatch, index_folder):
    monkeypatch.setenv("NEST_AUTO_SERVE", "1")
    monkeypatch.setattr(server_transport.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("a server was started"))
    with serving(index_folder) as server:  # listening at the default path, then the folder opened to others
        run = server.path.parent
        os.chmod(run, 0o777)
        if os.geteuid() == 0:
            os.chown(run, OTHER_UID, OTHER_UID)  # as another user who made run/ first would leave it
        result = invoke("generate", PROMPT, "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "4", "--json", "-v")
        assert result.exit_code == 0, result.output
        said = " ".join(result.stderr.split())
        assert f"not using the server at {server.path}" in said and ("writable by group or others" in said or "another user" in said)
        assert "a server now keeps" not in said and "could not start a server" in said
        assert "answered by the server" not in said  # generated here
        with pytest.raises(UntrustedPath):
            private_run_folder(create=True)
        refused = invoke("serve", "-d", str(index_folder), "--model", "tiny")
        assert refused.exit_code == 2 and "nest serves and reads nothing there" in " ".join(refused.output.split())
        os.chown(run, os.geteuid(), os.getegid())
        os.chmod(run, 0o700)


@as_root
def test_a_socket_of_another_user_is_not_answered_by(index_folder, tmp_path):
    """A second local user listening at a path the command is given: refused on the peer's uid,
    whatever its handshake says."""
    identity = server_identity(index_folder, "tiny")
    handshake = {
        "protocol": server_transport.PROTOCOL_VERSION, "index": identity.index, "model": identity.model, "lm_path": identity.lm_path,
        "lm_files": identity.lm_files, "lm_fingerprint": identity.lm_fingerprint, "calibration": identity.calibration,
        "folder": str(index_folder), "pid": 1,
    }
    forged = {"text": "forged", "spans": [], "output": {"text": "forged"}}
    shared = Path(tempfile.mkdtemp(prefix="nest-shared-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    path = shared / "nest.sock"
    ready_read, ready_write = os.pipe()

    def plant():  # as the other user: listen, answer one connection with a forged handshake and answer
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(path))
            os.chmod(path, 0o777)
            listener.listen()
            os.write(ready_write, b"x")
            listener.settimeout(20)
            connection, _ = listener.accept()
            with connection:
                connection.sendall((json.dumps(handshake) + "\n").encode())
                connection.settimeout(5)
                try:
                    connection.recv(1 << 16)
                    connection.sendall((json.dumps(forged) + "\n").encode())
                except OSError:
                    pass
        return "served"

    planting = threading.Thread(target=lambda: as_other_user(plant))
    planting.start()
    try:
        assert os.read(ready_read, 1) == b"x"
        result = invoke("generate", PROMPT, "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "4", "--json", "--server", str(path))
        assert result.exit_code == 2 and f"runs as another user (uid {OTHER_UID})" in " ".join(result.output.split()), result.output
        assert "forged" not in result.output
    finally:
        planting.join(30)
        os.close(ready_read)
        os.close(ready_write)
        shutil.rmtree(shared, ignore_errors=True)


@as_root
def test_a_server_answers_its_own_user_only(index_folder):
    with serving(index_folder) as server:
        for folder in (server.path.parent, server.path.parent.parent):  # as if the folders and the socket were opened to others
            os.chmod(folder, 0o755)
        os.chmod(server.path, 0o777)

        def ask():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(server.path))
                return sock.makefile("rb").readline().decode()

        said = json.loads(as_other_user(ask))
    assert said.get("refused") and "its own user only" in said["error"] and "index" not in said


def test_the_server_log_is_private_appended_and_never_reached_through_a_link(monkeypatch, index_folder, tmp_path):
    started = []
    monkeypatch.setattr(server_transport.subprocess, "Popen", lambda command, **kwargs: started.append(command))
    identity = server_identity(index_folder, "tiny")
    log = log_path(default_socket_path(identity))
    private_run_folder(create=True)
    victim = tmp_path / "notes.txt"
    victim.write_text("the user's own notes\n")
    log.symlink_to(victim)  # planted where the log is opened
    with pytest.raises(UntrustedPath, match="symbolic link"):
        start_server(index_folder, "tiny", 60)
    assert victim.read_text() == "the user's own notes\n" and started == []
    log.unlink()
    assert start_server(index_folder, "tiny", 60) == log and len(started) == 1
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    with log.open("a") as first_server:
        first_server.write("Serving the index (the first server's line)\n")
    start_server(index_folder, "tiny", 60)  # a second command that checked the lock at the same moment
    assert "the first server's line" in log.read_text() and len(started) == 2


def test_a_socket_path_over_the_limit_starts_and_announces_no_server(monkeypatch, index_folder, tmp_path):
    started = []
    monkeypatch.setattr(server_transport.subprocess, "Popen", lambda command, **kwargs: started.append(command))
    monkeypatch.setenv("NEST_AUTO_SERVE", "1")
    deep = tmp_path / ("r" * 60) / ("u" * 60)
    deep.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    result = invoke("generate", PROMPT, "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "4", "--json")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "a server now keeps" not in said and "longer than a Unix socket allows" in said
    assert started == []
    refused = invoke("serve", "-d", str(index_folder), "--model", "tiny")
    assert refused.exit_code == 2 and "longer than a Unix socket allows" in " ".join(refused.output.split())


# ---------------------------------------------------------------- malformed requests


def test_a_request_nested_too_deep_gets_an_error_reply(index_folder):
    with serving(index_folder) as server:
        for request in ("[" * 100_000 + "]" * 100_000, '{"op": "generate", "prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(server.path))
                reader = sock.makefile("rb")
                assert json.loads(reader.readline())["protocol"] == server_transport.PROTOCOL_VERSION
                sock.sendall(request.encode() + b"\n")
                reply = json.loads(reader.readline() or "null")
            assert reply and reply.get("refused") and "nested too deep" in reply["error"]
        with Connection.open(server.path, server.identity) as connection:  # still answering
            assert list(connection.generate(PROMPT, None, {"max_new_tokens": 4}))[-1]["output"]["text"] is not None


def test_a_connection_refuses_a_server_it_cannot_vouch_for(monkeypatch, index_folder):
    """The handshake of a server of this user is checked field by field (a unit view of the cases above)."""
    with serving(index_folder) as server:
        identity = server.identity
        with Connection.open(server.path, identity) as connection:
            assert connection.handshake["lm_fingerprint"] == identity.lm_fingerprint
        for field, value in (("index", "0" * 64), ("lm_path", "/elsewhere"), ("lm_files", "changed"), ("calibration", "other")):
            with pytest.raises(NoServer, match="serves "):
                Connection.open(server.path, replace(identity, **{field: value}))
        monkeypatch.setattr(server_transport, "peer_uid", lambda sock: OTHER_UID)
        with pytest.raises(NoServer, match="runs as another user"):
            Connection.open(server.path, identity)
