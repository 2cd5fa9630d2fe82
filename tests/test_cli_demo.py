"""``nest demo`` compares NEST with the base LM after a warm-up: what a process pays once (building,
loading, a calibration the index lacks, the first forwards) is shown apart, not in the comparison."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.cli import generate as generate_command
from nest_integrations.corpus.passages import Passage
from nest_integrations.index.nest_index import NestIndex

PEOPLE = [
    Passage(id="Ada Lovelace", title="Ada Lovelace", text="Ada Lovelace was an English mathematician and writer. She worked on "
            "Charles Babbage's analytical engine. She is often called the first computer programmer."),
    Passage(id="Alan Turing", title="Alan Turing", text="Alan Turing was an English mathematician and computer scientist. He "
            "formalised the concepts of algorithm and computation. He worked at Bletchley Park."),
    Passage(id="Marie Curie", title="Marie Curie", text="Marie Curie was a Polish and naturalised-French physicist and chemist. "
            "She conducted pioneering research on radioactivity. She was born in Warsaw."),
    Passage(id="Niels Bohr", title="Niels Bohr", text="Niels Bohr was a Danish physicist. He made foundational contributions to "
            "atomic structure and quantum theory. He received the Nobel Prize in Physics in 1922."),
]


def test_the_demo_times_its_comparison_after_the_one_time_costs_and_shows_them_apart(tiny_lm, tmp_path, monkeypatch):
    folder = NestIndex.build(PEOPLE, tiny_lm, retriever_kind="bm25", show_progress=False, calibrate=False).save(tmp_path / "index")
    monkeypatch.setattr(generate_command, "default_index_path", lambda model=None: folder)
    monkeypatch.setattr(generate_command, "load_index", lambda path, model=None: NestIndex.load(folder, tiny_lm))
    result = CliRunner().invoke(app, ["demo", "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    one_time = re.search(r"One-time costs, not in the comparison: (.*?) Prompt:", shown)
    assert one_time, shown
    assert "loading the index and LM" in one_time.group(1) and "warm-up" in one_time.group(1)
    assert "building the index" not in one_time.group(1), "the index was there: nothing built"
    assert "(calibration" in one_time.group(1), "the index had no calibration: the warm-up fitted it"
    assert shown.count("(calibration 0.00,") == 2, "neither compared answer waited for the calibration"
    assert re.search(r"NEST: \d+\.\dx the base LM's tokens per second on this prompt", shown)
