"""Start-up of the ``nest`` command: no heavy import before a command needs it, no loading bars
without -v, the start-up trace ``nest bench startup`` reads, and the bench's report."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.cli import common
from nest_integrations.evaluation import startup_bench


def test_the_cli_imports_neither_torch_nor_transformers_until_a_command_needs_them():
    code = (
        "import sys; from typer.testing import CliRunner; from nest_integrations.cli import app; "
        "CliRunner().invoke(app, ['index', 'info', '/nonexistent']); "
        "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers', 'faiss', 'langchain_core', 'llama_index') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_command_leaves_its_objects_to_the_os_at_exit_after_the_other_atexit_handlers():
    code = (
        "import atexit, gc; from typer.testing import CliRunner; from nest_integrations.cli import app; "
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0)); "
        "print('frozen before:', gc.get_freeze_count() > 0); CliRunner().invoke(app, ['index', 'info', '/nonexistent'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["frozen before: False", "frozen at exit: True"]


def test_loading_bars_show_with_verbose_only():
    from transformers.utils import logging as hf_logging

    try:
        common.setup_logging(False)
        assert not hf_logging.is_progress_bar_enabled()
        common.setup_logging(True)
        assert hf_logging.is_progress_bar_enabled()
    finally:
        common.setup_logging(False)


def test_generate_writes_its_start_up_trace_and_the_same_answer(monkeypatch, tiny_lm, small_passages, tmp_path):
    from nest_integrations.index.nest_index import NestIndex

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    folder = NestIndex.build(small_passages, tiny_lm, show_progress=False).save(tmp_path / "index")
    run = ["generate", "Who was Marie Curie?", "-d", str(folder), "--model", "tiny", "--max-new-tokens", "6", "--json"]
    plain = CliRunner().invoke(app, run)
    trace_file = tmp_path / "trace.json"
    monkeypatch.setattr(common.trace, "path", str(trace_file))
    monkeypatch.setattr(common.trace, "phases", {})
    monkeypatch.setattr(common.trace, "marks", {})
    traced = CliRunner().invoke(app, run)
    assert plain.exit_code == traced.exit_code == 0, traced.output
    assert json.loads(plain.stdout)["text"] == json.loads(traced.stdout)["text"]
    trace = json.loads(trace_file.read_text())
    assert {"imports", "index", "lm", "generation"} <= set(trace["phases"])
    marks = trace["marks"]
    assert marks["command"] <= marks["first_token"] <= marks["end"]


def test_verbose_before_the_command_stays_on(monkeypatch, tiny_lm, small_passages, tmp_path):
    """``nest -v generate`` shows the bars as ``nest generate -v`` does (the command's own -v only adds)."""
    from transformers.utils import logging as hf_logging

    from nest_integrations.index.nest_index import NestIndex

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    folder = NestIndex.build(small_passages, tiny_lm, show_progress=False).save(tmp_path / "index")
    try:
        result = CliRunner().invoke(app, ["-v", "generate", "Who?", "-d", str(folder), "--model", "tiny", "--max-new-tokens", "2"])
        assert result.exit_code == 0, result.output
        assert hf_logging.is_progress_bar_enabled()
    finally:
        common.setup_logging(False)


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
