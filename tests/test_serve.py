"""``nest serve`` and ``nest generate`` through it: the same output as generating here, concurrent
clients decoding in one batch, a client that leaves ending its own answer only, a stale socket
replaced, ``--server never`` generating here, a client path without torch, a server stopping
when idle, and ``nest generate`` starting one for the next command (unless told not to)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import held_back
from typer.testing import CliRunner

from conftest import make_tiny_lm
from nest_integrations.cli import app
from nest_integrations.cli import generate as generate_command
from nest_integrations.cli import server_transport
from nest_integrations.cli.common import load_index
from nest_integrations.cli.serve import GenerateServer, ServerRunning, claim_socket
from nest_integrations.cli.server_transport import Connection, NoServer, default_socket_path, idle_timeout, lock_held, server_identity

PROMPT = "Who was Marie Curie?"


@pytest.fixture
def index_folder(monkeypatch, tiny_lm, small_passages, tmp_path):
    """An index of the three small passages built with the tiny LM (keys precomputed: rows prepare
    without the LM), which every CLI load returns; sockets go to a short private folder."""
    from nest_integrations.index.nest_index import NestIndex

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    run_dir = Path(tempfile.mkdtemp(prefix="nest-run-", dir="/tmp"))  # pytest's tmp_path can outgrow a socket path
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    yield NestIndex.build(small_passages, tiny_lm, precompute_keys=True, show_progress=False).save(tmp_path / "index")
    shutil.rmtree(run_dir, ignore_errors=True)


@contextmanager
def serving(folder: Path, path: Path | None = None, idle_timeout_s: float | None = None):
    """A server of ``folder`` with the tiny LM in a thread, at ``path`` (default: where clients look)."""
    identity = server_identity(folder, "tiny")
    path = path or default_socket_path(identity)
    server = GenerateServer(path, load_index(folder, "tiny"), identity, folder, claim_socket(path), idle_timeout_s)

    def run():
        server.serve_forever(poll_interval=0.05)
        server.server_close()

    thread = threading.Thread(target=run)
    thread.start()
    server.thread = thread  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()
        thread.join(30)


def generate(folder: Path, *options: str, prompt: str = PROMPT) -> str:
    result = CliRunner().invoke(app, ["generate", prompt, "-d", str(folder), "--model", "tiny", "--max-new-tokens", "12", *options])
    assert result.exit_code == 0, result.output
    return result.stdout


def counted_streams(monkeypatch, server):
    """The server's generations: a list that gets True for each finished one, False for each cancelled one."""
    seen: list[bool] = []
    stream = server.decoder.stream

    def counting(*args, **kwargs):
        try:
            yield from stream(*args, **kwargs)
        except GeneratorExit:
            seen.append(False)
            raise
        seen.append(True)

    monkeypatch.setattr(server.decoder, "stream", counting)
    return seen


def test_a_served_answer_prints_what_the_command_prints_itself(monkeypatch, index_folder):
    local_json = json.loads(generate(index_folder, "--json", "--server", "never"))
    local_text = generate(index_folder, "--server", "never")
    with serving(index_folder) as server:
        seen = counted_streams(monkeypatch, server)
        monkeypatch.setattr(generate_command, "load_index", lambda *args, **kwargs: pytest.fail("the client loaded the index"))
        served_json = json.loads(generate(index_folder, "--json"))
        served_text = generate(index_folder)
        at_path = json.loads(generate(index_folder, "--json", "--server", str(server.path)))
    assert seen == [True, True, True]
    for served in (served_json, at_path):
        assert served["text"] == local_json["text"] and served["spans"] == local_json["spans"] and served["mode"] == "nest"
        assert served["stats"]["new_tokens"] == local_json["stats"]["new_tokens"]
    # the panel is the same; the line under it has each run's own wall times
    assert served_text.split("attribution")[0] == local_text.split("attribution")[0]


