"""Foreign vector stores as NEST's first stage.

A LangChain ``VectorStore`` (Qdrant, Chroma, PGVector...) or a LlamaIndex
vector store / ``VectorStoreIndex`` already holding a corpus can rank passages
for NEST: the adapters here implement :class:`~nest_integrations.retrieval.PassageRetriever`
over them, and :func:`store_decoder` builds a :class:`~nest_integrations.decoding.decoder.NestDecoder`
whose token datastore starts empty and encodes each retrieved passage lazily,
the first time it is retrieved (its text comes from the store). Nothing of the
store is copied; the store decides scores (its own scale) and NEST only uses
their order.

Mapping a store's documents to :class:`~nest_integrations.corpus.passages.Passage`:

* LangChain (:func:`~nest_integrations.langchain.documents.document_to_passage`):
  id = the document's id (Qdrant: the point id), text = ``page_content``,
  title = ``metadata["title"]``, and ``metadata["source"]`` with
  ``metadata["start_index"]`` (what a text splitter with ``add_start_index``
  writes) become ``doc_id`` / ``doc_char_start``, so copying can run on from
  one chunk into the next chunk of its document when both were retrieved.
* LlamaIndex (:func:`~nest_integrations.llama_index._common.node_to_passage`):
  id = node id, ``doc_id`` = ``ref_doc_id``, ``doc_char_start`` = ``start_char_idx``.

Qdrant's local mode (``QdrantClient(path=...)``, no server) is wired in with
:func:`write_qdrant` and :func:`open_qdrant` (extra ``qdrant``); the
adapters themselves need only the ``langchain`` or ``llama-index`` extra.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from nest_integrations.core.similarity import Relevance, embedding_relevance
from nest_integrations.corpus.passages import Passage
from .base import BatchRetrieverMixin, ScoredPassage, index_text

if TYPE_CHECKING:  # pragma: no cover
    from langchain_core.embeddings import Embeddings
    from langchain_qdrant import QdrantVectorStore

    from nest_integrations.core.config import NestConfig
    from nest_integrations.decoding.decoder import NestDecoder
    from nest_integrations.model.lm import LoadedLM

logger = logging.getLogger(__name__)


def _require(module: str, extra: str) -> None:
    """Import ``module`` or raise an ImportError naming the extra that provides it."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{module} is missing: pip install 'nest-integrations[{extra}]'") from err


class LangChainVectorStoreRetriever(BatchRetrieverMixin):
    """Any LangChain ``VectorStore`` or ``BaseRetriever`` as a NEST first stage.

    A vector store is searched with ``similarity_search_with_score(query, k)``;
    a retriever is invoked and cut to ``k`` (scored ``1 / rank``).

    Attributes:
        store: the wrapped store or retriever.
        relevance: the relevance gate's cosine function, from the store's
            ``embeddings`` (None when it has none: the gate is then off).

    Raises:
        ImportError: langchain-core is missing (extra ``langchain``).
        ValueError: ``store`` is neither a VectorStore nor a BaseRetriever.
    """

    def __init__(self, store: Any):
        _require("langchain_core", "langchain")
        from langchain_core.retrievers import BaseRetriever
        from langchain_core.vectorstores import VectorStore

        from nest_integrations.langchain._common import relevance_function

        if not isinstance(store, (VectorStore, BaseRetriever)):
            raise ValueError(f"expected a LangChain VectorStore or BaseRetriever, got {type(store).__name__}")
        self.store = store
        self.relevance: Optional[Relevance] = relevance_function(store)

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        from nest_integrations.langchain._common import retrieve_passages

        return [retrieve_passages(self.store, query, k) for query in queries]


class LlamaIndexVectorStoreRetriever(BatchRetrieverMixin):
    """A LlamaIndex vector store (``BasePydanticVectorStore``) or ``VectorStoreIndex`` as a NEST first stage.

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
        ImportError: llama-index-core is missing (extra ``llama-index``).
        ValueError: ``store`` is neither a vector store nor a VectorStoreIndex,
            or a vector store that keeps no text (e.g. ``SimpleVectorStore``:
            pass its index instead).
    """

    def __init__(self, store: Any, embed_model: Any = None):
        _require("llama_index.core", "llama-index")
        from llama_index.core import VectorStoreIndex
        from llama_index.core.vector_stores.types import BasePydanticVectorStore

        from nest_integrations.llama_index._common import default_embed_model

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
        from nest_integrations.llama_index._common import nodes_to_scored_passages

        retriever = self.index.as_retriever(similarity_top_k=k)
        return [nodes_to_scored_passages(retriever.retrieve(query))[:k] for query in queries]


def store_decoder(
    retriever: Any,
    lm: "LoadedLM",
    config: Optional["NestConfig"] = None,
    *,
    key_layer: str = "ffn_input",
    encoding_prefix: Optional[str] = "auto",
    cache_mb: float = 1024.0,
) -> "NestDecoder":
    """A NEST decoder whose first stage is ``retriever`` (e.g. a :class:`LangChainVectorStoreRetriever`).

    The token datastore starts empty: each passage the store returns is added
    when retrieved and encoded by ``lm`` on first use, then kept in an LRU
    cache of ``cache_mb`` megabytes (``2 * hidden_size`` bytes per token), so
    the first generation over new passages pays their encoding (about 0.3 s
    per 8 passages of ~100 tokens on 2 CPU cores for the default LM).
    The relevance gate uses ``retriever.relevance`` when it has one.

    No calibration: a foreign store cannot list its documents to fit alpha/tau
    on, so a config that leaves them None gets the defaults (0.3 / 0.1, chosen
    on SmolLM2-135M-Instruct). For another LM, fit them on a
    :class:`~nest_integrations.index.nest_index.NestIndex` or a ``NestVectorStore`` over a
    sample of the corpus (``calibrate()``) and pass ``alpha`` / ``tau`` in ``config``.
    """
    from nest_integrations.decoding.decoder import NestDecoder
    from nest_integrations.store.datastore import PassageEncoder, TokenDatastore

    datastore = TokenDatastore([], PassageEncoder(lm, key_layer, encoding_prefix), cache_mb=cache_mb)
    return NestDecoder(lm, datastore, retriever, config, relevance=getattr(retriever, "relevance", None))


# --------------------------------------------------------------------------- Qdrant local mode
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

    from nest_integrations.langchain.documents import default_embeddings

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

    from nest_integrations.langchain.documents import default_embeddings

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
