"""LangChain retrievers and vector stores as NEST's first stage.

* :func:`retrieve_passages` turns the output of any LangChain ``BaseRetriever``
  or ``VectorStore`` into the ``(Passage, score)`` pairs
  :meth:`NestDecoder.stream` accepts as its first stage (each document through
  :func:`~nest_integrations.langchain.documents.document_to_passage`).
* :func:`relevance_function` gives the decoder's relevance gate its
  :data:`~nest_integrations.core.similarity.Relevance`, from the store's ``Embeddings``.
* :class:`LangChainVectorStoreRetriever`: a store (Qdrant, Chroma, PGVector...)
  already holding a corpus as a :class:`~nest_integrations.retrieval.base.PassageRetriever`,
  for :func:`~nest_integrations.index.foreign_store.store_decoder`.

A store's document maps to a :class:`~nest_integrations.corpus.passages.Passage` with
:func:`~nest_integrations.langchain.documents.document_to_passage`: id = the
document's id (Qdrant: the point id), text = ``page_content``, title =
``metadata["title"]``, and ``metadata["source"]`` with ``metadata["start_index"]``
(what a text splitter with ``add_start_index`` writes) become ``doc_id`` /
``doc_char_start``, so copying can run on from one chunk into the next chunk of
its document when both were retrieved.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever

from nest_integrations.core.similarity import Relevance, embedding_relevance
from nest_integrations.corpus.passages import Passage
from nest_integrations.retrieval.base import BatchRetrieverMixin, ScoredPassage
from .documents import document_to_passage
from .vectorstores import NestVectorStore

__all__ = ["LangChainVectorStoreRetriever", "PassageSource", "relevance_function", "retrieve_passages"]

PassageSource = Union[BaseRetriever, VectorStore]
"""What may serve NEST's first stage: any LangChain retriever or vector store."""


def retrieve_passages(source: PassageSource, query: str, k: int) -> list[tuple[Passage, float]]:
    """The first stage: the top ``k`` documents of ``source`` for ``query`` as passages, best first.

    A ``VectorStore`` is searched with ``similarity_search_with_score`` (its own
    score scale; stores without scores fall back to ``similarity_search``). A
    ``BaseRetriever`` is invoked and its documents are cut to ``k``; they are
    scored ``1 / rank``. The decoder only uses the order.
    """
    if not query.strip():
        return []
    if isinstance(source, VectorStore):
        try:
            hits = source.similarity_search_with_score(query, k=k)
        except NotImplementedError:
            hits = _rank_scored(source.similarity_search(query, k=k))
    else:
        hits = _rank_scored(source.invoke(query)[:k])
    return [(document_to_passage(doc), float(score)) for doc, score in hits]


def _rank_scored(documents: Sequence[Document]) -> list[tuple[Document, float]]:
    return [(doc, 1.0 / rank) for rank, doc in enumerate(documents, start=1)]


def relevance_function(source: Optional[PassageSource]) -> Optional[Relevance]:
    """The relevance gate's cosine function for ``source``, or None (gate off).

    A :class:`~nest_integrations.langchain.NestVectorStore` compares the query
    embedding with its stored vectors (:meth:`NestVectorStore.relevance`). Another
    vector store (or a ``VectorStoreRetriever`` over one) that exposes ``embeddings``
    embeds the query and re-embeds the texts (``embed_query`` / ``embed_documents``,
    :func:`~nest_integrations.core.similarity.embedding_relevance`). Other retrievers
    have no embeddings to compare with.
    """
    store = source.vectorstore if isinstance(source, VectorStoreRetriever) else source
    if isinstance(store, NestVectorStore):
        return store.relevance
    embeddings = store.embeddings if isinstance(store, VectorStore) else None
    if embeddings is None:
        return None
    return embedding_relevance(embeddings.embed_query, embeddings.embed_documents)


class LangChainVectorStoreRetriever(BatchRetrieverMixin):
    """Any LangChain ``VectorStore`` or ``BaseRetriever`` as a NEST first stage.

    A vector store is searched with ``similarity_search_with_score(query, k)``;
    a retriever is invoked and cut to ``k`` (scored ``1 / rank``): see
    :func:`retrieve_passages`. Build its decoder with
    :func:`~nest_integrations.index.foreign_store.store_decoder`.

    Args:
        store: a LangChain ``VectorStore`` that keeps the documents' text (e.g.
            ``langchain_qdrant.QdrantVectorStore``), or any ``BaseRetriever``.

    Attributes:
        store: the wrapped store or retriever.
        relevance: the relevance gate's cosine function, from the store's
            ``embeddings`` (None when it has none: the gate is then off).

    Raises:
        ValueError: ``store`` is neither a VectorStore nor a BaseRetriever.
    """

    def __init__(self, store: Any):
        if not isinstance(store, (VectorStore, BaseRetriever)):
            raise ValueError(f"expected a LangChain VectorStore or BaseRetriever, got {type(store).__name__}")
        self.store = store
        self.relevance: Optional[Relevance] = relevance_function(store)

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        return [retrieve_passages(self.store, query, k) for query in queries]
