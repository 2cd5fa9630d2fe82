"""Dense, BM25 and hybrid retrieval with the real bundled MiniLM on Wikipedia summaries (offline)."""

from __future__ import annotations

import numpy as np
import pytest

from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_integrations.corpus.passages import Passage
from nest_integrations.retrieval import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    PassageRetriever,
    build_retriever,
    default_embedder_path,
    load_embedder,
)
from nest_integrations.retrieval.hybrid import fuse_adaptive, fuse_rrf

PEOPLE = ["Alvar Aalto", "Chinua Achebe", "Konrad Adenauer", "Ansel Adams", "Niels Henrik Abel"]


class CachingEmbedder:
    """A plain ``encode(list[str])`` embedder (not the loaded MiniLM itself) that memoises MiniLM vectors."""

    def __init__(self, model):
        self.model = model
        self.cache: dict[str, np.ndarray] = {}

    def encode(self, sentences: list[str]) -> np.ndarray:
        todo = [s for s in dict.fromkeys(sentences) if s not in self.cache]
        if todo:
            self.cache.update(zip(todo, self.model.encode(todo)))
        return np.stack([self.cache[s] for s in sentences])


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    corpus = load_wikipedia_summaries("People", limit=300) + load_wikipedia_summaries("Mathematics", limit=20)
    assert set(PEOPLE) <= {p.id for p in corpus}
    return corpus


@pytest.fixture(scope="module")
def embedder() -> CachingEmbedder:
    return CachingEmbedder(load_embedder())


@pytest.fixture(scope="module")
def dense(passages, embedder) -> DenseRetriever:
    return DenseRetriever(passages, embedder, show_progress=False)


@pytest.fixture(scope="module")
def bm25(passages) -> BM25Retriever:
    return BM25Retriever(passages)


@pytest.fixture(scope="module")
def retrievers(dense, bm25) -> dict[str, PassageRetriever]:
    return {
        "dense": dense,
        "bm25": bm25,
        "hybrid-adaptive": HybridRetriever(dense, bm25),
        "hybrid-rrf": HybridRetriever(dense, bm25, fusion="rrf"),
    }


def _ids(hits) -> list[str]:
    return [p.id for p, _ in hits]


@pytest.mark.parametrize("kind", ["dense", "bm25", "hybrid-adaptive", "hybrid-rrf"])
def test_title_queries_rank_the_right_summary_first(retrievers, kind):
    retriever = retrievers[kind]
    assert isinstance(retriever, PassageRetriever)
    for batch_hits, title in zip(retriever.retrieve_batch(PEOPLE, 5), PEOPLE):
        hits = retriever.retrieve(title, 5)
        assert _ids(hits)[0] == title
        assert _ids(hits) == _ids(batch_hits), "retrieve and retrieve_batch agree"
        scores = [s for _, s in hits]
        assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)


def test_descriptive_query_prefers_topic(retrievers):
    for kind in ("dense", "hybrid-adaptive"):
        assert _ids(retrievers[kind].retrieve("Finnish architect and designer", 3))[0] == "Alvar Aalto"


@pytest.mark.parametrize("kind", ["dense", "bm25", "hybrid-adaptive", "hybrid-rrf"])
def test_empty_query_and_bad_k(retrievers, kind):
    retriever = retrievers[kind]
    assert retriever.retrieve("", 5) == []
    assert retriever.retrieve("   ", 5) == []
    assert retriever.retrieve_batch(["", PEOPLE[0]], 2)[0] == []
    for k in (0, -1):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            retriever.retrieve(PEOPLE[0], k)


@pytest.mark.parametrize("kind", ["dense", "hybrid-adaptive", "hybrid-rrf"])
def test_k_larger_than_corpus_returns_every_passage(retrievers, passages, kind):
    hits = retrievers[kind].retrieve("mathematician", len(passages) + 50)
    assert sorted(_ids(hits)) == sorted(p.id for p in passages)


def test_bm25_returns_only_matching_passages(bm25, passages):
    hits = bm25.retrieve("Aalto", len(passages) + 50)
    assert _ids(hits) == ["Alvar Aalto"]
    assert all(score > 0 for _, score in bm25.retrieve("architect", 1000))
    assert bm25.retrieve("zzqxj the of", 5) == [], "no known term (stopwords dropped) -> []"


def test_dense_scores_are_cosine_similarities(dense, embedder, passages):
    (passage, score), *_ = dense.retrieve(PEOPLE[0], 1)
    q = dense.embed_queries([PEOPLE[0]])
    assert q.dtype == np.float32 and q.shape == (1, 384) and q.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)
    doc = embedder.encode([f"{passage.title}: {passage.text}"])[0]
    assert score == pytest.approx(float(q[0] @ doc / np.linalg.norm(doc)), abs=1e-5)


