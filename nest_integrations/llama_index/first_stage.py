"""LlamaIndex retrievers and vector stores as NEST's first stage.

* :class:`LlamaIndexPassageRetriever`: any LlamaIndex retriever, what
  :class:`~nest_integrations.llama_index.NestLLM` retrieves with.
* :class:`LlamaIndexVectorStoreRetriever`: a vector store already holding a
  corpus (or its ``VectorStoreIndex``), for
  :func:`~nest_integrations.index.foreign_store.store_decoder`.

Retrieved nodes map to passages with
:func:`~nest_integrations.llama_index.node_to_passage`: id = node id, text =
the node's content without metadata, ``doc_id`` = ``ref_doc_id``,
``doc_char_start`` = ``start_char_idx``, so a copy can run on into the next
chunk of a document.
"""

from __future__ import annotations

import logging
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.types import BasePydanticVectorStore

from nest_integrations.core.similarity import Relevance, embedding_relevance
from nest_integrations.retrieval.base import BatchRetrieverMixin, ScoredPassage
from ._common import default_embed_model, nodes_to_scored_passages

__all__ = ["LlamaIndexPassageRetriever", "LlamaIndexVectorStoreRetriever"]

logger = logging.getLogger(__name__)


class LlamaIndexPassageRetriever(BatchRetrieverMixin):
    """Any LlamaIndex retriever as a NEST first stage (:class:`~nest_integrations.retrieval.base.PassageRetriever`).

    Retrieved nodes become passages with :func:`~nest_integrations.llama_index.node_to_passage` and enter the
    token datastore lazily. The LlamaIndex retriever decides how many nodes it
    returns (e.g. ``similarity_top_k``); at most ``k`` of them are kept.
    """

    def __init__(self, retriever: BaseRetriever):
        self.retriever = retriever

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        results = []
        for query in queries:
            hits = nodes_to_scored_passages(self.retriever.retrieve(query))[:k]
            logger.debug("retrieved %d node(s) for %r", len(hits), query[:80])
            results.append(hits)
        return results


class LlamaIndexVectorStoreRetriever(BatchRetrieverMixin):
    """A LlamaIndex vector store (``BasePydanticVectorStore``) or ``VectorStoreIndex`` as a NEST first stage.

    Build its decoder with :func:`~nest_integrations.index.foreign_store.store_decoder`.

    Args:
        store: the store or index. A bare store is wrapped in
            ``VectorStoreIndex.from_vector_store`` with ``embed_model``.
        embed_model: the LlamaIndex embedding that built the store's vectors
            (None: the index's own, else the bundled MiniLM); it embeds queries
            and, for the relevance gate, retrieved passages.

    Attributes:
        relevance: the relevance gate's cosine function: ``embed_model`` embeds
            the query and the texts (:func:`~nest_integrations.core.similarity.embedding_relevance`).

    Raises:
        ValueError: ``store`` is neither a vector store nor a VectorStoreIndex,
            or a vector store that keeps no text (e.g. ``SimpleVectorStore``:
            pass its index instead).
    """

    def __init__(self, store: Any, embed_model: Any = None):
        if isinstance(store, VectorStoreIndex):
            self.index = store
            self.embed_model = embed_model or store._embed_model
        elif isinstance(store, BasePydanticVectorStore):
            if not store.stores_text:
                raise ValueError(
                    f"{type(store).__name__} keeps no text, and NEST encodes the retrieved passages' text; "
                    "pass the VectorStoreIndex whose docstore holds it"
                )
            self.embed_model = embed_model or default_embed_model()
            self.index = VectorStoreIndex.from_vector_store(store, embed_model=self.embed_model)
        else:
            raise ValueError(f"expected a LlamaIndex BasePydanticVectorStore or VectorStoreIndex, got {type(store).__name__}")
        self.relevance: Relevance = embedding_relevance(self.embed_model.get_query_embedding, self.embed_model.get_text_embedding_batch)

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        retriever = self.index.as_retriever(similarity_top_k=k)
        return [nodes_to_scored_passages(retriever.retrieve(query))[:k] for query in queries]
