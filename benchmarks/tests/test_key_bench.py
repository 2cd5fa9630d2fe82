"""``nest bench keys`` end to end at a toy size: the tiny Llama, MiniLM first stage, two query sets."""

from __future__ import annotations

import json

import pytest

from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_benchmarks.key_bench import run_key_bench
from nest_integrations.index.nest_index import NestIndex


@pytest.fixture(scope="module")
def people_index(tiny_lm):
    return NestIndex.build(load_wikipedia_summaries("People", limit=40), tiny_lm, show_progress=False)


def test_key_bench_reports_every_codec_on_both_query_sets(people_index, tmp_path):
    report = run_key_bench(
        people_index, codecs=["pq16", "spq16"], n=2, max_new_tokens=6, sample_passages=30, train_keys=2048, out_dir=tmp_path
    )
    saved = json.loads((tmp_path / "key_bench.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(report["rows"]))
    assert [(r["queries"], r["codec"]) for r in saved["rows"]] == [
        (mode, codec) for mode in ("base", "nest") for codec in ("float16", "pq16", "spq16")
    ]
    assert saved["queries"]["base"] > 0 and saved["queries"]["nest"] > 0
    for row in saved["rows"]:
        assert 0.0 <= row["top1_agreement"] <= 1.0 and row["top1_distance_err_of_median"] >= 0.0
        if row["codec"] == "float16":  # the reference agrees with itself exactly
            assert row["top1_agreement"] == 1.0 and row["top1_distance_err_of_median"] == 0.0
        else:
            assert row["bytes_per_token"] == 16 and row["compression_vs_float16"] == 8.0
    assert "| nest | spq16 | 16 |" in (tmp_path / "key_bench.md").read_text()


def test_key_bench_refuses_unknown_query_modes(people_index, tmp_path):
    with pytest.raises(ValueError, match="query modes must be some of base, nest"):
        run_key_bench(people_index, codecs=["pq16"], n=1, query_modes=["rag"], out_dir=tmp_path)
