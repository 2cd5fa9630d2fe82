"""``nest bench scale`` end to end at a toy size: real MiniLM embeddings of 150
summaries duplicated to 400 passages, the tiny Llama decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_benchmarks.scale_bench import duplicated, run_scale_bench
from nest_integrations.retrieval import load_embedder


@pytest.fixture(scope="module")
def base():
    return load_wikipedia_summaries("People", limit=150)


def test_scale_bench_writes_json_markdown_and_plot(base, tiny_lm, tmp_path):
    result = run_scale_bench(
        out_dir=tmp_path, sizes=(150, 400), hnsw_max=150, queries=5, prompts=1, max_new_tokens=4,
        passages=base, lm=tiny_lm, embedder=load_embedder(),
    )
    saved = json.loads((tmp_path / "scale.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    assert [(r["n"], r["index"]) for r in saved["rows"]] == [(150, "flat"), (150, "ivf"), (150, "hnsw"), (400, "flat"), (400, "ivf")]
    flat = [r for r in saved["rows"] if r["index"] == "flat"]
    assert all(r["recall_at_k"] == 1.0 for r in flat) and flat[1]["copies"] == 3
    assert flat[1]["index_mib"] > 2.5 * flat[0]["index_mib"]  # memory follows the corpus size
    assert all(r["nest"]["new_tokens"] > 0 and r["nest"]["ms_per_token"] > 0 for r in saved["rows"])
    ex = saved["extrapolation"]
    assert ex["passages"] == 33_000_000 and ex["assumptions"]
    assert saved["precomputed_bytes_per_token"] == 2 * 64 + 13  # the tiny Llama's hidden size is 64
    assert ex["keys_target_gib"] / ex["keys_float16_gib"] == pytest.approx(144 / (2 * 64 + 13))
    table = (tmp_path / "scale.md").read_text()
    assert "| 400 | 3 | ivf |" in table and "extrapolated" in table
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_duplicates_are_distinct_unit_vectors_with_new_ids(base):
    vectors = np.random.default_rng(1).standard_normal((len(base), 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    passages, out = duplicated(base, vectors, 320, noise=0.05, seed=0)
    assert len({p.id for p in passages}) == 320 and passages[150].id == f"{base[0].id}~1"
    assert passages[150].text == base[0].text and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    assert np.array_equal(out[:150], vectors) and 0.99 < float(out[150] @ vectors[0]) < 1.0


def test_bad_sizes_are_refused(tmp_path, tiny_lm):
    with pytest.raises(ValueError, match="strictly increasing"):
        run_scale_bench(out_dir=tmp_path, sizes=(300, 100), lm=tiny_lm)
    with pytest.raises(ValueError, match="unknown index kind"):
        run_scale_bench(out_dir=tmp_path, indexes=("flat", "lsh"), lm=tiny_lm)


def test_corpus_embeddings_are_cached_per_corpus_and_embedder(base, tmp_path):
    from nest_benchmarks.scale_bench import corpus_embeddings

    class Counting:
        calls = 0

        def encode(self, texts):
            Counting.calls += len(texts)
            return np.ones((len(texts), 4), dtype=np.float32)

    first, rate, cached = corpus_embeddings(Counting(), "counting", base[:10], tmp_path)
    again, rate_again, cached_again = corpus_embeddings(Counting(), "counting", base[:10], tmp_path)
    assert (cached, cached_again) == (False, True) and Counting.calls == 10 and rate_again == rate
    assert np.array_equal(first, again)
    assert not corpus_embeddings(Counting(), "other", base[:10], tmp_path)[2]  # another embedder: no stale vectors
    assert not corpus_embeddings(Counting(), "counting", base[:9], tmp_path)[2]  # another corpus