def test_a_query_is_embedded_once_for_retrieval_gate_and_window(passages, embedder, monkeypatch):
    retriever = DenseRetriever(passages[:20], embedder, show_progress=False)
    calls = []
    encode = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda texts: calls.append(list(texts)) or encode(texts))
    first = retriever.embed_queries(["Alvar Aalto"])
    again = retriever.embed_queries(["Alvar Aalto", "Chinua Achebe", "Alvar Aalto"])
    assert calls == [["Alvar Aalto"], ["Chinua Achebe"]], "each text embedded once"
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(again[2], first[0])
    assert again.shape == (3, 384) and again.flags.c_contiguous and again.dtype == np.float32
    again[0] = 0.0  # the caller's copy
    np.testing.assert_array_equal(retriever.embed_queries(["Alvar Aalto"])[0], first[0])


def test_the_query_cache_keeps_the_most_recent():
    from nest_integrations.retrieval.dense import _QueryCache

    cache = _QueryCache(size=2)
    for text in ("a", "b"):
        cache.put(text, np.full(3, len(text), dtype=np.float32))
    assert cache.get("a") is not None  # "a" is now the most recent
    cache.put("c", np.zeros(3, dtype=np.float32))
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None


def test_passage_vectors_read_back_indexed_passages_and_embed_the_rest(dense, embedder, passages):
    indexed = passages[3]
    edited = Passage(id=indexed.id, title=indexed.title, text=indexed.text + " Edited.")
    unseen = Passage(id="unseen", title="Unseen", text="A passage that is not in the index.")
    calls_before = len(embedder.cache)
    vectors = dense.passage_vectors([indexed, edited, unseen])
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384) and vectors.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert len(embedder.cache) == calls_before + 2, "only the edited and the unseen passage are embedded"
    for row, passage in enumerate([indexed, edited, unseen]):
        doc = embedder.encode([f"{passage.title}: {passage.text}"])[0]
        np.testing.assert_allclose(vectors[row], doc / np.linalg.norm(doc), atol=1e-5)
    assert dense.passage_vectors([]).shape == (0, 384)


def test_bm25_tiny_corpus():
    tiny = BM25Retriever([Passage("a", "the and of"), Passage("b", "Cats sat on mats.")])
    assert _ids(tiny.retrieve("cats", 10)) == ["b"]
    assert tiny.retrieve("the", 10) == []


def test_bm25_ranks_the_same_with_a_stemming_package_installed(monkeypatch):
    """BM25 matches words as written, so a query ranks the same on every machine: whether or not
    an optional stemmer (PyStemmer, importable as ``Stemmer``) is installed."""
    import sys
    import types

    fake = types.ModuleType("Stemmer")

    class Stemmer:  # a stemmer that would meet "configured" and "configuring"
        def __init__(self, language: str) -> None:
            pass

        def stemWords(self, words):  # noqa: N802 (PyStemmer's spelling)
            return [w.removesuffix("ed").removesuffix("ing") for w in words]

    fake.Stemmer = Stemmer
    monkeypatch.setitem(sys.modules, "Stemmer", fake)
    corpus = [Passage("a", "The server is configured at start."), Passage("b", "Configuring logging for the server.")]
    assert _ids(BM25Retriever(corpus).retrieve("configuring", 10)) == ["b"]


def test_default_embedder_save_load_round_trip(passages, tmp_path):
    subset = passages[:20]
    retriever = DenseRetriever(subset, show_progress=False)
    assert retriever.embedder_name == default_embedder_path() and retriever.dim == 384
    retriever.save(tmp_path / "idx")
    assert {p.name for p in (tmp_path / "idx").iterdir()} == {"dense.faiss", "dense.json"}
    loaded = DenseRetriever.load(tmp_path / "idx", subset)
    for query in PEOPLE[:3] + ["Swedish pop group"]:
        expected, got = retriever.retrieve(query, 7), loaded.retrieve(query, 7)
        assert _ids(got) == _ids(expected)
        np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], rtol=1e-6)


def test_load_rejects_mismatched_passages(dense, passages, embedder, tmp_path):
    dense.save(tmp_path)
    with pytest.raises(ValueError, match=r"holds 320 vectors .* but 319 passages"):
        DenseRetriever.load(tmp_path, passages[:-1], embedder)
    with pytest.raises(ValueError, match="differ"):
        DenseRetriever.load(tmp_path, passages[::-1], embedder)
    with pytest.raises(ValueError, match="custom embedder"):
        DenseRetriever.load(tmp_path, passages)
    loaded = DenseRetriever.load(tmp_path, passages, embedder)
    assert _ids(loaded.retrieve(PEOPLE[1], 3)) == _ids(dense.retrieve(PEOPLE[1], 3))


@pytest.mark.parametrize("factory, options", [("HNSW32", {}), ("IVF8,Flat", {"nprobe": 8})])
def test_other_index_factories(passages, embedder, factory, options):
    retriever = DenseRetriever(passages, embedder, index_factory=factory, show_progress=False, **options)
    for title in PEOPLE:
        assert _ids(retriever.retrieve(title, 3))[0] == title


def test_untrainable_factory_fails_clearly(passages, embedder):
    with pytest.raises(ValueError, match="too few to train"):
        DenseRetriever(passages, embedder, index_factory="IVF4096,PQ32", show_progress=False)
    with pytest.raises(ValueError, match="invalid FAISS index factory"):
        DenseRetriever(passages[:5], embedder, index_factory="NotAnIndex", show_progress=False)


