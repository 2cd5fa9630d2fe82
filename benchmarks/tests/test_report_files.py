"""The ``--domain`` specs, the report files and the run files the measurement scripts share."""

import json

import pytest

from nest_benchmarks.report_files import domain_specs, markdown_table, read_run_items, score_before_after, write_report


def test_a_domain_spec_is_a_name_and_the_fields_after_it():
    assert domain_specs(["attrs=IDX/attrs:qa.jsonl", "docs=@docs:runs/docs:absent"]) == {
        "attrs": ["IDX/attrs", "qa.jsonl"],
        "docs": ["@docs", "runs/docs", "absent"],
    }
    with pytest.raises(ValueError, match="IDX/attrs:qa.jsonl"):
        domain_specs(["IDX/attrs:qa.jsonl"])


def test_a_table_writes_an_empty_cell_as_the_docs_do_and_the_report_both_ways(tmp_path, capsys):
    table = markdown_table(["signals", "measure", "attrs"], [["cosine", "AUC", 0.76], ["", "at 2%", "+0 / -0"]])
    assert table == "| signals | measure | attrs |\n|---|---|---|\n| cosine | AUC | 0.76 |\n| | at 2% | +0 / -0 |\n"
    write_report(tmp_path / "out", "gate", {"attrs": 1}, table)
    assert json.loads((tmp_path / "out" / "gate.json").read_text()) == {"attrs": 1}
    assert (tmp_path / "out" / "gate.md").read_text() == table == capsys.readouterr().out.rstrip("\n") + "\n"


def test_a_runs_items_are_keyed_by_item_mode_and_condition(tmp_path):
    records = [
        {"item_id": "q1", "mode": "nest", "condition": "present", "output": {"text": "a"}},
        {"item_id": "q1", "mode": "rag", "condition": "present", "output": {"text": "b"}},
    ]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    items = read_run_items(tmp_path)
    assert set(items) == {("q1", "nest", "present"), ("q1", "rag", "present")}
    assert items["q1", "rag", "present"]["output"]["text"] == "b"



def test_runs_before_and_after_a_change_are_scored_with_their_domains_index_loaded_once():
    loaded: list[str] = []

    def load(path: str) -> str:
        loaded.append(path)
        return path.upper()

    report = score_before_after(
        ["borg=IDX/borg:old/borg:new/borg", "attrs=IDX/attrs:old/attrs:new/attrs"], load, lambda index, run: f"{index} {run.as_posix()}"
    )
    assert list(report) == ["borg", "attrs"] and loaded == ["IDX/borg", "IDX/attrs"]
    assert report["borg"] == {"before": "IDX/BORG old/borg", "after": "IDX/BORG new/borg"}
    with pytest.raises(ValueError, match="attrs=IDX/attrs:old/attrs"):
        score_before_after(["attrs=IDX/attrs:old/attrs"], load, lambda index, run: run)
