"""The one cosine helper and the embedding-backed relevance (nest_integrations.core.similarity)."""

from __future__ import annotations

import numpy as np
import pytest

from nest_integrations.core.similarity import cosine_similarities, embedding_relevance, unit_rows


def test_cosine_similarities_normalise_both_sides_in_float32():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5, 16)) * 3.0  # float64, not unit
    query = rng.standard_normal(16)
    got = cosine_similarities(query.tolist(), vectors)
    expected = vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    assert all(isinstance(x, float) for x in got)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # the arithmetic is fixed: float32 unit rows, then one float32 product
    exact = unit_rows(vectors) @ unit_rows(query[None, :])[0]
    assert got == [float(x) for x in exact]


def test_cosine_similarities_edge_cases():
    assert cosine_similarities([1.0, 0.0], np.zeros((0, 0), dtype=np.float32)) == []
    assert cosine_similarities([1.0, 0.0], [[0.0, 0.0], [2.0, 0.0]]) == [0.0, 1.0]  # a zero row has cosine 0
    assert cosine_similarities([0.0, 0.0], [[1.0, 0.0]]) == [0.0]
    with pytest.raises(ValueError, match="query embedding has 3 dimensions but the vectors have 2"):
        cosine_similarities([1.0, 0.0, 0.0], [[1.0, 0.0]])
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        cosine_similarities([1.0, 0.0], [1.0, 0.0])


def test_normalised_vectors_are_used_as_they_are():
    rng = np.random.default_rng(1)
    vectors = unit_rows(rng.standard_normal((50, 32)))
    query = unit_rows(rng.standard_normal((1, 32)))[0]
    assert cosine_similarities(query, vectors, normalised=True) == [float(x) for x in vectors @ query]


def test_embedding_relevance_embeds_query_and_texts():
    table = {"q": [1.0, 0.0], "same": [2.0, 0.0], "orthogonal": [0.0, 5.0], "opposite": [-1.0, 0.0]}
    calls = []

    def embed_texts(texts):
        calls.append(texts)
        return [table[t] for t in texts]

    relevance = embedding_relevance(lambda q: table[q], embed_texts)
    assert relevance("q", ("same", "orthogonal", "opposite")) == [1.0, 0.0, -1.0]
    assert calls == [["same", "orthogonal", "opposite"]]  # one call, as a list
    assert relevance("q", []) == [] and len(calls) == 1  # nothing embedded for no texts
