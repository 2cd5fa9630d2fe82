"""``nest bench startup``'s report: cold, warm and served runs of ``nest generate``, each a
subprocess here replaced by one that writes the start-up trace a real run would."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest

from nest_benchmarks import startup_bench


def test_the_bench_reports_cold_and_warm_runs(monkeypatch, tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text("{}")
    seen = []

    def fake_run(command, env, capture_output, text):
        seen.append((command, env["NEST_CACHE_DIR"]))
        trace = {"phases": {"imports": 1.0, "lm": 0.5, "embedder": 0.4, "index": 0.2, "generation": 0.9},
                 "marks": {"command": 0.2, "first_token": 2.5 if len(seen) > 1 else 9.0, "end": 3.0}}
        with open(env["TRACE"], "w") as handle:
            json.dump(trace, handle)
        return SimpleNamespace(returncode=0, stdout='{"text": "same"}\n', stderr="")

    monkeypatch.setattr(startup_bench.subprocess, "run", fake_run)
    bench = startup_bench.run_startup_bench(
        prompt="Who?", runs=2, out_dir=tmp_path / "out", index_folder=index, trace_variables=("TRACE", "T0"),
    )
    assert [r["run"] for r in bench["runs"]] == ["cold", "warm 1", "warm 2"]
    assert len({cache for _, cache in seen}) == 1 and "--datastore" in seen[0][0]
    assert bench["warm_median"]["first_token"] == 2.5 and bench["goal"]["met"] and bench["texts_equal"]
    assert all(run["exit"] is not None for run in bench["runs"])  # the time from the "end" mark to the exit
    table = (tmp_path / "out" / "startup.md").read_text()
    assert "| cold |" in table and "| warm median |" in table and "met" in table


def test_a_phase_no_run_had_is_a_dash(monkeypatch, tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text("{}")

    def fake_run(command, env, capture_output, text):
        with open(env["TRACE"], "w") as handle:  # an index without the bundled embedder, an answer without text
            json.dump({"phases": {"imports": 1.0, "lm": 0.5, "index": 0.2}, "marks": {"command": 0.2}}, handle)
        return SimpleNamespace(returncode=0, stdout='{"text": ""}\n', stderr="")

    monkeypatch.setattr(startup_bench.subprocess, "run", fake_run)
    bench = startup_bench.run_startup_bench(
        prompt="Who?", runs=1, cold=False, out_dir=tmp_path / "out", index_folder=index, trace_variables=("TRACE", "T0"),
    )
    assert [r["run"] for r in bench["runs"]] == ["warm 1"]
    assert bench["warm_median"]["embedder"] is None and not bench["goal"]["met"]
    assert "| warm median | 0.200 | 1.000 | 0.500 | – |" in (tmp_path / "out" / "startup.md").read_text()


def test_the_bench_needs_an_index(tmp_path):
    with pytest.raises(ValueError, match="no index"):
        startup_bench.run_startup_bench(prompt="Who?", out_dir=tmp_path / "out", index_folder=tmp_path, trace_variables=("A", "B"))


def test_the_startup_bench_times_served_runs_beside_warm_ones(monkeypatch, tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text("{}")
    commands = []

    def fake_run(command, env, capture_output, text):
        commands.append(command)
        served = command[-2:] != ["--server", "never"]
        with open(env["TRACE"], "w") as handle:
            json.dump({"phases": {} if served else {"imports": 5.0}, "marks": {"command": 0.3, "first_token": 1.0 if served else 8.0, "end": 1.2}}, handle)
        return SimpleNamespace(returncode=0, stdout='{"text": "same"}\n', stderr="")

    class FakeServer:  # listens where it is told, as nest serve does
        def __init__(self, command, env, stdout, stderr, text):
            self.command, self.signals = command, []
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(command[command.index("--socket") + 1])
            self.listener.listen()

        def poll(self):
            return None

        def send_signal(self, signum):
            self.signals.append(signum)
            self.listener.close()

        def communicate(self, timeout=None):
            return "", ""

    monkeypatch.setattr(startup_bench.subprocess, "run", fake_run)
    monkeypatch.setattr(startup_bench.subprocess, "Popen", FakeServer)
    bench = startup_bench.run_startup_bench(
        prompt="Who?", runs=2, cold=False, served=True, out_dir=tmp_path / "out", index_folder=index, trace_variables=("TRACE", "T0"),
    )
    assert [r["run"] for r in bench["runs"]] == ["warm 1", "warm 2", "served 1", "served 2"]
    assert commands[-1][-2] == "--server" and commands[-1][-1].endswith("serve.sock")
    assert bench["served"]["median"]["first_token"] == 1.0 and bench["served"]["speedup"] == 8.0
    assert bench["goal"]["served_met"] and not bench["goal"]["met"]
    table = (tmp_path / "out" / "startup.md").read_text()
    assert "| served median | 0.300 | – |" in table and "Served first token <= 3.0 s: met" in table
