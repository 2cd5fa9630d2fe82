"""Start-up of the ``nest`` command: no heavy import before a command needs it, no loading bars
without -v, and the start-up trace ``nest bench startup`` reads (the bench's own report:
benchmarks/tests/test_startup_bench.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.cli import common


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
