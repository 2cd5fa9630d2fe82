"""``nest bench`` as subcommands: each bench its own command, its options after it; ``nest bench``
alone lists them; the spellings of 0.1 (removed in 0.2.0) fail naming what is unknown; and
``nest eval`` and ``nest bench`` without the benchmarks project they run."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.cli import bench as bench_cli

SUBCOMMANDS = ("speed", "batching", "scale", "ray", "keys", "store", "gate", "device", "startup")


def test_every_bench_is_a_subcommand():
    listed = CliRunner().invoke(app, ["bench", "--help"]).output
    assert all(f" {name} " in listed for name in SUBCOMMANDS)
    top = CliRunner().invoke(app, ["--help"]).output
    assert " bench " in top and "bench-" not in top


def test_bench_alone_lists_the_subcommands_and_runs_none(monkeypatch):
    monkeypatch.setattr(bench_cli, "run_speed", lambda *args: pytest.fail("plain `nest bench` ran the speed bench"))
    result = CliRunner().invoke(app, ["bench"])
    assert result.exit_code == 2
    assert all(f" {name} " in result.output for name in SUBCOMMANDS)


@pytest.mark.parametrize(
    "old, unknown",
    [
        (["bench", "--batching", "--repeats", "2"], "No such option: --batching"),
        (["bench", "--scale", "--sizes", "100,200"], "No such option: --scale"),
        (["bench", "--n", "3", "speed"], "No such option: --n"),
        (["bench-gate", "--n", "5"], "No such command 'bench-gate'"),
        (["bench-ray"], "No such command 'bench-ray'"),
    ],
    ids=["--batching", "--scale", "option before the subcommand", "bench-gate", "bench-ray"],
)
def test_the_spellings_of_0_1_fail_naming_what_is_unknown(monkeypatch, old, unknown):
    for runner in ("run_speed", "run_batching", "run_scale"):
        monkeypatch.setattr(bench_cli, runner, lambda *args: pytest.fail("a removed spelling ran a bench"))
    result = CliRunner().invoke(app, old)
    assert result.exit_code == 2
    assert unknown in " ".join(result.output.split()), result.output


def test_a_subcommand_runs_with_its_defaults(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_cli, "run_batching", lambda *args: calls.append(args))
    result = CliRunner().invoke(app, ["bench", "batching", "--repeats", "2"])
    assert result.exit_code == 0, result.output
    assert calls[0][1:6:4] == (16, 2)  # n, repeats


def test_a_subcommand_passes_its_options_to_its_bench(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("nest_benchmarks.gate_bench.gate_report", lambda index, **kw: calls.append(kw))
    monkeypatch.setattr(bench_cli, "load_index", lambda datastore: "index")
    out = tmp_path / "gate"
    out.mkdir()
    (out / "gate.md").write_text("gate table")
    result = CliRunner().invoke(app, ["bench", "gate", "--n", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert calls == [{"n": 5, "seed": 1, "k": 8, "out_dir": out}] and "gate table" in result.stdout


@pytest.mark.parametrize(
    "argv", [["eval", "--task", "bio"], ["bench", "gate", "--n", "5"], ["bench", "speed"]],
    ids=["eval", "bench gate", "bench speed"],
)
def test_without_the_benchmarks_project_a_command_names_its_install_command_in_one_line(monkeypatch, argv):
    monkeypatch.setitem(sys.modules, "nest_benchmarks", None)  # what find_spec sees when it is not installed
    monkeypatch.setattr(bench_cli, "load_index", lambda *args: pytest.fail("a bench ran without its project"))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "pip install -e benchmarks" in result.stderr, result.stderr
    assert f"`nest {argv[0]}` runs the benchmarks project" in result.stderr and "Traceback" not in result.stderr
