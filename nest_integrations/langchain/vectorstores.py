"""NestVectorStore: a LangChain vector store that also keeps NEST's token datastore.

The passage stage is numpy cosine similarity over the vectors of any LangChain
``Embeddings``. Beside it the store keeps a token-level
:class:`~nest_integrations.store.datastore.TokenDatastore` of the same documents,
bound to one LM (given to the store or adopted from the :class:`NestLLM` /
:class:`ChatNest` that retrieves from it) by
:class:`~nest_integrations.index.vector_store_keys.VectorStoreKeys`. Token keys are precomputed
when documents are added, or computed lazily the first time a document is
retrieved (``precompute_keys``; see :class:`NestVectorStore`).

Saved folders hold no pickle and are checked on load, and the keys are refused
by any other LM: :mod:`nest_integrations.langchain.vectorstore_folder` has the layout.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance
from typing_extensions import Self

from nest_integrations.core.jsonsafe import json_safe
from nest_integrations.core.similarity import cosine_similarities
from nest_integrations.corpus.passages import Passage
from nest_integrations.index.vector_store_calibration import VectorStoreCalibrations
from nest_integrations.index.vector_store_keys import VectorStoreKeys
from .documents import default_embeddings, document_to_passage
from .vectorstore_arguments import MetadataFilter, check_k, matches_filter, resolve_ids
from .vectorstore_folder import calibrations_file, read_store_folder, write_store_folder

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.policy.calibration import Calibration
    from nest_integrations.store.datastore import TokenDatastore

logger = logging.getLogger(__name__)


class NestVectorStore(VectorStore):
    """In-memory vector store for NEST's passage stage, with a token datastore kept in sync.

    Args:
        embedding: any LangChain ``Embeddings`` (used for documents and queries, and by
            the relevance gate); None: the bundled all-MiniLM-L6-v2
            (:func:`~nest_integrations.langchain.default_embeddings`).
        lm: the LM whose hidden states key the token datastore; optional: a
            :class:`NestLLM` / :class:`ChatNest` retrieving from the store lends
            its own on first use. Given here, alpha/tau are fitted for it on the
            documents as they are added (:meth:`calibration`; a progress bar, at
            most 90 s), so no first question waits for the fit.
        key_layer: layer read as datastore keys (``"ffn_input"`` or ``"layer:<i>"``).
        encoding_prefix: text put before each passage when encoding it
            (see :func:`nest_integrations.store.encoder.resolve_encoding_prefix`).
        cache_mb: bound of the token datastore's cache of lazily encoded keys.
        precompute_keys: encode token keys when documents are added (as soon
            as the store has an LM; documents added before it are encoded when
            it binds), and save them with the store; False encodes a document
            the first time it is retrieved for a generation. See the trade-off below.
        show_progress: draw a progress bar (with a time estimate) while precomputing.

    Example:
        Build, answer from it, save and load back::

            store = NestVectorStore.from_documents(docs, embeddings)
            llm = NestLLM.from_lm(lm, retriever=store)
            store.save_local("store/")
            store = NestVectorStore.load_local("store/", embeddings)

    Search scores are cosine similarities (higher is closer); relevance scores
    map them to ``[0, 1]``. Searches accept ``filter=``: a ``Document -> bool``
    predicate or a dict of metadata values that must match.

    The token datastore follows every change: an added or replaced document
    enters it (its keys are appended, or encoded on first retrieval when
    lazy), a deleted one leaves it (its keys are not saved again), and the
    other documents keep their keys.

    Precomputed or lazy keys, the trade-off: precomputing pays the LM's
    encoding of every token once, when documents are added (a progress bar
    gives an estimate first), and then no answer encodes anything; lazy keys
    make adding free, and each answer encodes the chunks it retrieves that no
    earlier answer did (an LM forward over each such chunk; docs/persistence.md
    has both costs for LangChain's 4,000-character chunks). Saved keys load
    memory-mapped, so a reloaded store answers at once. Keys take
    ``2 x hidden_size`` bytes per token (1,152 B on the default LM).
    """

    def __init__(
        self,
        embedding: Optional[Embeddings] = None,
        lm: Optional["LoadedLM"] = None,
        *,
        key_layer: str = "ffn_input",
        encoding_prefix: Optional[str] = "auto",
        cache_mb: float = 1024.0,
        precompute_keys: bool = True,
        show_progress: bool = True,
    ) -> None:
        self.embedding = embedding if embedding is not None else default_embeddings()
        self.key_layer = key_layer
        self.encoding_prefix = encoding_prefix
        self.cache_mb = cache_mb
        self.precompute_keys = precompute_keys
        self._documents: dict[str, Document] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._matrix: Optional[tuple[list[str], np.ndarray]] = None
        self._ids_by_text: Optional[dict[str, str]] = None
        self._lock = threading.RLock()
        self._keys = VectorStoreKeys(
            self._passages, self._lock, lm=lm, key_layer=key_layer, encoding_prefix=encoding_prefix,
            cache_mb=cache_mb, precompute=precompute_keys, show_progress=show_progress, owner="NestVectorStore",
        )
        self._calibrations = VectorStoreCalibrations(self._keys)

    # ------------------------------------------------------------------ basics
    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    @property
    def lm(self) -> Optional["LoadedLM"]:
        """The LM keying the token datastore (None until one is given or adopted)."""
        return self._keys.lm

    def _passages(self) -> list[Passage]:
        """The documents as passages, in store order (lock held)."""
        return [document_to_passage(doc) for doc in self._documents.values()]

    def __len__(self) -> int:
        return len(self._documents)

    # ------------------------------------------------------------------ writes
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: Optional[list[dict[str, Any]]] = None,
        *,
        ids: Optional[list[Optional[str]]] = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and upsert texts; missing ids get a fresh uuid4.

        Raises:
            ValueError: ``metadatas`` or ``ids`` of the wrong length, an empty or
                repeated id, vectors whose size differs from the stored ones, or
                metadata that cannot be made JSON (:func:`nest_integrations.core.jsonsafe.json_safe`).
            TypeError: an id that is neither a str nor None.
        """
        texts = list(texts)
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(metadatas)} metadatas")
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(ids)} ids")
        if not texts:
            return []
        vectors = np.asarray(self.embedding.embed_documents(texts), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ValueError(f"the embeddings returned shape {vectors.shape} for {len(texts)} texts")
        out_ids = resolve_ids(ids, len(texts))
        # Metadata is stored as JSON values (numpy scalars, dates... converted), so answers and
        # save_local carry it as is; what cannot be converted is refused before anything is stored.
        documents = [
            Document(id=doc_id, page_content=text, metadata=json_safe(dict(metadatas[n]), f"metadatas[{n}]") if metadatas else {})
            for n, (doc_id, text) in enumerate(zip(out_ids, texts))
        ]
        with self._lock:
            self._check_dimensions(vectors.shape[1])
            for document, vector in zip(documents, vectors):
                self._upsert(document, vector)
            self._matrix = self._ids_by_text = None
        self._keys.after_add()  # outside the lock: searches go on while keys are encoded
        self._calibrations.after_add(self._scored_passages)
        return out_ids

    def _check_dimensions(self, size: int) -> None:
        stored = next(iter(self._vectors.values()), None)
        if stored is not None and stored.shape[0] != size:
            raise ValueError(f"the embeddings give {size}-dimensional vectors but the store holds {stored.shape[0]}-dimensional ones")

    def _upsert(self, document: Document, vector: np.ndarray) -> None:
        assert document.id is not None
        self._documents[document.id] = document
        self._vectors[document.id] = vector.copy()  # not a view that keeps the whole batch alive
        # New text gets a fresh datastore slot; same text keeps its keys and takes the new metadata.
        self._keys.added([document_to_passage(document)])

    def delete(self, ids: Optional[list[str]] = None, **kwargs: Any) -> bool:
        """Delete documents by id (all when ``ids`` is None); unknown ids are ignored."""
        with self._lock:
            doomed = list(self._documents) if ids is None else [i for i in ids if i in self._documents]
            for doc_id in doomed:
                del self._documents[doc_id]
                del self._vectors[doc_id]
            if doomed:
                self._matrix = self._ids_by_text = None
                self._keys.removed(doomed)
        return True

    # ------------------------------------------------------------------ reads
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        with self._lock:
            return [self._documents[i].model_copy(deep=True) for i in ids if i in self._documents]

    def _id_of_text(self) -> dict[str, str]:
        """The id of the first document (in store order) holding each text (lock held); kept until a write."""
        if self._ids_by_text is None:
            self._ids_by_text = {}
            for doc_id, document in self._documents.items():
                self._ids_by_text.setdefault(document.page_content, doc_id)
        return self._ids_by_text

    def _snapshot(self) -> tuple[list[str], np.ndarray]:
        with self._lock:
            if self._matrix is None:
                ids = list(self._documents)
                matrix = np.stack([self._vectors[i] for i in ids]) if ids else np.zeros((0, 0), dtype=np.float32)
                self._matrix = (ids, matrix)
            return self._matrix

    def _search(
        self, embedding: Sequence[float], k: int, filter: Optional[MetadataFilter]
    ) -> list[tuple[Document, float, np.ndarray]]:
        """The ``k`` best matches (a copy of each document, its cosine, its vector), best first."""
        check_k(k)
        with self._lock:
            ids, matrix = self._snapshot()
            if not ids or k == 0:
                return []
            scores = np.asarray(cosine_similarities(embedding, matrix))
            hits = []
            for n in np.argsort(-scores, kind="stable"):
                document = self._documents[ids[n]]
                if matches_filter(document, filter):
                    hits.append((document.model_copy(deep=True), float(scores[n]), self._vectors[ids[n]]))
                    if len(hits) == k:
                        break
            return hits

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: Optional[MetadataFilter] = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` documents closest to ``embedding`` with their cosine similarity."""
        return [(document, score) for document, score, _ in self._search(embedding, k, filter)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: Optional[MetadataFilter] = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self.similarity_search_with_score_by_vector(self.embedding.embed_query(query), k, filter)

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: Optional[MetadataFilter] = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter)]

    def similarity_search(
        self, query: str, k: int = 4, filter: Optional[MetadataFilter] = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter)]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda cosine: (cosine + 1.0) / 2.0

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[MetadataFilter] = None,
        **kwargs: Any,
    ) -> list[Document]:
        candidates = self._search(embedding, fetch_k, filter)
        vectors = [vector.tolist() for _, _, vector in candidates]
        chosen = maximal_marginal_relevance(np.asarray(embedding, dtype=np.float32), vectors, lambda_mult, k)
        return [candidates[n][0] for n in chosen]

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[MetadataFilter] = None,
        **kwargs: Any,
    ) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(
            self.embedding.embed_query(query), k, fetch_k, lambda_mult, filter
        )

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: Optional[list[dict[str, Any]]] = None,
        *,
        ids: Optional[list[str]] = None,
        lm: Optional["LoadedLM"] = None,
        **kwargs: Any,
    ) -> Self:
        """A new store holding ``texts`` (``kwargs``: the constructor's keyword options)."""
        store = cls(embedding, lm, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    # ------------------------------------------------------------------ NEST
    def relevance(self, query: str, texts: Sequence[str]) -> list[float]:
        """Cosine similarity of each text to ``query`` (a :data:`~nest_integrations.core.similarity.Relevance`,
        the relevance gate and answer windows of :class:`~nest_integrations.decoding.decoder.NestDecoder`).

        A text a stored document holds has that document's stored vector (the
        first document's, when several hold it); any other text (an answer
        window) is embedded with ``embed_documents``, as the documents were.
        """
        if not texts:
            return []
        with self._lock:
            id_of_text = self._id_of_text()
            stored = {text: self._vectors[id_of_text[text]] for text in texts if text in id_of_text}
        missing = [text for text in dict.fromkeys(texts) if text not in stored]
        if missing:
            embedded = self.embedding.embed_documents(missing)
            stored.update({text: np.asarray(v, dtype=np.float32) for text, v in zip(missing, embedded)})
        return cosine_similarities(self.embedding.embed_query(query), np.stack([stored[text] for text in texts]))

    def token_datastore(self, lm: Optional["LoadedLM"] = None) -> "TokenDatastore":
        """The token datastore over the store's documents, created on first use
        (with ``precompute_keys``, keys not encoded yet are encoded first).

        Args:
            lm: the LM to key it with; adopted when the store has none yet.

        Raises:
            ValueError: no LM at all, an LM other than the store's, or saved
                keys encoded by another LM.
        """
        return self._keys.datastore(lm)

    def precompute_token_keys(self, lm: Optional["LoadedLM"] = None, *, show_progress: Optional[bool] = None) -> int:
        """Encode now the token keys of every document that has none (e.g. in a
        lazy store, before :meth:`save_local`); returns how many were encoded.

        Args:
            lm: as for :meth:`token_datastore`.
            show_progress: None: the store's setting.
        """
        return self._keys.encode_all(lm, show_progress=show_progress)

    @property
    def calibrations(self) -> dict[str, "Calibration"]:
        """alpha/tau fitted on the store's documents, by LM fingerprint (saved with the store)."""
        return self._calibrations.calibrations

    def saved_calibration(self, lm: "LoadedLM") -> Optional["Calibration"]:
        """The store's calibration for ``lm``, without fitting one (None: none yet)."""
        return self._calibrations.saved(lm)

    def calibration(self, lm: Optional["LoadedLM"] = None, *, show_progress: Optional[bool] = None) -> Optional["Calibration"]:
        """alpha/tau for ``lm`` (default the store's) on the store's documents: the store's, else fitted now
        (:meth:`calibrate`). What a :class:`NestLLM` / :class:`ChatNest` over the store runs before its first
        nest generation that leaves alpha or tau to calibration. None, with a warning, when no document
        has two sentences to fit on (the defaults apply).

        Args:
            show_progress: None: the store's setting.
        """
        return self._calibrations.calibration(lm, self._scored_passages, show_progress=show_progress)

    def calibrate(
        self,
        lm: Optional["LoadedLM"] = None,
        *,
        n: int = 12,
        seed: int = 0,
        budget_s: Optional[float] = 90.0,
        show_progress: Optional[bool] = None,
    ) -> "Calibration":
        """Fit alpha/tau for ``lm`` (default the store's) on ``n`` of the store's documents, at most
        ``budget_s`` seconds (:func:`~nest_integrations.policy.calibration.calibrate`); keep it, and add it
        to the saved store's ``calibration.json`` when the store was saved or loaded.

        Raises:
            ValueError: no document of two sentences to fit on; no LM.
        """
        return self._calibrations.calibrate(
            lm, self._scored_passages, n=n, seed=seed, budget_s=budget_s, show_progress=show_progress
        )

    def _scored_passages(self, query: str, k: int) -> list[tuple[Passage, float]]:
        """The store's similarity search as (passage, cosine) pairs, best first (the calibration's first
        stage: searched directly, so the public search methods serve the models' first stage alone)."""
        return [(document_to_passage(doc), score) for doc, score, _ in self._search(self.embedding.embed_query(query), k, None)]

    # ------------------------------------------------------------------ persistence
    def save_local(self, folder: Union[str, os.PathLike[str]], *, overwrite: bool = False) -> Path:
        """Write the documents, vectors and token keys to ``folder`` atomically (see :mod:`nest_integrations.core.safe_io`).

        Token keys are saved when every document has precomputed ones (always
        with ``precompute_keys`` once an LM is bound; else see
        :meth:`precompute_token_keys`); keys of deleted documents are left out.

        Args:
            overwrite: replace a store already saved at ``folder``; without it an
                existing store is refused too, and anything else always is.

        Raises:
            ValueError: ``folder`` holds something other than an empty folder or
                (with ``overwrite``) a saved store; or a document's metadata is
                not JSON-serialisable.
        """
        target = Path(folder)
        with self._lock:
            ids, matrix = self._snapshot()
            records = [
                {"id": i, "page_content": self._documents[i].page_content, "metadata": self._documents[i].metadata}
                for i in ids
            ]
            saved_keys = self._keys.keys_to_save([document_to_passage(self._documents[i]) for i in ids])
        if saved_keys is None and len(ids) and self._keys.bound:
            logger.info("saving %s without token keys: some documents have none (see precompute_token_keys)", target)
        try:
            payload = json.dumps({"documents": records}, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"cannot save the store: document metadata must be JSON-serialisable ({err})") from err
        raw_manifest = write_store_folder(
            target, overwrite=overwrite, payload=payload, matrix=matrix, saved_keys=saved_keys,
            settings={
                "embeddings": type(self.embedding).__name__, "key_layer": self.key_layer,
                "encoding_prefix": self.encoding_prefix, "precompute_keys": self.precompute_keys,
            },
            calibrations=self._calibrations.to_save,
        )
        self._calibrations.saved_to(calibrations_file(target, raw_manifest))
        return target

    @classmethod
    def load_local(
        cls,
        folder: Union[str, os.PathLike[str]],
        embeddings: Embeddings,
        lm: Optional["LoadedLM"] = None,
        *,
        load_keys: bool = True,
        **kwargs: Any,
    ) -> Self:
        """Load a folder written by :meth:`save_local`; nothing in it is executed or trusted.

        Args:
            embeddings: the embeddings the store was built with (used for queries
                and new documents).
            lm: LM for the token datastore. Saved token keys are memory-mapped
                and checked against it (now, or when an LM binds the store
                later); without saved keys they are encoded as
                ``precompute_keys`` says.
            load_keys: False ignores saved token keys (e.g. to key the store
                with another LM: they are encoded again).
            **kwargs: constructor options overriding the saved ``key_layer`` /
                ``encoding_prefix`` / ``precompute_keys``, and ``cache_mb``.

        Raises:
            ValueError: not a saved store, a newer or malformed manifest, a file
                unlisted, missing or tampered (checksum mismatch), inconsistent
                contents, or saved keys that another LM (``lm``) encoded.
        """
        base = Path(folder)
        saved = read_store_folder(base, load_keys=load_keys)
        manifest = saved.manifest
        options = {"key_layer": manifest.key_layer, "encoding_prefix": manifest.encoding_prefix, "precompute_keys": manifest.precompute_keys}
        store = cls(embeddings, lm, **{**options, **kwargs})
        with store._lock:
            for record, vector in zip(saved.records, saved.vectors):
                store._upsert(Document(id=record["id"], page_content=record["page_content"], metadata=record["metadata"]), vector)
            if saved.keys is not None:
                assert manifest.keys is not None
                store._keys.attach_saved(store._passages(), saved.keys, manifest.keys, str(base))
        store._calibrations.load(calibrations_file(base, saved.raw_manifest), saved.calibration)
        store._keys.after_add()
        return store
