"""Qdrant's local mode (``QdrantClient(path=...)``, no server) as a NEST first stage.

:func:`write_qdrant` writes passages into a collection of a local Qdrant folder,
and :func:`open_qdrant` opens one as a LangChain ``QdrantVectorStore``, for
:class:`~nest_integrations.langchain.first_stage.LangChainVectorStoreRetriever`
and :func:`~nest_integrations.index.foreign_store.store_decoder` (what
``nest index to-qdrant`` and ``nest generate --qdrant-path`` run). A point
carries the passage's text as ``page_content`` and, in its metadata, what
:func:`~nest_integrations.langchain.documents.document_to_passage` reads back:
the title, and ``source`` / ``start_index`` so chunks of one document chain.
Needs the ``qdrant`` extra.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from nest_integrations.corpus.passages import Passage
from nest_integrations.retrieval.base import index_text
from .documents import default_embeddings

if TYPE_CHECKING:  # pragma: no cover
    from langchain_core.embeddings import Embeddings
    from langchain_qdrant import QdrantVectorStore

__all__ = ["open_qdrant", "qdrant_point_id", "write_qdrant"]

logger = logging.getLogger(__name__)


def _require(module: str, extra: str) -> None:
    """Import ``module`` or raise an ImportError naming the extra that provides it."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{module} is missing: pip install 'nest-integrations[{extra}]'") from err


def _qdrant_metadata(passage: Passage) -> dict[str, Any]:
    """What :func:`write_qdrant` stores beside a passage's text, so that reading it back gives
    the same title and chunk continuity (``source`` / ``start_index``) and names the passage."""
    metadata = {**passage.metadata, "passage_id": passage.id, "title": passage.title}
    if passage.doc_id:
        metadata.update(source=passage.doc_id, start_index=passage.doc_char_start)
    return metadata