def test_concurrent_clients_decode_in_one_batch(monkeypatch, index_folder, shared_rows):
    prompts = [PROMPT, "Who was Alan Turing?"]
    decoder = load_index(index_folder, "tiny").decoder()
    expected = [decoder.generate(p, mode="nest", max_new_tokens=12).to_dict() for p in prompts]
    shared_rows.clear()
    answers: dict[int, dict] = {}
    with serving(index_folder) as server:
        identity = server.identity

        def ask(i):
            with Connection.open(server.path, identity) as connection:
                answers[i] = list(connection.generate(prompts[i], None, {"max_new_tokens": 12}))[-1]["output"]

        releaser = held_back(decoder.lm, 2)
        clients = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for client in clients:
            client.start()
        for client in clients + [releaser]:
            client.join(30)
    assert max(shared_rows) == 2
    for i, want in enumerate(expected):
        assert (answers[i]["text"], answers[i]["spans"]) == (want["text"], want["spans"])


def test_a_client_that_leaves_cancels_its_answer_only(monkeypatch, index_folder):
    local = json.loads(generate(index_folder, "--json", "--server", "never"))
    with serving(index_folder) as server:
        seen = counted_streams(monkeypatch, server)
        leaving = Connection.open(server.path, server.identity)
        answer = leaving.generate("Tell me everything about Alan Turing.", None, {"mode": "base", "max_new_tokens": 400})
        next(answer)  # its first chunk, then it goes
        leaving.close()
        served = json.loads(generate(index_folder, "--json"))
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert (served["text"], served["spans"]) == (local["text"], local["spans"])
    assert sorted(seen) == [False, True]  # the one that left was cancelled, the other finished


def test_a_stale_socket_is_replaced_and_a_live_one_is_not(index_folder):
    path = default_socket_path(server_identity(index_folder, "tiny"))
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a socket file whose server is gone
    stale.close()
    with pytest.raises(NoServer):
        Connection.open(path, None)
    assert json.loads(generate(index_folder, "--json"))["text"]  # auto: generated here
    with serving(index_folder) as server:
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        with pytest.raises(ServerRunning):
            claim_socket(path)
        assert Connection.open(path, server.identity).handshake["pid"] == os.getpid()
        stopped = CliRunner().invoke(app, ["serve", "-d", str(index_folder), "--model", "tiny", "--stop"])
        assert stopped.exit_code == 0, stopped.output
    assert not path.exists()
    claim_socket(path).close()  # free again


def test_server_never_generates_here_and_a_named_socket_must_answer(monkeypatch, index_folder):
    with serving(index_folder) as server:
        seen = counted_streams(monkeypatch, server)
        assert json.loads(generate(index_folder, "--json", "--server", "never"))["text"]
        other_lm = CliRunner().invoke(app, ["generate", PROMPT, "-d", str(index_folder), "--model", "other", "--json"])
        assert other_lm.exit_code == 0, other_lm.output  # the tiny LM again (load_lm is patched), generated here
        named = CliRunner().invoke(app, ["generate", PROMPT, "-d", str(index_folder), "--model", "other", "--server", str(server.path)])
        assert named.exit_code == 2 and "serves another LM" in " ".join(named.output.split())
        assert seen == []
    missing = CliRunner().invoke(app, ["generate", PROMPT, "-d", str(index_folder), "--model", "tiny", "--server", str(server.path)])
    assert missing.exit_code == 2 and "no server answers" in " ".join(missing.output.split())


def test_the_client_path_imports_neither_torch_nor_transformers(index_folder):
    script = (
        "import sys, atexit\n"
        "atexit.register(lambda: sys.stderr.write('HEAVY:' + ','.join(m for m in ('torch', 'transformers') if m in sys.modules) + '\\n'))\n"
        "from nest_integrations.cli import main\n"
        f"sys.argv = ['nest', 'generate', {PROMPT!r}, '-d', {str(index_folder)!r}, '--model', 'tiny', '--max-new-tokens', '4', '--json']\n"
        "main()\n"
    )
    with serving(index_folder):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["new_tokens"] == 4
    assert "HEAVY:\n" in done.stderr


def test_a_server_stops_itself_when_idle_and_not_before(index_folder):
    assert [idle_timeout(value) for value in (None, "none", "0", "2.5")] == [None, None, None, 2.5]
    for wrong in ("-1", "soon", "inf"):
        with pytest.raises(ValueError):
            idle_timeout(wrong)
    refused = CliRunner().invoke(app, ["serve", "-d", str(index_folder), "--model", "tiny", "--idle-timeout", "soon"])
    assert refused.exit_code == 2 and "neither a number" in refused.output
    with serving(index_folder, idle_timeout_s=0.5) as server:
        time.sleep(0.3)
        assert json.loads(generate(index_folder, "--json"))["text"]  # served: the idle time starts again
        time.sleep(0.3)
        assert server.path.exists() and not server.stopping.is_set()
        server.thread.join(10)
        assert not server.thread.is_alive()
    assert not server.path.exists() and not lock_held(server.path)


