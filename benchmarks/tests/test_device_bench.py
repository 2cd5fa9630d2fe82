"""The device bench times generate, base and nest per model and dtype, writes its table as it goes,
turns a model that fails to load into an error row, and its command refuses bad options before any work
(tiny random Llama on CPU, 12 summaries)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_benchmarks import device_bench
from nest_benchmarks.device_bench import run_device_bench
from nest_integrations.index.nest_index import NestIndex


@pytest.fixture
def tiny_loader(monkeypatch, tiny_lm):
    """``load_lm`` as the bench calls it: the tiny Llama in float32, a load error for any other dtype.
    The alpha/tau calibration is left out (the defaults apply): it is timed, not measured, here."""
    calls = []

    def load(name, *, device, dtype):
        calls.append((name, device, dtype))
        if dtype != "float32":
            raise ValueError(f"{dtype} is not supported on {device}")
        return tiny_lm

    monkeypatch.setattr(device_bench, "load_lm", load)
    monkeypatch.setattr(NestIndex, "calibration", lambda self, show_progress=True: None)
    return calls


def test_rows_rates_and_an_error_row(tmp_path, tiny_loader):
    bench = run_device_bench(
        models=("tiny",), device="cpu", dtypes=("float32", "bfloat16"), n=1, max_new_tokens=4, passages=12, out_dir=tmp_path
    )

    assert tiny_loader == [("tiny", "cpu", "float32"), ("tiny", "cpu", "bfloat16")]
    ok, failed = bench["rows"]
    assert (ok["model"], ok["dtype"], ok["failed_at"], ok["error"], ok["n"]) == ("tiny", "float32", None, None, 1)
    for contender in ("generate", "base", "nest"):
        totals = ok[contender]
        assert 1 <= totals["new_tokens"] <= 4
        assert totals["tokens_per_s"] == pytest.approx(totals["new_tokens"] / totals["wall_s"])
    assert ok["nest_vs_generate"] == pytest.approx(ok["nest"]["tokens_per_s"] / ok["generate"]["tokens_per_s"])
    assert ok["copied_share"] == (ok["items"][0]["nest"]["attribution_ratio"] > 0)
    assert ok["build_s"] > 0 and ok["precompute_tokens_per_s"] > 0
    assert ok["run"]["index"]["passages"] == 12
    assert failed == {
        "model": "tiny", "dtype": "bfloat16", "failed_at": "load", "error": "ValueError: bfloat16 is not supported on cpu"
    }

    written = json.loads((tmp_path / "device_bench.json").read_text())
    assert written["options"]["passages"] == 12 and written["environment"]["device"] == "cpu"
    assert [row["error"] for row in written["rows"]] == [None, failed["error"]]
    table = (tmp_path / "device_bench.md").read_text()
    assert "| model | dtype | load s | build s |" in table and "nest / generate" in table
    assert "| tiny | float32 |" in table and "| tiny | bfloat16 |" in table
    assert "- tiny bfloat16 (at load): ValueError: bfloat16 is not supported on cpu" in table


def test_the_command_refuses_bad_options_before_any_work(tmp_path, tiny_loader, monkeypatch):
    out = tmp_path / "out"
    runner = CliRunner()

    bad_dtype = runner.invoke(app, ["bench", "device", "--device", "cpu", "--dtypes", "float16,float8", "--out", str(out)])
    assert bad_dtype.exit_code == 2
    assert "--dtypes" in bad_dtype.output and "'float8'" in bad_dtype.output

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    no_cuda = runner.invoke(app, ["bench", "device", "--device", "cuda", "--out", str(out)])
    assert no_cuda.exit_code == 2
    assert "--device" in no_cuda.output and "CUDA is not available" in no_cuda.output.replace("\n", " ")

    assert tiny_loader == [] and not out.exists()
