"""Cosine relevance of texts to a query: the one interface the index and both integrations share.

* :data:`Relevance`: ``(query, texts) -> cosine of each text to the query``, what
  :class:`~nest_integrations.decoding.decoder.NestDecoder` asks about its retrieved passages (for the
  relevance gate, :class:`~nest_integrations.policy.relevance.RelevanceGate`) and its candidate answer
  windows (:class:`~nest_integrations.policy.selection.AnswerSelector`).
* :func:`unit_rows` and :func:`cosine_similarities`: the one L2 normalisation and the one cosine.
* :func:`embedding_relevance`: a :data:`Relevance` over an embedding model's two functions
  (LangChain ``embed_query`` / ``embed_documents``, LlamaIndex ``get_query_embedding`` /
  ``get_text_embedding_batch``), embedding every text on each call.

Those that already hold vectors for their texts look them up by text and use
:func:`cosine_similarities`: :meth:`NestIndex.relevance <nest_integrations.index.nest_index.NestIndex.relevance>`
(the dense retriever's passage vectors) and the LangChain ``NestVectorStore.relevance`` (its stored vectors).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = ["Relevance", "cosine_similarities", "embedding_relevance", "unit_rows"]

Relevance = Callable[[str, Sequence[str]], list[float]]
"""``(query, texts) -> similarities``: the cosine similarity (a float in [-1, 1], higher is
closer) of each text to ``query`` under one embedding model, one per text and in their order;
``[]`` for no texts. The relevance gate compares these with its thresholds
(``NestConfig.min_passage_relevance``...), so an implementation keeps its arithmetic fixed."""


def unit_rows(vectors: np.ndarray | Sequence[Sequence[float]], *, min_norm: float = float(np.finfo(np.float32).tiny)) -> np.ndarray:
    """``vectors`` (n, d) as float32 rows of unit L2 norm (a row of zeros stays zero).

    The rows are converted to float32 first and divided by their float32 norm,
    or by ``min_norm`` (as float32) when that is larger. The default, float32's
    smallest normal number, makes every nonzero row a unit vector; with a larger
    floor (the dense retriever's ``1e-12``) a row shorter than the floor stays
    shorter than unit (its norm over the floor).
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(min_norm))


def cosine_similarities(
    query_vector: np.ndarray | Sequence[float],
    vectors: np.ndarray | Sequence[Sequence[float]],
    *,
    normalised: bool = False,
) -> list[float]:
    """Cosine similarity of each row of ``vectors`` to ``query_vector``, in row order.

    Args:
        query_vector: shape (d,), any float dtype or a list of floats.
        vectors: shape (n, d); ``n == 0`` gives ``[]`` whatever ``d``.
        normalised: both are unit L2 vectors already (the dense retriever's float32
            embeddings), so they are used as they are: normalising them again moves some
            rows by a float32 ulp, and the cosines would then differ in their last bits from
            the dot products the index's gate was tuned on.

    Both are converted to float32 and, unless ``normalised``, L2-normalised
    (:func:`unit_rows`), then multiplied: each cosine is a float32 dot product,
    returned as a Python float; a zero vector has cosine 0 to everything.

    Raises:
        ValueError: ``vectors`` is not 2-D, or ``d`` differs between the two (the
            query was embedded by another model than the vectors).
    """
    q = np.asarray(query_vector, dtype=np.float32).reshape(1, -1)
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected vectors of shape (n, d), got {vectors.shape}")
    if vectors.shape[0] == 0:
        return []
    if vectors.shape[1] != q.shape[1]:
        raise ValueError(
            f"the query embedding has {q.shape[1]} dimensions but the vectors have {vectors.shape[1]}; "
            "use the embeddings the vectors were made with"
        )
    if not normalised:
        q, vectors = unit_rows(q), unit_rows(vectors)
    return [float(x) for x in vectors @ q[0]]


def embedding_relevance(
    embed_query: Callable[[str], Sequence[float]],
    embed_texts: Callable[[list[str]], Sequence[Sequence[float]]],
) -> Relevance:
    """A :data:`Relevance` that embeds the query with ``embed_query`` and the texts, in one
    call, with ``embed_texts``, then compares them with :func:`cosine_similarities`.

    Nothing is cached: each call embeds its texts again (one model forward per call
    of the gate). No texts: ``[]``, and neither function is called.
    """

    def relevance(query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        q = embed_query(query)
        return cosine_similarities(q, np.asarray(embed_texts(list(texts)), dtype=np.float32))

    return relevance
