"""Tests for the evaluation runner and the speed benchmark (tiny random LM, 20 Wikipedia people)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from nest_integrations.core.config import MODES
from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_benchmarks.bench import BENCH_MODES, run_bench, run_sweep
from nest_benchmarks.docs_corpus import docs_passages
from nest_benchmarks.runner import TASK_METRICS, run_eval, score_item, summarize_records
from nest_benchmarks.tasks import TASK_MAX_NEW_TOKENS, EvalItem
from nest_integrations.index.nest_index import NestIndex

MAX_NEW = 8
# The relevance gate re-embeds every retrieved passage with MiniLM on each generation,
# which dominates the run time here; the runner's logic does not depend on it.
FAST = {"min_passage_relevance": -1.0}


@pytest.fixture(scope="module")
def index(tiny_lm) -> NestIndex:
    return NestIndex.build(load_wikipedia_summaries(topic="People", limit=20), tiny_lm, show_progress=False)


@pytest.fixture(scope="module")
def bio_run(index, tmp_path_factory):
    out = tmp_path_factory.mktemp("bio")
    summary = run_eval(
        index, "bio", n=3, max_new_tokens=MAX_NEW, out_dir=out, config_overrides=FAST, show_progress=False
    )
    records = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    return out, summary, records


def _curie_output(copied_text: str = "born in 1867") -> dict:
    """A hand-made output dict: LM text, then a verbatim copy from the 'curie' passage."""
    lead = "Marie Curie was "
    passage = "Marie Curie was a physicist. She was born in 1867 in Warsaw."
    start = passage.index(copied_text)
    return {
        "text": lead + copied_text,
        "spans": [
            {"text": lead, "start": 0, "end": len(lead), "copied": False, "source": None},
            {"text": copied_text, "start": len(lead), "end": len(lead) + len(copied_text), "copied": True,
             "source": {"id": "curie", "chunk_char_start": start, "chunk_char_end": start + len(copied_text)}},
        ],
        "attribution_ratio": 0.5,
        "mean_copied_span_tokens": 3.0,
        "stats": {"new_tokens": 6, "forward_passes": 3, "wall_s": 1.0, "retrieval_s": 0.25,
                  "encode_s": 0.25, "decode_s": 0.5},
    }, {"curie": passage}


# --------------------------------------------------------------------------- score_item


def test_score_item_bio_metrics_and_first_stage_time():
    output, passages = _curie_output()
    item = EvalItem("bio/curie", "Tell me a bio of Marie Curie.", "Marie Curie",
                    "Marie Curie was a physicist born in 1867.", {"name": "Marie Curie", "passage_id": "curie"})
    row = score_item(item, output, "bio", passages, first_stage_s=0.5)
    assert row["span_integrity"] == 1.0 and row["spans_tile"] is True
    assert row["year_precision"] == 1.0 and row["opens_with_entity"] and not row["opens_with_other_name"]
    assert 0.5 < row["rouge1"] <= 1.0 and 0.0 < row["rougeL"] <= 1.0
    assert row["wall_s"] == 1.5 and row["retrieval_s"] == 0.75 and row["decode_s"] == 0.5
    assert row["tokens_per_forward"] == 3.0 and row["attribution_ratio"] == 0.5  # 6 tokens, 2 decoding forwards after the prefill
    assert row["seam_ok_rate"] == 0.0  # "Marie Curie was " + "born in 1867" skips the source's "She was"
    assert row["fragment_answer"] is False
    assert set(TASK_METRICS["bio"]) <= set(row)


def test_score_item_qa_and_broken_spans():
    output, passages = _curie_output()
    item = EvalItem("qa/1", "When was Marie Curie born?", "Marie Curie", "", {"answers": ["1867"]})
    assert score_item(item, output, "qa", passages)["answer_recall"] == 1.0
    output["spans"][1]["source"]["chunk_char_start"] += 1  # no longer verbatim
    assert score_item(item, output, "qa", passages)["span_integrity"] == 0.0


@pytest.mark.parametrize(
    "task, change, message",
    [
        ("poetry", {}, "unknown task"),
        ("qa", {"spans": None}, "spans"),
        ("qa", {"stats": None}, "stats"),
    ],
)
def test_score_item_rejects_bad_input(task, change, message):
    output, passages = _curie_output()
    output.update(change)
    item = EvalItem("qa/1", "q", "q", "", {"answers": ["1867"]})
    with pytest.raises(ValueError, match=message):
        score_item(item, output, task, passages)


def test_score_item_needs_task_meta():
    output, passages = _curie_output()
    with pytest.raises(ValueError, match="meta\\['name'\\]"):
        score_item(EvalItem("bio/x", "p", "q", "r"), output, "bio", passages)


# --------------------------------------------------------------------------- run_eval


def test_bio_run_writes_every_mode_and_condition(bio_run):
    out, summary, records = bio_run
    assert {p.name for p in out.iterdir()} == {"items.jsonl", "summary.json", "summary.md"}
    assert json.loads((out / "summary.json").read_text()) == summary
    combos = set(itertools.product(MODES, ("present", "absent")))
    assert {(r["mode"], r["condition"]) for r in summary["results"]} == combos
    assert len(records) == 3 * len(combos)
    for item_id in summary["item_ids"]:
        assert {(r["mode"], r["condition"]) for r in records if r["item_id"] == item_id} == combos
    for key in ("command", "date", "model", "config", "index", "protocol"):
        assert summary[key]
    assert summary["model"] == "tiny-llama-0" and summary["config"]["max_new_tokens"] == MAX_NEW
    table = (out / "summary.md").read_text()
    assert "speed vs base" in table and "ROUGE-1" in table
    rows = [line for line in table.splitlines() if line.startswith(tuple(f"| {mode} |" for mode in MODES))]
    assert len(rows) == 10


def test_bio_metrics_are_in_range(bio_run):
    _, summary, records = bio_run
    for record in records:
        m = record["metrics"]
        assert m["span_integrity"] == 1.0 and m["spans_tile"] is True
        for key in ("attribution_ratio", "rouge1", "rougeL"):
            assert 0.0 <= m[key] <= 1.0
        assert m["year_precision"] is None or 0.0 <= m["year_precision"] <= 1.0
        assert isinstance(m["opens_with_entity"], bool) and isinstance(m["opens_with_other_name"], bool)
        assert 1 <= m["new_tokens"] <= MAX_NEW and m["tokens_per_forward"] >= 1.0
        assert m["wall_s"] >= m["retrieval_s"] + m["encode_s"] + m["decode_s"] - 1e-6
        assert min(m["retrieval_s"], m["encode_s"], m["decode_s"]) >= 0.0
        assert m["datastore_fallback"] is None if record["mode"] in ("base", "rag") else isinstance(
            m["datastore_fallback"], bool
        )
        if record["mode"] == "base":
            assert m["retrieval_s"] == 0.0 and m["encode_s"] == 0.0
    for row in summary["results"]:
        assert row["count"] == 3 and 0.0 <= row["attribution_ratio"] <= 1.0 and row["speedup_vs_base"] > 0
        if row["mode"] == "base":
            assert row["speedup_vs_base"] == pytest.approx(1.0)


def test_speedup_vs_base_is_per_generated_token():
    # nest stops after 5 tokens in 0.5 s; base writes 10 in 2 s: twice base's tokens/s, not 4x its wall time.
    records = [
        {"mode": "base", "condition": "present", "metrics": {"wall_s": 2.0, "new_tokens": 10}},
        {"mode": "nest", "condition": "present", "metrics": {"wall_s": 0.5, "new_tokens": 5}},
    ]
    rows = summarize_records(records, "bio", ["base", "nest"], ["present"])
    assert [row["speedup_vs_base"] for row in rows] == [pytest.approx(1.0), pytest.approx(2.0)]


def test_absent_condition_never_retrieves_the_own_passage(bio_run):
    _, _, records = bio_run
    for record in records:
        own = record["meta"]["passage_id"]
        used = {source["id"] for source in record["output"]["sources"]}
        if record["condition"] == "absent":
            assert own not in record["retrieved_ids"] and own not in used
        else:
            assert own in record["retrieved_ids"]


def test_completion_run_reports_perplexity(index, tmp_path):
    summary = run_eval(
        index, "completion", n=2, max_new_tokens=MAX_NEW, out_dir=tmp_path, config_overrides=FAST,
        show_progress=False,
    )
    assert [(r["mode"], r["condition"]) for r in summary["results"]] == [(m, "present") for m in MODES]
    ppl = {r["mode"]: r["perplexity"] for r in summary["results"]}
    assert all(math.isfinite(p) and p >= 1.0 for p in ppl.values())
    # The true continuation is in the datastore: the kNN mixtures must beat the random LM alone.
    assert ppl["knnlm"] < ppl["base"] and ppl["nest"] < ppl["base"]
    assert "perplexity" in (tmp_path / "summary.md").read_text()
    assert len((tmp_path / "items.jsonl").read_text().splitlines()) == 2 * len(MODES)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"task": "poetry"}, "unknown task"),
        ({"modes": ("nest", "beam")}, "unknown modes"),
        ({"modes": ()}, "at least one mode"),
        ({"conditions": ("present", "hidden")}, "unknown conditions"),
        ({"config_overrides": {"mode": "base"}}, "cannot set"),
        ({"config_overrides": {"gamma": -1.0}}, "gamma"),
        ({"n": 0}, "n must be"),
        ({"task": "qa"}, "qa_path"),
    ],
)
def test_run_eval_rejects_bad_arguments(index, tmp_path, kwargs, message):
    arguments = {"task": "bio", "n": 1, "max_new_tokens": 2, "out_dir": tmp_path, "show_progress": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        run_eval(index, **arguments)


def test_qa_has_no_absent_condition(index, tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "Who designed Paimio Sanatorium?", "answers": ["Alvar Aalto"]}) + "\n")
    with pytest.raises(ValueError, match="absent"):
        run_eval(index, "qa", n=1, qa_path=path, conditions=("absent",), out_dir=tmp_path, show_progress=False)


# --------------------------------------------------------------------------- the question domains


def test_wiki_qa_run_uses_the_short_answer_budget(index, tmp_path):
    summary = run_eval(index, "wiki-qa", n=1, modes=("base", "nest"), out_dir=tmp_path, config_overrides=FAST,
                       show_progress=False)
    assert summary["config"]["max_new_tokens"] == TASK_MAX_NEW_TOKENS["wiki-qa"] == 64
    assert [(r["mode"], r["condition"]) for r in summary["results"]] == [("base", "present"), ("nest", "present")]
    by_id = {p.id: p.text for p in index.passages}
    records = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    for record in records:
        assert all(a in by_id[record["meta"]["passage_id"]] for a in record["meta"]["answers"])
        assert record["metrics"]["answer_recall"] in (0.0, 1.0)
        assert record["metrics"]["seam_ok_rate"] is None or 0.0 <= record["metrics"]["seam_ok_rate"] <= 1.0
    table = (tmp_path / "summary.md").read_text()
    assert "answer recall" in table and "seam ok" in table


@pytest.fixture(scope="module")
def docs_index(tiny_lm) -> NestIndex:
    return NestIndex.build(docs_passages("splitter"), tiny_lm, show_progress=False)


def test_docs_run_over_splitter_chunks_and_absent_removes_every_chunk(docs_index, tmp_path):
    summary = run_eval(docs_index, "docs", n=2, modes=("rag", "nest"), conditions=("present", "absent"),
                       max_new_tokens=MAX_NEW, out_dir=tmp_path, config_overrides=FAST, show_progress=False)
    assert {r["mode"] for r in summary["results"]} == {"rag", "nest"} and summary["n_items"] == 2
    doc_of = {p.id: p.doc_id for p in docs_index.passages}
    for record in (json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()):
        gold = record["meta"]["passage_id"]
        retrieved_docs = {doc_of[i] for i in record["retrieved_ids"]}
        if record["condition"] == "absent":
            assert gold not in retrieved_docs
        assert record["metrics"]["span_integrity"] == 1.0


def test_docs_needs_an_index_over_the_docs(index, tmp_path):
    with pytest.raises(ValueError, match="gold passages"):
        run_eval(index, "docs", n=1, modes=("base",), out_dir=tmp_path, show_progress=False)


# --------------------------------------------------------------------------- bench and sweep


def test_bench_writes_json_and_markdown(index, tmp_path):
    bench = run_bench(
        index, n=2, max_new_tokens=4, build_passages=6, out_dir=tmp_path, config_overrides=FAST, show_progress=False
    )
    assert json.loads((tmp_path / "bench.json").read_text()) == bench
    assert set(bench["modes"]) == set(BENCH_MODES)
    for row in bench["modes"].values():
        for key in ("tokens_per_s", "tokens_per_forward", "ttft_s", "retrieval_s", "encode_s", "decode_s",
                    "other_s", "hf_wall_s", "speedup_vs_hf", "speedup_vs_base"):
            assert row[key] is not None and row[key] >= 0, key
        assert row["prompts"] == 2 and 1 <= row["new_tokens"] <= 8
        assert row["encode_s"] == 0.0  # the mode table runs over precomputed keys
    assert bench["modes"]["base"]["speedup_vs_base"] == pytest.approx(1.0)
    keys = bench["keys"]
    assert keys["lazy"]["encoded_passages"] > 0 and keys["precomputed"]["encoded_passages"] == 0
    assert keys["speedup_precomputed_vs_lazy"] > 0
    batching = bench["batching"]
    assert batching["prompts"] == 2 and batching["new_tokens"] == 8 and batching["batch_speedup"] > 0
    assert "## Batching" in (tmp_path / "bench.md").read_text()
    build = bench["datastore_build"]
    assert build["passages"] == 6 and build["tokens"] > 0 and build["batches"] >= 1
    assert build["ratio"] == pytest.approx(build["precompute_tokens_per_s"] / build["raw_forward_tokens_per_s"])
    memory = bench["memory"]
    assert memory["bytes_per_key"] == 2 * index.lm.hidden_size and memory["peak_rss_mib"] > 0
    assert bench["hf_generate"]["new_tokens"] > 0
    text = (tmp_path / "bench.md").read_text()
    for heading in ("## Modes", "## Lazy vs precomputed keys", "## Datastore build", "## Memory"):
        assert heading in text


def test_sweep_records_each_value_and_plots(index, tmp_path):
    sweep = run_sweep(index, param="delta", values=[0.0, 1.0], n=1, max_new_tokens=4, out_dir=tmp_path,
                      config_overrides=FAST, show_progress=False)
    assert [row["value"] for row in sweep["rows"]] == [0.0, 1.0]
    for row in sweep["rows"]:
        assert 0.0 <= row["rouge1"] <= 1.0 and 0.0 <= row["attribution_ratio"] <= 1.0
        assert row["tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0
    assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "sweep.json").read_text()) == sweep


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"param": "beta"}, "param must be"),
        ({"param": "gamma", "mode": "ra_nest"}, "ra_gamma"),
        ({"values": []}, "values is empty"),
        ({"values": [2.0]}, "delta"),
    ],
)
def test_sweep_rejects_bad_arguments(index, tmp_path, kwargs, message):
    arguments = {"param": "delta", "values": [0.5], "n": 1, "out_dir": tmp_path, "show_progress": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        run_sweep(index, **arguments)