@pytest.mark.parametrize("kind", ["dense", "bm25"])
def test_add_and_remove(passages, embedder, kind):
    base = [p for p in passages[:40] if p.id != "Konrad Adenauer"]
    extra = [p for p in passages if p.id == "Konrad Adenauer"]
    retriever = DenseRetriever(base, embedder, show_progress=False) if kind == "dense" else BM25Retriever(base)
    assert "Konrad Adenauer" not in _ids(retriever.retrieve("Konrad Adenauer", 100))
    retriever.add(extra)
    assert len(retriever) == 40 and _ids(retriever.retrieve("Konrad Adenauer", 1)) == ["Konrad Adenauer"]
    with pytest.raises(ValueError, match="duplicate passage id"):
        retriever.add(extra)
    retriever.remove(["Konrad Adenauer", base[0].id])
    assert len(retriever) == 38
    assert {"Konrad Adenauer", base[0].id}.isdisjoint(_ids(retriever.retrieve("Konrad Adenauer", 100)))
    with pytest.raises(ValueError, match="unknown passage id"):
        retriever.remove(["nope"])


def _hits(pairs: list[tuple[str, float]]) -> list[tuple[Passage, float]]:
    return [(Passage(i, f"text {i}"), s) for i, s in pairs]


def test_adaptive_fusion_weights_by_peakedness():
    dense = _hits([("a", 0.60), ("b", 0.59), ("c", 0.58)])  # flat: peak 1 - .58/.60 ~ 0.033
    sparse = _hits([("c", 10.0), ("b", 1.0)])  # peaked: 0.9; "a" missing -> lowest
    fused = dict((p.id, s) for p, s in fuse_adaptive(dense, sparse))
    eta = 0.7 * (1 - 0.9) + 0.3 * (1 - 0.58 / 0.60)
    assert fused["c"] == pytest.approx(eta * 0.0 + (1 - eta) * 1.0)
    assert fused["a"] == pytest.approx(eta * 1.0 + (1 - eta) * 0.0)
    assert fused["b"] == pytest.approx(eta * 0.5 + (1 - eta) * 0.0)
    assert max(fused, key=fused.get) == "c", "a peaked sparse list wins over a flat dense one"


def test_rrf_fusion():
    fused = fuse_rrf(_hits([("a", 0.9), ("b", 0.8)]), _hits([("b", 3.0), ("c", 1.0)]), rrf_k=60)
    assert [(p.id, round(s, 6)) for p, s in fused] == [
        ("b", round(1 / 62 + 1 / 61, 6)),
        ("a", round(1 / 61, 6)),
        ("c", round(1 / 62, 6)),
    ]


def test_hybrid_and_builder_validation(dense, bm25, passages):
    with pytest.raises(ValueError, match="unknown fusion 'max'"):
        HybridRetriever(dense, bm25, fusion="max")
    with pytest.raises(ValueError, match="unknown retriever kind"):
        build_retriever(passages, kind="splade")
    with pytest.raises(TypeError, match="unexpected keyword"):
        build_retriever(passages, kind="bm25", index_factory="Flat")
    built = build_retriever(passages[:30], kind="bm25", k1=1.2, b=0.5)
    assert isinstance(built, BM25Retriever) and (built.k1, built.b) == (1.2, 0.5)


def test_build_hybrid_routes_options(passages, embedder):
    hybrid = build_retriever(passages[:30], embedder=embedder, show_progress=False, k1=1.2, fusion="rrf", candidates=10)
    assert isinstance(hybrid, HybridRetriever) and hybrid.fusion == "rrf" and hybrid.candidates == 10
    assert isinstance(hybrid.dense, DenseRetriever) and hybrid.sparse.k1 == 1.2
    assert _ids(hybrid.retrieve("ABBA", 1)) == ["ABBA"]


def test_index_relevance_reads_a_passage_text_by_its_passage_and_embeds_other_texts(dense, passages, tiny_lm, monkeypatch):
    from nest_integrations.index.nest_index import NestIndex

    index = NestIndex(tiny_lm, passages, dense, retriever_kind="dense")
    indexed = passages[3]
    window = indexed.text.split(". ")[0] + "."
    query = "Who was " + indexed.id + "?"
    got = index.relevance(query, [indexed.text, window, indexed.text])
    # an indexed text has its passage's ("title: text") vector, any other text is embedded as it is
    passage_vector, window_vector = dense.passage_vectors([indexed, Passage(id="window", text=window)])
    q = dense.embed_queries([query])[0]
    # bit for bit the dot products of the same matrix (a row's bits may depend on its place in it)
    assert got == [float(x) for x in np.stack([passage_vector, window_vector, passage_vector]) @ q]
    asked = []
    monkeypatch.setattr(dense, "passage_vectors", lambda ps: asked.append(ps))
    assert index.relevance(query, [window, indexed.text]) == [float(x) for x in np.stack([window_vector, passage_vector]) @ q]
    assert asked == [], "both vectors are cached by text"
    assert index.relevance(query, []) == []
