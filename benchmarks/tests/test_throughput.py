"""Tests for the throughput benchmark (tiny random LM, 20 Wikipedia people); nothing here is timed."""

from __future__ import annotations

import json

import pytest

from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_benchmarks.throughput import PROMPT_KINDS, run_throughput, throughput_items
from nest_integrations.index.nest_index import NestIndex

# The relevance gate re-embeds every retrieved passage with MiniLM on each generation,
# which dominates the run time here; the bench's logic does not depend on it.
FAST = {"min_passage_relevance": -1.0}


@pytest.fixture(scope="module")
def index(tiny_lm) -> NestIndex:
    return NestIndex.build(load_wikipedia_summaries(topic="People", limit=20), tiny_lm, show_progress=False)


def test_items_mix_the_kinds_in_turn_and_outside_questions_are_not_in_the_index(index):
    items = throughput_items(index, 7, seed=1)
    assert [item.meta["kind"] for item in items] == [*PROMPT_KINDS, *PROMPT_KINDS, "bio"]
    assert len({item.id for item in items}) == 7
    in_index = {p.id for p in index.passages}
    for item in items:
        assert (item.meta["passage_id"] in in_index) == (item.meta["kind"] != "wiki-qa-outside")
    # The same seed draws the same items, whatever the other kinds.
    outside = throughput_items(index, 2, seed=1, kinds=("wiki-qa-outside",))
    assert [item.id for item in outside] == [item.id for item in items if item.meta["kind"] == "wiki-qa-outside"]


def test_throughput_writes_every_configuration_with_quality_and_memory(index, tmp_path):
    bench = run_throughput(
        index, n=3, max_new_tokens=4, batch_sizes=(1, 2), concurrency=2, repeats=2, out_dir=tmp_path,
        config_overrides=FAST,
    )
    assert json.loads((tmp_path / "bench.json").read_text()) == bench
    expected = ["nest", "nest batch 1", "nest batch 2", "nest 2 threads", "ChatNest", "ChatNest 2 async",
                "LM batch 1", "LM batch 2", "RAG", "prompt lookup"]
    assert list(bench["rows"]) == expected
    for name, row in bench["rows"].items():
        assert row["prompts"] == 3 and len(row["texts"]) == 3, name
        assert 1 <= row["new_tokens"] <= 12 and row["tokens_per_s"] > 0, name
        assert len(row["wall_s_rounds"]) == 2 and row["wall_s"] == min(row["wall_s_rounds"]) > 0, name
        assert 0.0 <= row["rouge1"] <= 1.0 and 0.0 <= row["answer_recall"] <= 1.0, name  # one bio, two questions
        assert row["vs_nest"] > 0 and row["vs_prompt_lookup"] > 0, name
    rows = bench["rows"]
    assert rows["nest"]["vs_nest"] == pytest.approx(1.0) and rows["nest"]["same_text"] is None
    # Greedy decoding: batched and concurrent NEST write what NEST writes alone, and prompt
    # lookup (lossless) writes what greedy generate writes on the same RAG prompt.
    for name in ("nest batch 1", "nest batch 2", "nest 2 threads", "ChatNest", "ChatNest 2 async"):
        assert rows[name]["same_text"] == 1.0, name
    assert rows["prompt lookup"]["reference"] == "RAG" and rows["prompt lookup"]["same_text"] == 1.0
    # Every configuration's decoding forwards are counted; a batch of 2 shares them.
    assert all(row["lm_forwards"] >= 1 and row["fed_tokens"] >= row["lm_forwards"] for row in rows.values())
    assert rows["nest batch 2"]["lm_forwards"] < rows["nest batch 1"]["lm_forwards"]
    assert rows["LM batch 2"]["lm_forwards"] < rows["LM batch 1"]["lm_forwards"]
    assert bench["prompt_kinds"] == {kind: 1 for kind in PROMPT_KINDS}
    memory = bench["memory"]
    assert memory["batch"] == 2 and memory["kv_cache_peak_columns"] > 0
    config = index.lm.model.config
    per_column = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    assert memory["kv_cache_bytes_per_column"] == per_column  # float32 keys and values of every layer
    assert memory["rss_growth_mib"] is not None and memory["rss_growth_mib"] >= 0
    assert [t["met"] is None for t in bench["targets"]] == [True, False, False, False]  # no batch of 8 here
    text = (tmp_path / "bench.md").read_text()
    for heading in ("## Configurations", "## Targets", "## Memory", "| prompt lookup |"):
        assert heading in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be >= 1"),
        ({"batch_sizes": ()}, "batch_sizes"),
        ({"batch_sizes": (0, 4)}, "batch_sizes"),
        ({"concurrency": 0}, "concurrency"),
        ({"prompt_lookup_tokens": 0}, "prompt_lookup_tokens"),
        ({"kinds": ("bio", "completion")}, "unknown prompt kind"),
        ({"kinds": ()}, "at least one prompt kind"),
        ({"repeats": 0}, "repeats"),
        ({"config_overrides": {"mode": "rag"}}, "runner sets them"),
    ],
)
def test_throughput_rejects_bad_arguments_before_writing(index, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_throughput(index, out_dir=tmp_path / "out", **{"n": 3, **kwargs})
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_sweep_with_batching_before_loading_anything(monkeypatch):
    from typer.testing import CliRunner

    from nest_integrations.cli import app
    from nest_integrations.cli import bench as bench_cli

    monkeypatch.setattr(bench_cli, "load_index", lambda *args: pytest.fail("an index was loaded"))
    result = CliRunner().invoke(app, ["bench", "batching", "--sweep", "gamma", "--values", "0.1"])
    assert result.exit_code == 2 and "No such option: --sweep" in " ".join(result.output.split())
