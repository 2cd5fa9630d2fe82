"""NestVectorStore: an in-memory LlamaIndex vector store that also keeps NEST's
token-level datastore in sync with its nodes.

Persisted as LlamaIndex's ``StorageContext.persist`` names it (a manifest such as
``storage/default__vector_store.json`` and data files beside it), without pickle and
checked on load: :mod:`nest_integrations.llama_index.vector_store_files` has the layout.
"""

from __future__ import annotations

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

from nest_integrations.core.similarity import unit_rows
from nest_integrations.corpus.passages import Passage
from nest_integrations.index.vector_store_calibration import Search, VectorStoreCalibrations
from nest_integrations.index.vector_store_keys import VectorStoreKeys
from nest_integrations.model.key_reader import parse_key_layer
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.shards import KEY_ARRAYS
from ._common import node_to_passage
from .vector_store_files import (
    DEFAULT_NAMESPACE,
    MANIFEST_SUFFIX,
    calibrations_file,
    npy_bytes,
    read_persisted,
    remove_stale_after_load,
    write_persisted,
)

if TYPE_CHECKING:  # pragma: no cover
    from llama_index.core.base.embeddings.base import BaseEmbedding

    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.policy.calibration import Calibration

logger = logging.getLogger(__name__)

_COMBINE: dict[FilterCondition, Callable[[list[bool]], bool]] = {
    FilterCondition.AND: all,
    FilterCondition.OR: any,
    FilterCondition.NOT: lambda matches: not any(matches),
}



