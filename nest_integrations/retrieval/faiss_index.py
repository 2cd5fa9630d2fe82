"""FAISS first-stage indexes built for scale: flat, IVF and HNSW, in memory or memory-mapped.

Choosing an index (``index_factory`` of :class:`~nest_integrations.retrieval.DenseRetriever`):

* ``"flat"`` (factory ``Flat``): exact. Memory ``4 * d`` bytes per passage
  (1,536 B for the 384-d MiniLM), no training, build = a copy; a query scans
  every vector, so latency grows linearly (docs/scale.md has the measured
  rate per 1,000 passages).
* ``"ivf"`` (``IVF<nlist>,Flat``): k-means into ``nlist`` lists, a query scans
  the ``nprobe`` nearest lists only. Memory: flat's plus 16 B per passage
  (list id and a direct map, so vectors can be read back) and the centroids;
  build pays the training; latency ~ ``nprobe / nlist`` of flat; recall < 1,
  raised by ``nprobe``. ``nlist`` defaults to ``4 * sqrt(n)``, and training
  needs at least ``nlist`` vectors (FAISS advises >= 39 per list).
* ``"hnsw"`` (``HNSW<M>,Flat``): a graph, no training; memory adds about
  ``2 * M * 4`` bytes of links per passage, build is the slowest of the three
  (graph insertion, ~O(n log n)), queries are fast and ``ef_search`` trades
  recall for latency.
* ``"auto"`` (the default): flat below :data:`AUTO_IVF_THRESHOLD` passages,
  IVF above.
* any other string is passed to ``faiss.index_factory`` as it is (e.g.
  ``"IVF4096,PQ32"``: 32 bytes per passage, lossy, for corpora that do not fit).

An index saved with ``on_disk=True`` is read back with ``faiss.IO_FLAG_MMAP``:
the vectors stay in the file and the OS pages them in on demand, so the
resident memory of a loaded flat or IVF index is what queries touched, at
the cost of page faults on a cold cache. ``faiss`` is imported lazily.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

if TYPE_CHECKING:
    import faiss

logger = logging.getLogger(__name__)

FIRST_STAGES = ("auto", "flat", "ivf", "hnsw")
"""Index names :func:`resolve_factory` understands besides raw FAISS factory strings."""
AUTO_IVF_THRESHOLD = 100_000
"""``"auto"`` picks IVF from this many passages up (below, flat is exact and fast enough)."""
DEFAULT_HNSW_M = 32
TRAIN_POINTS_PER_LIST = 39
"""IVF trains on at most this many vectors per list (FAISS's advised minimum; its own cap
is 256). k-means costs ``points x nlist x d x iterations``: at 1M passages and 4,000 lists
the cap of 39 and :data:`KMEANS_ITERATIONS` cut training to ``(39 x 10) / (256 x 25)``, about a
sixteenth, of FAISS's own cap and iterations (docs/scale.md has the measured build times);
recall against flat (``nest bench scale``) shows what it costs."""
KMEANS_ITERATIONS = 10
"""k-means iterations of IVF training (FAISS's default is 25)."""


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def default_nlist(n: int) -> int:
    """IVF lists for ``n`` passages: ``4 * sqrt(n)``, at least 1 and at most ``n``."""
    return max(1, min(n, round(4 * math.sqrt(n))))


def default_nprobe(nlist: int) -> int:
    """sqrt(nlist) lists probed per query: a common recall/speed middle ground."""
    return max(1, min(nlist, round(math.sqrt(nlist))))


def resolve_factory(name: str, n: int, *, nlist: Optional[int] = None, hnsw_m: int = DEFAULT_HNSW_M) -> str:
    """The FAISS factory string for an index name (module docstring) over ``n`` passages.

    Args:
        name: "auto", "flat", "ivf", "hnsw" (case-insensitive) or a FAISS factory string.
        n: corpus size (>= 1).
        nlist: IVF lists (None = :func:`default_nlist`); only with "ivf"/"auto".
        hnsw_m: HNSW links per node (>= 2); only with "hnsw". More links: higher
            recall and memory, slower build.

    Raises:
        ValueError: ``n < 1``, or ``nlist`` outside ``[1, n]``.
    """
    if n < 1:
        raise ValueError(f"cannot index {n} passages")
    kind = name.strip().lower()
    if kind == "auto":
        kind = "ivf" if n >= AUTO_IVF_THRESHOLD else "flat"
    if kind == "flat":
        return "Flat"
    if kind == "ivf":
        lists = default_nlist(n) if nlist is None else nlist
        if not _positive_int(lists) or lists > n:
            raise ValueError(
                f"nlist must be an integer in [1, {n}] (IVF needs at least one training vector per list), got {nlist!r}"
            )
        if n < 39 * lists:
            logger.warning("IVF%d trained on %d vectors: FAISS advises >= 39 per list; expect lower recall", lists, n)
        return f"IVF{lists},Flat"
    if kind == "hnsw":
        return f"HNSW{hnsw_m},Flat"
    return name


@dataclass(frozen=True)
class IndexSpec:
    """How to build and read a first-stage FAISS index (knobs in the module docstring).

    Attributes:
        factory: "auto", "flat", "ivf", "hnsw" or a FAISS factory string.
        nlist: IVF lists (None = ``4 * sqrt(n)``).
        nprobe: IVF lists probed per query (None = ``sqrt(nlist)`` when built,
            the saved value when loaded); recall and latency both rise with it.
        hnsw_m: HNSW links per node.
        ef_search: HNSW candidate-list size per query (None = FAISS's 16 when
            built, the saved value when loaded); recall and latency rise with it.
        on_disk: memory-map the saved index when it is loaded (read-only:
            :meth:`DenseRetriever.add` is refused on it).

    Raises:
        ValueError: on construction, a knob of the wrong type or range.
    """

    factory: str = "auto"
    nlist: Optional[int] = None
    nprobe: Optional[int] = None
    hnsw_m: int = DEFAULT_HNSW_M
    ef_search: Optional[int] = None
    on_disk: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.factory, str) or not self.factory.strip():
            raise ValueError(f"index_factory must be one of {FIRST_STAGES} or a FAISS factory string, got {self.factory!r}")
        for label in ("nlist", "nprobe", "ef_search"):
            value = getattr(self, label)
            if value is not None and not _positive_int(value):
                raise ValueError(f"{label} must be a positive integer or None, got {value!r}")
        if not _positive_int(self.hnsw_m) or self.hnsw_m < 2:
            raise ValueError(f"hnsw_m must be an integer >= 2, got {self.hnsw_m!r}")
        if not isinstance(self.on_disk, bool):
            raise ValueError(f"on_disk must be a bool, got {self.on_disk!r}")

    def factory_for(self, n: int) -> str:
        """The FAISS factory string for ``n`` passages (:func:`resolve_factory`)."""
        return resolve_factory(self.factory, n, nlist=self.nlist, hnsw_m=self.hnsw_m)

    def build(self, vectors: np.ndarray) -> tuple["faiss.Index", str]:
        """:func:`build_index` over float32 (n, d) ``vectors`` with these knobs; returns the
        index and the FAISS factory string it was built from."""
        factory = self.factory_for(len(vectors))
        return build_index(vectors, factory, nprobe=self.nprobe, ef_search=self.ef_search), factory


