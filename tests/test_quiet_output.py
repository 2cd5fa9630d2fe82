"""What a user sees in a terminal: one progress bar per phase they asked for, each with an estimate,
and none of the libraries' own loading bars; the background server named ``nest`` in ``ps``;
``nest retrieve`` readable at 80 columns."""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import make_tiny_lm
from nest_integrations.cli import app
from nest_integrations.cli import index as index_command
from nest_integrations.cli.server_transport import server_command
from nest_integrations.corpus.passages import Passage
from nest_integrations.index.nest_index import NestIndex
from nest_integrations.model.lm import load_lm

LIBRARY_BARS = ("Loading weights", "Writing model shards", "de-quantizing GGUF", "Fetching")

SENTENCE = "The keeper of the Brannock light logged every ship that passed the northern cape in the long winter of 1893. "


def test_loading_a_model_draws_none_of_the_libraries_bars_and_leaves_their_switches_as_they_were(smol_tokenizer, tmp_path, capfd):
    import transformers.utils.logging as transformers_logging
    from huggingface_hub.utils import are_progress_bars_disabled

    folder = tmp_path / "tiny-llama"
    make_tiny_lm(smol_tokenizer).model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    capfd.readouterr()
    before = (transformers_logging.is_progress_bar_enabled(), are_progress_bars_disabled())
    lm = load_lm(str(folder), device="cpu")
    printed = capfd.readouterr()
    assert lm.model.config.hidden_size == 64
    assert not any(bar in printed.err + printed.out for bar in LIBRARY_BARS), printed.err
    assert (transformers_logging.is_progress_bar_enabled(), are_progress_bars_disabled()) == before


def test_building_an_index_shows_one_bar_per_phase_each_with_an_estimate(tiny_lm, tmp_path, monkeypatch, capfd):
    docs = tmp_path / "docs"
    docs.mkdir()
    for n in range(6):
        (docs / f"log{n}.txt").write_text(f"Entry {n}. " + SENTENCE * 3, encoding="utf-8")
    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    result = CliRunner().invoke(app, ["index", "build", str(docs), "--out", str(tmp_path / "index")])
    assert result.exit_code == 0, result.output
    printed = capfd.readouterr()
    shown = result.output + result.stderr + printed.err + printed.out
    for phase in ("Embedding passages", "Encoding datastore", "Calibrating tiny-llama-0"):
        lines = [line for line in re.split(r"[\r\n]", shown) if line.startswith(phase)]
        assert lines, f"no bar for {phase}: {shown}"
        assert any(re.search(r"<\d\d:\d\d", line) for line in lines), f"{phase}'s bar gives no estimate: {lines}"
    assert not any(bar in shown for bar in LIBRARY_BARS), shown


def test_the_background_server_runs_as_nest_serve():
    command = server_command(Path("/srv/index"), "tiny", 30)
    script = Path(sysconfig.get_path("scripts")) / "nest"
    assert script.is_file(), "the package is installed with its `nest` script"
    assert command == [str(script), "serve", "--datastore", str(Path("/srv/index").resolve()), "--model", "tiny", "--idle-timeout", "30"]
    assert Path(command[0]).name == "nest"  # what `ps` shows as the process's name


def test_retrieve_wraps_passages_readably_at_80_columns(tiny_lm, tmp_path, monkeypatch):
    long = Passage(id="brannock", title="Brannock lighthouse", text=SENTENCE * 8)
    other = Passage(id="seals", title="Grey seals", text="Grey seals return to the Brannock rocks each spring to breed. " * 3)
    folder = NestIndex.build([long, other], tiny_lm, retriever_kind="bm25", show_progress=False, calibrate=False).save(tmp_path / "index")
    monkeypatch.setattr(index_command, "load_index", lambda path, model=None: NestIndex.load(path, tiny_lm))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(index_command, "console", Console())  # a terminal of 80 columns, as the command's console sees COLUMNS
    result = CliRunner().invoke(app, ["retrieve", str(folder), "Brannock keeper ships", "--k", "2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    assert max(len(line) for line in lines) >= 70, "passage text fills the lines, not a narrow column"
    flat = " ".join(result.stdout.split())
    assert "1. Brannock lighthouse" in flat and "score" in flat and "tokens" in flat
    assert index_command.preview(long.text)[:200] in flat
    assert index_command.preview(long.text).endswith("…") and len(index_command.preview(long.text)) <= index_command.RETRIEVE_PREVIEW_CHARS


def test_a_preview_is_one_line_cut_at_a_word():
    assert index_command.preview("short  text\nhere") == "short text here"
    assert index_command.preview("word " * 10, limit=11) == "word word…"


@pytest.mark.slow  # converts the default LM's GGUF (about 540 MB written)
def test_converting_the_default_lm_draws_none_of_the_libraries_bars(tmp_path, monkeypatch, capfd):
    from nest_integrations.model.lm import embedded_model_path

    monkeypatch.setenv("NEST_CACHE_DIR", str(tmp_path))
    capfd.readouterr()
    folder = embedded_model_path("default")
    printed = capfd.readouterr()
    assert (folder / "config.json").is_file() and folder.is_relative_to(tmp_path)
    assert not any(bar in printed.err + printed.out for bar in LIBRARY_BARS), printed.err
