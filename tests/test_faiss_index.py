"""The dense first stage at scale: IVF and HNSW against the exact flat index,
memory-mapped save/load, and the knobs' validation (synthetic vectors, no embedder model)."""

from __future__ import annotations

import numpy as np
import pytest

from nest_integrations.corpus.passages import Passage
from nest_integrations.index.nest_index import NestIndex
from nest_integrations.retrieval import DenseRetriever
from nest_integrations.retrieval.faiss_index import default_nlist, index_bytes, resolve_factory

N, DIM = 3000, 32


class TableEmbedder:
    """Embeds passage "p<i>" as row i of a fixed table, query "q<i>" as row i plus noise, anything else as row 0."""

    def __init__(self, table: np.ndarray, queries: np.ndarray):
        self.table, self.queries = table, queries

    def encode(self, sentences: list[str]) -> np.ndarray:
        return np.stack([self._row(s) for s in sentences])

    def _row(self, text: str) -> np.ndarray:
        if text[:1] in ("p", "q") and text[1:].isdigit():
            return (self.table if text[0] == "p" else self.queries)[int(text[1:])]
        return self.table[0]


@pytest.fixture(scope="module")
def corpus() -> tuple[list[Passage], TableEmbedder]:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((30, DIM)).astype(np.float32)  # clustered, as real embeddings are
    table = centres[rng.integers(0, 30, N)] + 0.5 * rng.standard_normal((N, DIM)).astype(np.float32)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    queries = table[:40] + 0.1 * rng.standard_normal((40, DIM)).astype(np.float32)
    return [Passage(id=f"id{i}", text=f"p{i}") for i in range(N)], TableEmbedder(table, queries)


def _top(retriever: DenseRetriever, k: int = 10) -> list[list[str]]:
    return [[p.id for p, _ in hits] for hits in retriever.retrieve_batch([f"q{i}" for i in range(40)], k)]


@pytest.mark.parametrize("factory, knobs", [("ivf", {"nprobe": 1000}), ("hnsw", {"ef_search": 256})])
def test_approximate_indexes_find_the_exact_top_hit(corpus, factory, knobs):
    passages, embedder = corpus
    exact = _top(DenseRetriever(passages, embedder, index_factory="flat", show_progress=False))
    approx = DenseRetriever(passages, embedder, index_factory=factory, show_progress=False, **knobs)
    assert approx.index_factory == {"ivf": f"IVF{default_nlist(N)},Flat", "hnsw": "HNSW32,Flat"}[factory]
    found = _top(approx)
    assert [row[0] for row in found] == [row[0] for row in exact]
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(found, exact)])
    assert recall >= 0.95


def test_low_nprobe_trades_recall_for_speed(corpus):
    passages, embedder = corpus
    exact = _top(DenseRetriever(passages, embedder, index_factory="flat", show_progress=False))
    one_list = _top(DenseRetriever(passages, embedder, index_factory="ivf", nlist=64, nprobe=1, show_progress=False))
    assert np.mean([len(set(a) & set(e)) / 10 for a, e in zip(one_list, exact)]) < 0.95  # the knob matters


def test_auto_picks_flat_then_ivf():
    assert resolve_factory("auto", 99_999) == "Flat"
    assert resolve_factory("auto", 100_000) == "IVF1265,Flat" and default_nlist(10**6) == 4000
    assert resolve_factory("IVF64,PQ8", 10) == "IVF64,PQ8"  # raw FAISS strings pass through


def test_from_vectors_matches_embedding_the_corpus(corpus):
    passages, embedder = corpus
    built = DenseRetriever(passages, embedder, index_factory="flat", show_progress=False)
    given = DenseRetriever.from_vectors(passages, embedder.table, embedder, index_factory="flat")
    assert _top(given) == _top(built) and index_bytes(given._index) >= N * DIM * 4
    with pytest.raises(ValueError, match=r"3000 passages need float32 \(n, d\) vectors, got float32 \(2, 32\)"):
        DenseRetriever.from_vectors(passages, embedder.table[:2], embedder)


def test_nest_index_round_trip_memory_mapped(corpus, tiny_lm, tmp_path):
    passages, embedder = corpus
    dense = DenseRetriever(passages, embedder, index_factory="ivf", nprobe=7, on_disk=True, show_progress=False)
    index = NestIndex(tiny_lm, passages, dense, retriever_kind="dense")
    index.save(tmp_path / "idx")
    loaded = NestIndex.load(tmp_path / "idx", tiny_lm, embedder=embedder)
    assert loaded.dense.memory_mapped and loaded.info()["faiss_memory_mapped"]
    assert loaded.dense.index_factory == dense.index_factory
    assert _top(loaded.dense) == _top(dense)  # nprobe=7 survived the round trip
    with pytest.raises(ValueError, match="memory-mapped .* read-only"):
        loaded.dense.add([Passage(id="new", text="p0")])
    in_memory = DenseRetriever.load(tmp_path / "idx", passages, embedder, mmap=False, nprobe=1000)
    assert not in_memory.memory_mapped and _top(in_memory)[0][0] == _top(dense, 1)[0][0]


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"index_factory": "ivf", "nlist": 5000}, r"nlist must be an integer in \[1, 3000\]"),
        ({"index_factory": "ivf", "nlist": 0}, "nlist must be a positive integer"),
        ({"index_factory": "hnsw", "hnsw_m": 1}, "hnsw_m must be an integer >= 2"),
        ({"index_factory": "hnsw", "ef_search": 0}, "ef_search must be a positive integer"),
        ({"index_factory": "ivf", "nprobe": True}, "nprobe must be a positive integer"),
        ({"index_factory": " "}, "index_factory must be one of"),
        ({"index_factory": "IVF4096,Flat"}, "too few to train"),
    ],
)
def test_bad_knobs_are_refused(corpus, knobs, message):
    passages, embedder = corpus
    with pytest.raises(ValueError, match=message):
        DenseRetriever(passages, embedder, show_progress=False, **knobs)


def test_nest_index_build_refuses_unknown_faiss_options(small_passages, tiny_lm):
    with pytest.raises(ValueError, match=r"unknown faiss_options \['nprob'\]"):
        NestIndex.build(small_passages, tiny_lm, faiss_options={"nprob": 3})