def set_search_params(index: "faiss.Index", *, nprobe: Optional[int] = None, ef_search: Optional[int] = None) -> None:
    """Set IVF ``nprobe`` and HNSW ``efSearch`` where the index has them.

    None leaves the index's value (FAISS saves both with the index); a fresh
    IVF index gets :func:`default_nprobe`. A knob the index lacks is logged and ignored.

    Raises:
        ValueError: ``nprobe`` or ``ef_search`` below 1.
    """
    import faiss

    for label, value in (("nprobe", nprobe), ("ef_search", ef_search)):
        if value is not None and not _positive_int(value):
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    ivf = _ivf(index)
    if ivf is not None and nprobe is not None:
        ivf.nprobe = min(ivf.nlist, nprobe)
    elif nprobe is not None:
        logger.warning("nprobe=%d ignored: the index is not an IVF index", nprobe)
    hnsw = faiss.downcast_index(index)
    if ef_search is not None and hasattr(hnsw, "hnsw"):
        hnsw.hnsw.efSearch = ef_search
    elif ef_search is not None:
        logger.warning("ef_search=%d ignored: the index is not an HNSW index", ef_search)


def build_index(
    vectors: np.ndarray, factory: str, *, nprobe: Optional[int] = None, ef_search: Optional[int] = None, seed: int = 0
) -> "faiss.Index":
    """Build (and train when needed) a FAISS inner-product index over float32 (n, d) vectors.

    IVF trains (:data:`KMEANS_ITERATIONS` k-means iterations) on a random sample
    of at most ``TRAIN_POINTS_PER_LIST * nlist`` vectors (``seed`` draws it),
    then adds all of them.

    Raises:
        ValueError: invalid factory string, or too few vectors to train it
            (e.g. IVF4096 needs >= 4096 vectors, PQ needs >= 256).
    """
    import faiss

    assert vectors.dtype == np.float32 and vectors.ndim == 2 and vectors.flags.c_contiguous, (vectors.dtype, vectors.shape)
    n, dim = vectors.shape
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise ValueError(f"invalid FAISS index factory {factory!r} for dimension {dim}: {err}") from err
    if not index.is_trained:
        if _ivf(index) is not None:
            _ivf(index).cp.niter = KMEANS_ITERATIONS
        try:
            index.train(_training_sample(index, vectors, seed))
        except RuntimeError as err:
            raise ValueError(
                f"{n} passages are too few to train FAISS index {factory!r}; "
                "use 'flat' or 'hnsw', or fewer IVF lists / PQ centroids"
            ) from err
    try:
        index.add(vectors)
    except RuntimeError as err:
        raise ValueError(f"cannot add vectors to FAISS index {factory!r} (IDMap factories are not supported): {err}") from err
    ivf = _ivf(index)
    if isinstance(faiss.downcast_index(index), faiss.IndexIVFFlat):
        # 8 B per passage buys reconstruct(): the relevance gate reads retrieved passages'
        # vectors back instead of re-embedding them (an embedder forward per passage; docs/scale.md).
        ivf.make_direct_map()
    if ivf is not None and nprobe is None:
        nprobe = default_nprobe(ivf.nlist)
    set_search_params(index, nprobe=nprobe, ef_search=ef_search)
    return index


