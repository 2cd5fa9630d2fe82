"""NestVectorStore: an in-memory LlamaIndex vector store that also keeps NEST's
token-level datastore in step with its nodes.

Persisted layout (``persist_path`` is the manifest, as LlamaIndex's
``StorageContext.persist`` names it, e.g. ``storage/default__vector_store.json``)::

    default__vector_store.json             manifest: format, version, settings, counts, sha256 of both files
    default__vector_store.nodes.json       node records (ids, text, metadata, relationships)
    default__vector_store.embeddings.npy   float32 (n, d) embeddings, saved with allow_pickle=False

Loading never executes code from the files; every file is checked against its
checksum, so a modified or truncated file is a ``ValueError``, never silent garbage.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import fsspec
import numpy as np
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    DEFAULT_PERSIST_DIR,
    BasePydanticVectorStore,
    FilterCondition,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import (
    build_metadata_filter_fn,
    metadata_dict_to_node,
    node_to_metadata_dict,
)

from ..datastore import PassageEncoder, TokenDatastore
from ..lm import parse_key_layer
from ._common import node_to_passage, unit_rows

if TYPE_CHECKING:  # pragma: no cover
    from ..lm import LoadedLM

logger = logging.getLogger(__name__)

FORMAT = "nest-integrations/llama-index-vector-store"
FORMAT_VERSION = 1
DEFAULT_NAMESPACE = "default"
_MANIFEST_SUFFIX = "__vector_store.json"
_COMBINE: dict[FilterCondition, Callable[[list[bool]], bool]] = {
    FilterCondition.AND: all,
    FilterCondition.OR: any,
    FilterCondition.NOT: lambda matches: not any(matches),
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _companion_paths(persist_path: str) -> dict[str, str]:
    """Data files written beside the manifest, named after it."""
    stem = persist_path[: -len(".json")] if persist_path.endswith(".json") else persist_path
    return {"nodes": f"{stem}.nodes.json", "embeddings": f"{stem}.embeddings.npy"}


def _write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with fs.open(tmp, "wb") as handle:
        handle.write(data)
    fs.mv(tmp, path)


class NestVectorStore(BasePydanticVectorStore):
    """In-memory vector store (cosine similarity) whose nodes also form NEST's token datastore.

    Use it like any LlamaIndex vector store::

        store = NestVectorStore()
        index = VectorStoreIndex.from_documents(
            docs, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
        )
        llm = NestLLM("default", retriever=index)  # shares the store's token datastore

    The token datastore (:meth:`token_datastore`) is created for an LM on first
    use and follows every change: added or replaced nodes enter it at once
    (new text is encoded lazily, on first retrieval), deleted ones leave it,
    and the other nodes keep their cached keys.

    Args:
        lm: the LM whose hidden states are the datastore keys; optional, a
            :class:`~nest_integrations.llama_index.NestLLM` built over the store
            supplies its own.
    """

    stores_text: bool = True
    is_embedding_query: bool = True
    key_layer: str = Field(
        default="ffn_input",
        description="Layer whose hidden states are the datastore keys: 'ffn_input' or 'layer:<i>'.",
    )
    encoding_prefix: Optional[str] = Field(
        default="auto",
        description="Text placed before each passage when encoding keys: 'auto', 'chat', or a literal string.",
    )
    cache_mb: float = Field(default=1024.0, gt=0, description="Bound of the lazy key cache in megabytes.")

    _records: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)
    _vectors: dict[str, np.ndarray] = PrivateAttr(default_factory=dict)
    _table: Optional[tuple[list[str], np.ndarray]] = PrivateAttr(default=None)
    _lm: Optional[LoadedLM] = PrivateAttr(default=None)
    _datastore: Optional[TokenDatastore] = PrivateAttr(default=None)
    _lock: threading.RLock = PrivateAttr(default_factory=threading.RLock)

    def __init__(self, lm: Optional[LoadedLM] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lm = lm

    @field_validator("key_layer")
    @classmethod
    def _check_key_layer(cls, value: str) -> str:
        parse_key_layer(value)
        return value

    @classmethod
    def class_name(cls) -> str:
        return "NestVectorStore"

    @property
    def client(self) -> None:
        """No external client: the store lives in memory."""
        return None

    @property
    def lm(self) -> Optional[LoadedLM]:
        """The LM of the token datastore (None until one is given)."""
        return self._lm

    # ------------------------------------------------------------------ token datastore
    def token_datastore(self, lm: Optional[LoadedLM] = None) -> TokenDatastore:
        """NEST's token datastore over the stored nodes, created on first use.

        Args:
            lm: the LM to key the datastore with; binds it when the store has none.

        Raises:
            ValueError: no LM is known, or ``lm`` differs from the store's LM.
        """
        with self._lock:
            if lm is not None and lm is not self._lm:
                if self._lm is None:
                    self._lm = lm
                elif lm.fingerprint() != self._lm.fingerprint():
                    raise ValueError(
                        f"this NestVectorStore keys its datastore with LM {self._lm.name!r}; "
                        f"{lm.name!r} has other weights. Use one LM per store."
                    )
            if self._lm is None:
                raise ValueError(
                    "NestVectorStore has no LM for its token datastore: pass lm= to it or to token_datastore()"
                )
            if self._datastore is None:
                passages = [node_to_passage(metadata_dict_to_node(r)) for r in self._records.values()]
                encoder = PassageEncoder(self._lm, self.key_layer, self.encoding_prefix)
                self._datastore = TokenDatastore(passages, encoder, cache_mb=self.cache_mb)
            return self._datastore

    # ------------------------------------------------------------------ writes
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> List[str]:
        """Store nodes with their embeddings (a known id is replaced); all or nothing.

        Raises:
            ValueError: a node has no embedding, or its dimension differs from the store's.
        """
        with self._lock:
            dim = next(iter(self._vectors.values())).shape[0] if self._vectors else None
            vectors = []
            for node in nodes:
                if node.embedding is None:
                    raise ValueError(
                        f"node {node.node_id!r} has no embedding; add nodes through VectorStoreIndex "
                        "(which embeds them) or set node.embedding"
                    )
                vector = np.asarray(node.embedding, dtype=np.float32)
                if vector.ndim != 1 or (dim is not None and vector.shape[0] != dim):
                    raise ValueError(
                        f"node {node.node_id!r} has an embedding of shape {vector.shape}; "
                        f"the store holds {dim}-d vectors"
                    )
                dim = vector.shape[0]
                vectors.append(vector)
            for node, vector in zip(nodes, vectors, strict=True):
                self._records[node.node_id] = node_to_metadata_dict(node, remove_text=False, flat_metadata=False)
                self._vectors[node.node_id] = vector
                if self._datastore is not None:
                    self._datastore.add(node_to_passage(node))
            self._table = None
        return [node.node_id for node in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the source document ``ref_doc_id``."""
        with self._lock:
            self._remove([i for i, record in self._records.items() if record.get("ref_doc_id") == ref_doc_id])

    def delete_nodes(
        self,
        node_ids: Optional[List[str]] = None,
        filters: Optional[MetadataFilters] = None,
        **delete_kwargs: Any,
    ) -> None:
        """Delete the nodes matching both ``node_ids`` and ``filters`` (None: no restriction)."""
        with self._lock:
            self._remove(self._select(node_ids=node_ids, filters=filters))

    def clear(self) -> None:
        """Delete every node."""
        with self._lock:
            self._remove(list(self._records))

    def _remove(self, node_ids: Sequence[str]) -> None:
        for node_id in node_ids:
            del self._records[node_id]
            del self._vectors[node_id]
        if node_ids:
            self._table = None
            if self._datastore is not None:
                self._datastore.remove(node_ids)
            logger.debug("deleted %d node(s)", len(node_ids))

    # ------------------------------------------------------------------ reads
    def _filter_fn(self, filters: MetadataFilters) -> Callable[[str], bool]:
        """Node-id predicate for ``filters``, nested filter groups included."""
        if not any(isinstance(f, MetadataFilters) for f in filters.filters):
            return build_metadata_filter_fn(self._records.__getitem__, filters)
        parts = [
            self._filter_fn(f if isinstance(f, MetadataFilters) else MetadataFilters(filters=[f]))
            for f in filters.filters
        ]
        combine = _COMBINE[filters.condition or FilterCondition.AND]
        return lambda node_id: combine([part(node_id) for part in parts])

    def _select(
        self,
        node_ids: Optional[Sequence[str]] = None,
        filters: Optional[MetadataFilters] = None,
        doc_ids: Optional[Sequence[str]] = None,
    ) -> list[str]:
        """Stored ids (insertion order) in ``node_ids``, of documents ``doc_ids``, matching ``filters``."""
        keep = self._filter_fn(filters) if filters is not None and filters.filters else None
        wanted = set(node_ids) if node_ids is not None else None
        docs = set(doc_ids) if doc_ids is not None else None
        return [
            node_id
            for node_id, record in self._records.items()
            if (wanted is None or node_id in wanted)
            and (docs is None or record.get("ref_doc_id") in docs)
            and (keep is None or keep(node_id))
        ]

    def get_nodes(
        self,
        node_ids: Optional[List[str]] = None,
        filters: Optional[MetadataFilters] = None,
    ) -> List[BaseNode]:
        """Stored nodes matching both ``node_ids`` and ``filters`` (without embeddings)."""
        with self._lock:
            selected = self._select(node_ids=node_ids, filters=filters)
            return [metadata_dict_to_node(self._records[i]) for i in selected]

    def _unit_table(self) -> tuple[list[str], np.ndarray]:
        """Stored ids and their unit-norm embeddings (cached until the next write)."""
        if self._table is None:
            ids = list(self._vectors)
            matrix = unit_rows(np.stack([self._vectors[i] for i in ids])) if ids else np.zeros((0, 0), np.float32)
            self._table = (ids, matrix)
        return self._table

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Top ``similarity_top_k`` nodes by cosine similarity, after the id, document and metadata filters
        (empty ``node_ids`` / ``doc_ids`` lists do not restrict).

        Raises:
            ValueError: a query mode other than default, or a missing or wrong-sized query embedding.
        """
        if query.mode != VectorStoreQueryMode.DEFAULT:
            raise ValueError(f"NestVectorStore supports only the default (dense) query mode, not {query.mode.value!r}")
        if query.query_embedding is None:
            raise ValueError("NestVectorStore needs a query embedding")
        with self._lock:
            ids, matrix = self._unit_table()
            # VectorIndexRetriever sends node_ids=[] for "no restriction".
            selected = set(
                self._select(node_ids=query.node_ids or None, filters=query.filters, doc_ids=query.doc_ids or None)
            )
            rows = [row for row, node_id in enumerate(ids) if node_id in selected]
            if not rows or query.similarity_top_k <= 0:
                return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
            q = unit_rows(np.asarray([query.query_embedding]))[0]
            if q.shape[0] != matrix.shape[1]:
                raise ValueError(f"query embedding is {q.shape[0]}-d; the store holds {matrix.shape[1]}-d vectors")
            scores = matrix[rows] @ q
            best = np.argsort(-scores, kind="stable")[: query.similarity_top_k]
            top_ids = [ids[rows[b]] for b in best]
            return VectorStoreQueryResult(
                nodes=[metadata_dict_to_node(self._records[i]) for i in top_ids],
                similarities=[float(scores[b]) for b in best],
                ids=top_ids,
            )

    # ------------------------------------------------------------------ persistence
    def persist(self, persist_path: str, fs: Optional[fsspec.AbstractFileSystem] = None) -> None:
        """Write the manifest at ``persist_path`` and the data files beside it.

        Data files are written before the manifest, each to a temporary name then
        renamed, so an interrupted write is detected by the checksums on load.
        """
        fs = fs or fsspec.filesystem("file")
        with self._lock:
            ids = list(self._records)
            records = json.dumps([{"id": i, "record": self._records[i]} for i in ids], ensure_ascii=False).encode()
            matrix = np.stack([self._vectors[i] for i in ids]) if ids else np.zeros((0, 0), np.float32)
        buffer = io.BytesIO()
        np.save(buffer, matrix, allow_pickle=False)
        paths = _companion_paths(persist_path)
        data = {"nodes": records, "embeddings": buffer.getvalue()}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "settings": {
                "key_layer": self.key_layer,
                "encoding_prefix": self.encoding_prefix,
                "cache_mb": self.cache_mb,
            },
            "count": len(ids),
            "dim": int(matrix.shape[1]),
            "checksums": {os.path.basename(paths[k]): _sha256(v) for k, v in data.items()},
        }
        folder = os.path.dirname(persist_path)
        if folder:
            fs.makedirs(folder, exist_ok=True)
        for key, payload in data.items():
            _write_atomic(fs, paths[key], payload)
        _write_atomic(fs, persist_path, json.dumps(manifest, indent=2).encode())
        logger.info("persisted %d node(s) to %s", len(ids), persist_path)

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str = DEFAULT_PERSIST_DIR,
        namespace: str = DEFAULT_NAMESPACE,
        fs: Optional[fsspec.AbstractFileSystem] = None,
        lm: Optional[LoadedLM] = None,
    ) -> NestVectorStore:
        """Load the store ``StorageContext.persist(persist_dir)`` wrote for ``namespace``."""
        return cls.from_persist_path(os.path.join(persist_dir, f"{namespace}{_MANIFEST_SUFFIX}"), fs=fs, lm=lm)

    @classmethod
    def from_persist_path(
        cls,
        persist_path: str,
        fs: Optional[fsspec.AbstractFileSystem] = None,
        lm: Optional[LoadedLM] = None,
    ) -> NestVectorStore:
        """Load a store written by :meth:`persist` (manifest path).

        Raises:
            ValueError: missing files, not a NestVectorStore manifest, a newer
                format, or a file that does not match its checksum or shape.
        """
        fs = fs or fsspec.filesystem("file")

        def read(path: str) -> bytes:
            if not fs.exists(path):
                raise ValueError(f"cannot load NestVectorStore: {path} is missing")
            with fs.open(path, "rb") as handle:
                return handle.read()

        try:
            manifest = json.loads(read(persist_path))
        except json.JSONDecodeError as err:
            raise ValueError(f"{persist_path} is not valid JSON: {err}") from err
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"{persist_path} is not a NestVectorStore manifest")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ValueError(
                f"{persist_path} has format version {version!r}; this nest-integrations reads <= {FORMAT_VERSION}"
            )
        paths = _companion_paths(persist_path)
        data = {key: read(path) for key, path in paths.items()}
        for key, payload in data.items():
            name = os.path.basename(paths[key])
            if manifest["checksums"].get(name) != _sha256(payload):
                raise ValueError(f"NestVectorStore at {persist_path} is corrupted: {name} does not match its checksum")
        entries = json.loads(data["nodes"])
        matrix = np.load(io.BytesIO(data["embeddings"]), allow_pickle=False)
        if matrix.ndim != 2 or matrix.shape[0] != len(entries) or len(entries) != manifest["count"]:
            raise ValueError(
                f"NestVectorStore at {persist_path} is inconsistent: {len(entries)} node record(s), "
                f"embeddings of shape {matrix.shape}, manifest count {manifest['count']}"
            )
        store = cls(lm=lm, **manifest["settings"])
        for entry, vector in zip(entries, matrix, strict=True):
            store._records[entry["id"]] = entry["record"]
            store._vectors[entry["id"]] = np.asarray(vector, dtype=np.float32)
        logger.info("loaded %d node(s) from %s", len(entries), persist_path)
        return store
