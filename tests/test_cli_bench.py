"""``nest bench`` as subcommands: each bench its own command, the spellings of the last release
hidden and deprecated but running the new command, and options of a subcommand after it; and
``nest eval`` and ``nest bench`` without the benchmarks project they run."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.cli import bench as bench_cli

SUBCOMMANDS = ("speed", "batching", "scale", "ray", "keys", "store", "gate", "device", "startup")


def test_every_bench_is_a_subcommand_and_the_old_spellings_are_hidden():
    listed = CliRunner().invoke(app, ["bench", "--help"]).output
    assert all(f" {name} " in listed for name in SUBCOMMANDS)
    assert "--batching" not in listed and "--scale" not in listed
    top = CliRunner().invoke(app, ["--help"]).output
    assert " bench " in top and "bench-" not in top


@pytest.mark.parametrize(
    "old, runner, expected",
    [
        (["bench"], "run_speed", {"n": 8, "max_new_tokens": 64}),
        (["bench", "--n", "3", "--sweep", "gamma", "--values", "0.1"], "run_speed", {"n": 3, "sweep": "gamma"}),
        (["bench", "--batching", "--repeats", "2"], "run_batching", {"n": 16, "repeats": 2}),
        (["bench", "--scale", "--sizes", "100,200"], "run_scale", {"n": 3, "max_new_tokens": 32, "sizes": "100,200"}),
    ],
)
def test_the_old_bench_flags_warn_and_run_the_new_subcommand(monkeypatch, old, runner, expected):
    calls = []
    names = {"run_speed": ("datastore", "n", "max_new_tokens", "out", "sweep", "values"),
             "run_batching": ("datastore", "n", "max_new_tokens", "out", "seed", "repeats", "kinds"),
             "run_scale": ("n", "max_new_tokens", "out", "sizes", "scale_indexes", "hnsw_max")}[runner]
    monkeypatch.setattr(bench_cli, runner, lambda *args: calls.append(dict(zip(names, args))))
    result = CliRunner().invoke(app, old)
    assert result.exit_code == 0, result.output
    assert "deprecated" in result.stderr and "nest bench " in result.stderr
    assert len(calls) == 1 and expected.items() <= calls[0].items()


def test_the_new_subcommands_give_the_same_defaults_without_a_warning(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_cli, "run_batching", lambda *args: calls.append(args))
    result = CliRunner().invoke(app, ["bench", "batching", "--repeats", "2"])
    assert result.exit_code == 0 and "deprecated" not in result.output
    assert calls[0][1:6:4] == (16, 2)  # n, repeats


def test_an_old_bench_command_warns_and_runs_the_subcommand(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("nest_benchmarks.gate_bench.gate_report", lambda index, **kw: calls.append(kw))
    monkeypatch.setattr(bench_cli, "load_index", lambda datastore: "index")
    out = tmp_path / "gate"
    out.mkdir()
    (out / "gate.md").write_text("gate table")
    result = CliRunner().invoke(app, ["bench-gate", "--n", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "`nest bench-gate` is deprecated" in result.stderr.replace("\n", " ") and "nest bench gate" in result.stderr
    assert calls == [{"n": 5, "seed": 1, "k": 8, "out_dir": out}] and "gate table" in result.stdout


def test_options_before_the_subcommand_are_refused():
    result = CliRunner().invoke(app, ["bench", "--n", "3", "speed"])
    assert result.exit_code == 2 and "options go after the subcommand" in result.output


def test_scale_refuses_the_options_of_the_other_benches_in_the_old_spelling():
    result = CliRunner().invoke(app, ["bench", "--scale", "--batching"])
    assert result.exit_code == 2 and "do not apply with --scale" in result.output


@pytest.mark.parametrize(
    "argv", [["eval", "--task", "bio"], ["bench", "gate", "--n", "5"], ["bench", "--scale"], ["bench-gate", "--n", "5"]],
    ids=["eval", "bench gate", "old bench --scale", "old bench-gate"],
)
def test_without_the_benchmarks_project_a_command_names_its_install_command_in_one_line(monkeypatch, argv):
    monkeypatch.setitem(sys.modules, "nest_benchmarks", None)  # what find_spec sees when it is not installed
    monkeypatch.setattr(bench_cli, "load_index", lambda *args: pytest.fail("a bench ran without its project"))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "pip install -e benchmarks" in result.stderr, result.stderr
    assert f"`nest {argv[0]}` runs the benchmarks project" in result.stderr and "Traceback" not in result.stderr