def _training_sample(index: "faiss.Index", vectors: np.ndarray, seed: int) -> np.ndarray:
    """All of ``vectors``, or for IVF a random ``TRAIN_POINTS_PER_LIST * nlist`` of them."""
    ivf = _ivf(index)
    cap = TRAIN_POINTS_PER_LIST * ivf.nlist if ivf is not None else len(vectors)
    if len(vectors) <= cap:
        return vectors
    rows = np.sort(np.random.default_rng(seed).choice(len(vectors), size=cap, replace=False))
    return np.ascontiguousarray(vectors[rows])


def _ivf(index: "faiss.Index") -> "Optional[faiss.IndexIVF]":
    """The IVF part of ``index``, or None when it has none."""
    import faiss

    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def read_index(path: Path | str, *, mmap: bool, where: Optional[str] = None) -> "faiss.Index":
    """Read a saved FAISS index, memory-mapped when ``mmap`` (module docstring).

    Args:
        where: the file for messages (default: ``path``).

    Raises:
        ValueError: the file is not a readable FAISS index.
    """
    import faiss

    try:
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP if mmap else 0)
    except RuntimeError as err:  # FAISS reports a truncated or foreign file this way
        raise ValueError(f"{where or path} is not a readable FAISS index: {err}") from err


def read_index_stream(read: Callable[[int], bytes], *, where: str) -> "faiss.Index":
    """Read a FAISS index into memory from ``read(n) -> up to n bytes`` (a file's ``read``), in order.

    Args:
        where: the file, for messages.

    Raises:
        ValueError: the bytes are not a readable FAISS index.
    """
    import faiss

    try:
        return faiss.read_index(faiss.PyCallbackIOReader(read))
    except RuntimeError as err:
        raise ValueError(f"{where} is not a readable FAISS index: {err}") from err


def index_bytes(index: "faiss.Index") -> int:
    """Bytes of ``index`` serialised: vectors, codes, lists and graph links (its in-memory footprint within ~1%)."""
    import faiss

    return int(faiss.serialize_index(index).nbytes)


def stores_vectors(index: "faiss.Index") -> bool:
    """True when ``reconstruct`` gives the indexed vectors back exactly: flat, HNSW over flat
    storage, and IVF over flat lists with a direct map (which :func:`build_index` makes)."""
    import faiss

    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexIVFFlat):
        return inner.direct_map.type != faiss.DirectMap.NoMap
    return isinstance(inner, (faiss.IndexFlat, faiss.IndexHNSWFlat))