class NestVectorStore(BasePydanticVectorStore):
    """In-memory vector store (cosine similarity) whose nodes also form NEST's token datastore.

    Use it like any LlamaIndex vector store::

        store = NestVectorStore()
        index = VectorStoreIndex.from_documents(
            docs, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
        )
        llm = NestLLM("default", retriever=index)  # shares the store's token datastore

    The token datastore (:meth:`token_datastore`, bound to one LM by
    :class:`~nest_integrations.index.vector_store_keys.VectorStoreKeys`) follows every change:
    added or replaced nodes enter it at once (their keys are appended, or
    encoded on first retrieval when lazy), deleted ones leave it (their keys
    are not persisted again), and the other nodes keep their keys.

    Precomputed or lazy keys, the trade-off: precomputing (``precompute_keys``)
    pays the LM's encoding of every token once, when nodes are added (a
    progress bar gives an estimate first), and then no answer encodes
    anything; lazy keys make adding free, and each answer encodes the nodes it
    retrieves that no earlier answer did (an LM forward over each such chunk;
    docs/persistence.md has both costs). Persisted keys load memory-mapped, so
    a reloaded store answers at once. Keys take ``2 x hidden_size`` bytes per
    token (1,152 B on the default LM).

    Args:
        lm: the LM whose hidden states are the datastore keys; optional, a
            :class:`~nest_integrations.llama_index.NestLLM` built over the store
            supplies its own (nodes added before it are encoded when it binds).
        embed_model: the embedding model the nodes are embedded with. With ``lm``,
            alpha/tau are fitted for the LM while nodes are added (:meth:`calibration`,
            whose first stage it embeds; a progress bar, at most 90 s), so no first
            question waits for the fit; without it the first nest generation fits.
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
    precompute_keys: bool = Field(
        default=True,
        description="Encode token keys when nodes are added (once an LM is bound) and persist them; "
        "False: encode a node the first time it is retrieved. See the class docstring for the trade-off.",
    )
    show_progress: bool = Field(default=True, description="Draw a progress bar (with a time estimate) while precomputing keys.")

    _records: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)
    _vectors: dict[str, np.ndarray] = PrivateAttr(default_factory=dict)
    _table: Optional[tuple[list[str], np.ndarray]] = PrivateAttr(default=None)
    _lock: threading.RLock = PrivateAttr(default_factory=threading.RLock)
    _keys: VectorStoreKeys = PrivateAttr()
    _calibrations: VectorStoreCalibrations = PrivateAttr()
    _embed_model: Optional["BaseEmbedding"] = PrivateAttr(default=None)

    def __init__(self, lm: Optional[LoadedLM] = None, embed_model: Optional["BaseEmbedding"] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._embed_model = embed_model
        self._keys = VectorStoreKeys(
            self._passages, self._lock, lm=lm, key_layer=self.key_layer, encoding_prefix=self.encoding_prefix,
            cache_mb=self.cache_mb, precompute=self.precompute_keys, show_progress=self.show_progress, owner="NestVectorStore",
        )
        self._calibrations = VectorStoreCalibrations(self._keys)

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
        return self._keys.lm

    def _passages(self) -> list[Passage]:
        """The nodes as passages, in store order (lock held)."""
        return [node_to_passage(metadata_dict_to_node(r)) for r in self._records.values()]

    # ------------------------------------------------------------------ token datastore
    def token_datastore(self, lm: Optional[LoadedLM] = None) -> TokenDatastore:
        """NEST's token datastore over the stored nodes, created on first use
        (with ``precompute_keys``, keys not encoded yet are encoded first).

        Args:
            lm: the LM to key the datastore with; binds it when the store has none.

        Raises:
            ValueError: no LM is known, ``lm`` differs from the store's LM, or
                persisted keys were encoded by another LM.
        """
        return self._keys.datastore(lm)

    def precompute_token_keys(self, lm: Optional[LoadedLM] = None, *, show_progress: Optional[bool] = None) -> int:
        """Encode now the token keys of every node that has none (e.g. in a lazy
        store, before :meth:`persist`); returns how many were encoded.

        Args:
            lm: as for :meth:`token_datastore`.
            show_progress: None: the store's setting.
        """
        return self._keys.encode_all(lm, show_progress=show_progress)

    # ------------------------------------------------------------------ calibration
    @property
    def calibrations(self) -> dict[str, "Calibration"]:
        """alpha/tau fitted on the store's nodes, by LM fingerprint (persisted with the store)."""
        return self._calibrations.calibrations

    def saved_calibration(self, lm: LoadedLM) -> Optional["Calibration"]:
        """The store's calibration for ``lm``, without fitting one (None: none yet)."""
        return self._calibrations.saved(lm)

    def calibration(
        self, lm: Optional[LoadedLM], embed_model: "BaseEmbedding", *, show_progress: Optional[bool] = None
    ) -> Optional["Calibration"]:
        """alpha/tau for ``lm`` (None: the store's) on the store's nodes: the store's, else fitted now
        (:meth:`calibrate`). What a :class:`~nest_integrations.llama_index.NestLLM` over the store runs
        before its first nest generation that leaves alpha or tau to calibration. None, with a warning,
        when no node has two sentences to fit on (the defaults apply).

        Args:
            embed_model: embeds the first-stage queries of the fit (the one the nodes were embedded with).
            show_progress: None: the store's setting.
        """
        return self._calibrations.calibration(lm, self._search_with(embed_model), show_progress=show_progress)

    def calibrate(
        self,
        lm: Optional[LoadedLM],
        embed_model: "BaseEmbedding",
        *,
        n: int = 12,
        seed: int = 0,
        budget_s: Optional[float] = 90.0,
        show_progress: Optional[bool] = None,
    ) -> "Calibration":
        """Fit alpha/tau for ``lm`` (None: the store's) on ``n`` of the store's nodes, at most ``budget_s``
        seconds (:func:`~nest_integrations.policy.calibration.calibrate`); keep it, and add it to the persisted
        store's calibrations file when the store was persisted or loaded.

        Raises:
            ValueError: no node of two sentences to fit on; no LM; an ``embed_model`` of another dimension.
        """
        return self._calibrations.calibrate(
            lm, self._search_with(embed_model), n=n, seed=seed, budget_s=budget_s, show_progress=show_progress
        )

    def _search_with(self, embed_model: "BaseEmbedding") -> Search:
        """The store's similarity search for text queries embedded by ``embed_model``: (passage, cosine), best first."""

        def search(query: str, k: int) -> list[tuple[Passage, float]]:
            result = self.query(VectorStoreQuery(query_embedding=embed_model.get_query_embedding(query), similarity_top_k=k))
            return [(node_to_passage(node), float(score)) for node, score in zip(result.nodes or [], result.similarities or [])]

        return search

    # ------------------------------------------------------------------ writes
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> List[str]:
        """Store nodes with their embeddings (a known id is replaced); all or nothing.

        Raises:
            ValueError: a node has no embedding, an empty one or one with NaN or infinite values, its
                dimension differs from the store's, or its metadata cannot be made JSON
                (:func:`nest_integrations.core.jsonsafe.json_safe`); the message names the node id.
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
                try:
                    vector = np.asarray(node.embedding, dtype=np.float32)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"node {node.node_id!r} has an embedding that is not a list of numbers ({err})") from None
                if vector.size == 0:
                    raise ValueError(f"node {node.node_id!r} has an empty embedding")
                if vector.ndim != 1 or (dim is not None and vector.shape[0] != dim):
                    raise ValueError(
                        f"node {node.node_id!r} has an embedding of shape {vector.shape}; "
                        f"the store holds {dim}-d vectors"
                    )
                if not np.isfinite(vector).all():
                    raise ValueError(f"node {node.node_id!r} has an embedding with NaN or infinite values")
                node_to_passage(node)  # refuses metadata that cannot be made JSON, before anything is stored
                dim = vector.shape[0]
                vectors.append(vector)
            for node, vector in zip(nodes, vectors, strict=True):
                self._records[node.node_id] = node_to_metadata_dict(node, remove_text=False, flat_metadata=False)
                self._vectors[node.node_id] = vector
                self._keys.added([node_to_passage(node)])
            self._table = None
        self._keys.after_add()  # outside the lock: queries go on while keys are encoded
        if self._embed_model is not None:
            self._calibrations.after_add(self._search_with(self._embed_model))
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
            self._keys.removed(node_ids)
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
        """Write the store: data files beside ``persist_path``, then the manifest at it.

        The switch is atomic as a whole: data files have content-addressed names,
        so the old manifest keeps naming complete old files until the new
        manifest replaces it in one rename (fsynced first on a local disk);
        files no manifest names any more are removed afterwards, or by the next
        persist or load. A store already persisted at ``persist_path`` is
        replaced (``StorageContext.persist`` writes the current state); any other
        file there is refused.

        Raises:
            ValueError: ``persist_path`` holds a file that is not a NestVectorStore manifest.
        """
        fs = fs or fsspec.filesystem("file")
        with self._lock:
            ids = list(self._records)
            records = json.dumps([{"id": i, "record": self._records[i]} for i in ids], ensure_ascii=False).encode()
            matrix = np.stack([self._vectors[i] for i in ids]) if ids else np.zeros((0, 0), np.float32)
            saved_keys = self._keys.keys_to_save(self._passages())
        data = {"nodes": records, "embeddings": npy_bytes(matrix)}
        if saved_keys is not None:
            keys, info = saved_keys
            data.update({name: npy_bytes(getattr(keys, name)) for name in KEY_ARRAYS})
        elif ids and self._keys.bound:
            logger.info("persisting %s without token keys: some nodes have none (see precompute_token_keys)", persist_path)
        settings = {"key_layer": self.key_layer, "encoding_prefix": self.encoding_prefix, "cache_mb": self.cache_mb}
        raw_manifest = write_persisted(
            fs, persist_path, data, settings={**settings, "precompute_keys": self.precompute_keys}, count=len(ids),
            dim=int(matrix.shape[1]), keys=info if saved_keys is not None else None, calibrations=self._calibrations.to_save,
        )
        self._calibrations.saved_to(calibrations_file(fs, persist_path, raw_manifest))
        logger.info("persisted %d node(s) to %s", len(ids), persist_path)

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str = DEFAULT_PERSIST_DIR,
        namespace: str = DEFAULT_NAMESPACE,
        fs: Optional[fsspec.AbstractFileSystem] = None,
        lm: Optional[LoadedLM] = None,
        *,
        load_keys: bool = True,
    ) -> NestVectorStore:
        """Load the store ``StorageContext.persist(persist_dir)`` wrote for ``namespace``
        (see :meth:`from_persist_path`)."""
        path = os.path.join(persist_dir, f"{namespace}{MANIFEST_SUFFIX}")
        return cls.from_persist_path(path, fs=fs, lm=lm, load_keys=load_keys)

    @classmethod
    def from_persist_path(
        cls,
        persist_path: str,
        fs: Optional[fsspec.AbstractFileSystem] = None,
        lm: Optional[LoadedLM] = None,
        *,
        load_keys: bool = True,
    ) -> NestVectorStore:
        """Load a store written by :meth:`persist` (manifest path); nothing in it is trusted.

        Args:
            lm: LM for the token datastore. Persisted token keys are checked
                against it (now, or when an LM binds the store later); without
                persisted keys they are encoded as ``precompute_keys`` says.
            load_keys: False ignores persisted token keys (e.g. to key the store
                with another LM: they are encoded again).

        Raises:
            ValueError: missing files, not a NestVectorStore manifest, a newer or
                malformed one, a data file unlisted or not matching its checksum,
                records inconsistent with the embeddings or the keys, or
                persisted keys that another LM (``lm``) encoded.
        """
        fs = fs or fsspec.filesystem("file")
        saved = read_persisted(fs, persist_path, load_keys=load_keys)
        manifest, entries = saved.manifest, saved.entries
        store = cls(lm=lm, **manifest.settings.model_dump())
        with store._lock:
            for entry, vector in zip(entries, saved.matrix, strict=True):
                store._records[entry["id"]] = entry["record"]
                store._vectors[entry["id"]] = np.asarray(vector, dtype=np.float32)
            if saved.keys is not None:
                assert manifest.keys is not None
                store._keys.attach_saved(store._passages(), saved.keys, manifest.keys, persist_path)
        store._calibrations.load(calibrations_file(fs, persist_path, saved.raw_manifest), saved.calibration)
        store._keys.after_add()
        remove_stale_after_load(fs, persist_path)
        logger.info("loaded %d node(s) from %s", len(entries), persist_path)
        return store