def test_generate_starts_a_server_for_the_next_command_unless_told_not_to(monkeypatch, index_folder):
    started: list[list[str]] = []
    monkeypatch.setattr(server_transport.subprocess, "Popen", lambda command, **kwargs: started.append(command))
    path = default_socket_path(server_identity(index_folder, "tiny"))

    def run(*options: str):
        result = CliRunner().invoke(app, ["generate", PROMPT, "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "4", "--json", *options])
        assert result.exit_code == 0, result.output
        return result.stderr

    assert os.environ["NEST_AUTO_SERVE"] == "0"  # conftest: no test starts one unless it asks
    assert "a server now keeps" not in run() and started == []
    monkeypatch.setenv("NEST_AUTO_SERVE", "1")
    assert "a server now keeps" not in run("--server", "never") and started == []
    with claim_socket(path):  # a server loading (or running) holds the lock: no second one
        assert "a server now keeps" not in run() and started == []
    monkeypatch.setenv("NEST_SERVE_IDLE_S", "30")
    said = " ".join(run().split())
    assert f"stops after 30 s idle; `nest serve --stop -d {index_folder} --model tiny` stops it now" in said
    command = started.pop()
    assert command[-7:] == ["serve", "--datastore", str(index_folder.resolve()), "--model", "tiny", "--idle-timeout", "30"]
    assert started == []


@pytest.fixture
def path_index(smol_tokenizer, small_passages, tmp_path, monkeypatch):
    """An index built with the tiny LM saved to a folder (so a fresh ``nest`` process can load it by
    its path), and a short private folder for sockets, set for the subprocesses too."""
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.model.lm import load_lm

    model = tmp_path / "tiny-llama"
    make_tiny_lm(smol_tokenizer).model.save_pretrained(model)
    smol_tokenizer.save_pretrained(model)
    run_dir = Path(tempfile.mkdtemp(prefix="nest-run-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    lm = load_lm(str(model), device="cpu")
    folder = NestIndex.build(small_passages, lm, precompute_keys=True, retriever_kind="bm25", show_progress=False).save(tmp_path / "index")
    yield folder, str(model)
    shutil.rmtree(run_dir, ignore_errors=True)


def test_an_auto_started_server_answers_the_next_command_then_stops_when_idle(path_index):
    folder, model = path_index
    env = {**os.environ, "NEST_AUTO_SERVE": "1", "NEST_SERVE_IDLE_S": "3", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "nest_integrations.cli", "generate", PROMPT, "-d", str(folder), "--model", model, "--max-new-tokens", "4", "--json"]
    pid = None
    try:
        first = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert first.returncode == 0, first.stderr
        assert "a server now keeps this index loaded" in first.stderr
        identity = server_identity(folder, model)  # after the first command, which calibrated the index
        path = default_socket_path(identity)
        deadline = time.monotonic() + 90
        while pid is None:
            try:
                with Connection.open(path, identity) as connection:
                    pid = connection.handshake["pid"]
            except NoServer:
                assert time.monotonic() < deadline, (path.with_name(path.name.removesuffix(".sock") + ".log")).read_text()
                time.sleep(0.2)
        process = Path(f"/proc/{pid}")
        if process.is_dir():  # Linux: what `ps` shows of the background server
            assert (process / "comm").read_text().strip() == "nest"
            assert " nest serve --datastore " in (process / "cmdline").read_bytes().decode().replace("\0", " ").replace("/nest ", " nest ")
        second = subprocess.run([*command, "-v"], capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 0, second.stderr
        assert f"answered by the server at {path} (process {pid})" in second.stderr
        assert "a server now keeps" not in second.stderr
        assert json.loads(second.stdout)["text"] == json.loads(first.stdout)["text"]
        deadline = time.monotonic() + 30
        while lock_held(path) and time.monotonic() < deadline:  # 3 s idle, then it lets go of socket and lock
            time.sleep(0.1)
        assert not lock_held(path) and not path.exists()
        pid = None
    finally:
        if pid is not None:  # a failed check: leave no server behind
            os.kill(pid, signal.SIGTERM)
