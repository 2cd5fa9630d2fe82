"""``nest bench gate`` at a toy size: what the relevance gate keeps for biographies, present and absent."""

from __future__ import annotations

import json

from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_benchmarks.gate_bench import gate_report
from nest_integrations.index.nest_index import NestIndex


def test_the_gate_keeps_the_own_summary_and_nobody_else_when_it_is_gone(tiny_lm, tmp_path):
    index = NestIndex.build(load_wikipedia_summaries("People", limit=40), tiny_lm, show_progress=False)
    report = gate_report(index, n=10, seed=0, out_dir=tmp_path)
    assert report["n"] == 10 and len(report["items"]) == 10
    assert report["present_own_kept"] >= 8, report["misses"]
    assert report["absent_any_kept"] <= 2, report["wrong"]
    for row in report["items"]:
        assert row["own_kept"] == (row["name"] not in report["misses"])
    saved = json.loads((tmp_path / "gate.json").read_text())
    assert saved["present_own_kept"] == report["present_own_kept"]
    assert f"{report['present_own_kept']} of 10" in (tmp_path / "gate.md").read_text()