def qdrant_point_id(passage_id: str) -> str:
    """The Qdrant point id of a passage: a UUID5 of its id (Qdrant accepts only UUIDs and integers)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"nest-passage:{passage_id}"))


def write_qdrant(
    passages: Sequence[Passage],
    path: str | Path,
    collection: str,
    embeddings: Optional["Embeddings"] = None,
    *,
    overwrite: bool = False,
    batch_size: int = 64,
) -> int:
    """Write ``passages`` into a collection of a local Qdrant folder (no server) and close it.

    Points are embedded from ``"title: text"`` (as the dense retriever does)
    and carry the text as ``page_content``; ids are :func:`qdrant_point_id`.

    Args:
        embeddings: LangChain embeddings (None: the bundled MiniLM).
        overwrite: replace an existing collection of that name; without it an
            existing collection is refused.

    Returns:
        The number of points written.

    Raises:
        ImportError: the qdrant extra is missing.
        ValueError: no passages, the collection exists and ``overwrite`` is False,
            or the folder's storage cannot be read (see :func:`open_qdrant`; nothing
            is deleted then, even with ``overwrite``).
    """
    _require("langchain_qdrant", "qdrant")
    from langchain_qdrant import QdrantVectorStore
    from qdrant_client import models

    passages = list(passages)
    if not passages:
        raise ValueError("no passages to write to Qdrant")
    embeddings = embeddings or default_embeddings()
    client = _local_client(path)
    try:
        if client.collection_exists(collection):
            if not overwrite:
                raise ValueError(f"{path} already has a Qdrant collection {collection!r}; pass overwrite=True (CLI: --force)")
            client.delete_collection(collection)
        dim = len(embeddings.embed_query("dimension probe"))
        client.create_collection(collection, vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE))
        store = QdrantVectorStore(client=client, collection_name=collection, embedding=embeddings)
        for start in range(0, len(passages), batch_size):
            batch = passages[start : start + batch_size]
            vectors = embeddings.embed_documents([index_text(p) for p in batch])
            client.upsert(
                collection,
                points=[
                    models.PointStruct(
                        id=qdrant_point_id(p.id), vector=list(map(float, v)),
                        payload={store.content_payload_key: p.text, store.metadata_payload_key: _qdrant_metadata(p)},
                    )
                    for p, v in zip(batch, vectors)
                ],
            )
    finally:
        client.close()
    logger.info("wrote %d passages to Qdrant collection %r in %s", len(passages), collection, path)
    return len(passages)


def open_qdrant(path: str | Path, collection: str, embeddings: Optional["Embeddings"] = None) -> "QdrantVectorStore":
    """A LangChain ``QdrantVectorStore`` over a collection of a local Qdrant folder.

    Local mode locks the folder: one open client per folder per process; close
    it with ``store.client.close()``.

    Raises:
        ImportError: the qdrant extra is missing.
        ValueError: no Qdrant folder at ``path``; no such collection (the existing
            ones are named); a collection whose vectors have another dimension than
            ``embeddings`` give (it was written with other embeddings); or storage
            that cannot be read (corrupted, not Qdrant's, or open in another
            process). Each message names the folder and the collection, and
            nothing in the folder is changed.
    """
    _require("langchain_qdrant", "qdrant")
    from langchain_qdrant import QdrantVectorStore
    from langchain_qdrant.qdrant import QdrantVectorStoreError

    if not Path(path).is_dir():
        raise ValueError(f"{path} is not a local Qdrant folder")
    embeddings = embeddings or default_embeddings()
    client = _local_client(path)
    try:
        if not client.collection_exists(collection):
            names = sorted(c.name for c in client.get_collections().collections)
            raise ValueError(f"{path} has no Qdrant collection {collection!r}; it has {names or 'none'}")
        stored = client.get_collection(collection).config.params.vectors
        stored_dim = getattr(stored, "size", None)  # None for named vectors: left to langchain-qdrant's check
        dim = len(embeddings.embed_query("dimension probe"))
        mismatch = f"the Qdrant collection {collection!r} in {path} holds {stored_dim}-d vectors, the embeddings give {dim}-d"
        if stored_dim is not None and stored_dim != dim:
            raise ValueError(f"{mismatch}: {_OTHER_EMBEDDINGS}")
        try:
            return QdrantVectorStore(client=client, collection_name=collection, embedding=embeddings)
        except QdrantVectorStoreError as err:  # its advice, force_recreate, would delete the collection
            reason = str(err).split(" If you want to recreate", 1)[0]
            raise ValueError(f"the Qdrant collection {collection!r} in {path} does not fit these embeddings ({reason}): {_OTHER_EMBEDDINGS}") from None
    except BaseException:
        client.close()  # local mode locks the folder until its client closes
        raise


_OTHER_EMBEDDINGS = (
    "open it with the embeddings that wrote it (nest index to-qdrant writes with the bundled MiniLM, 384-d), "
    "or write the passages into a new collection; the collection was left as it is"
)


def _local_client(path: str | Path) -> Any:
    """A ``QdrantClient`` of the local Qdrant folder ``path`` (created when missing).

    Raises:
        ValueError: the folder's storage cannot be read: corrupted (``file is not
            a database``, a broken ``meta.json``), not Qdrant's, or locked by a
            client in another process. Nothing is changed.
    """
    import sqlite3

    from qdrant_client import QdrantClient

    try:
        return QdrantClient(path=str(path))
    except (sqlite3.DatabaseError, ValueError, KeyError, TypeError, OSError, RuntimeError) as err:  # a JSONDecodeError is a ValueError
        raise ValueError(
            f"{path}: the local Qdrant storage cannot be read ({type(err).__name__}: {err}); it is corrupted, not a "
            "Qdrant folder, or open in another process. Nothing was changed: restore it from a backup, close the "
            "other process, or write the passages into another folder (nest index to-qdrant --qdrant-path NEW)"
        ) from err
