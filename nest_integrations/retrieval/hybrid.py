"""Hybrid retrieval: fuse a dense and a sparse ranking.

Two fusions are available:

* ``"adaptive"`` (default) weighs the two lists per query by how confident
  each looks. Each list's scores are min-max normalised to [0, 1] over the
  union of candidates, a passage missing from a list getting that list's
  lowest score (normalised 0). Raw BM25 and cosine scores live on unrelated
  scales, and min-max is the simplest map that puts both on [0, 1] without
  assuming a score distribution; its cost is that one outlier squashes the
  rest of its list. The *peakedness* of a raw list is
  ``1 - s_[m] / s_max`` with ``s_[m]`` its last score (``m = min(len, 100)``):
  near 1 when the top hit stands far above the tail, near 0 for a flat list.
  The dense weight is ``eta = 0.7 * (1 - peak_sparse) + 0.3 * peak_dense``
  and ``fused = eta * s_dense + (1 - eta) * s_sparse``: a peaked BM25 list
  (a rare exact term such as a name matched) shifts weight to sparse; a flat
  BM25 list and/or a peaked dense list shift it to dense.
* ``"rrf"``: reciprocal-rank fusion, ``sum over lists of 1 / (rrf_k + rank)``
  with 1-based ranks; scale-free and robust but ignores score gaps.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

from nest_integrations.corpus.passages import Passage
from .base import BatchRetrieverMixin, PassageRetriever, ScoredPassage

FUSIONS = ("adaptive", "rrf")
_PEAK_DEPTH = 100
_SPARSE_PEAK_WEIGHT = 0.7
_DENSE_PEAK_WEIGHT = 0.3


def peakedness(scores: Sequence[float]) -> float:
    """``1 - s_[m] / s_max`` over the first ``m = min(len, 100)`` raw scores (best first), clipped to [0, 1].

    Returns 0 for an empty list or when ``s_max <= 0`` (no meaningful ratio).
    """
    head = list(scores[:_PEAK_DEPTH])
    if not head or max(head) <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - head[-1] / max(head)))


def min_max_normalise(scores: dict[str, float], ids: Sequence[str]) -> dict[str, float]:
    """Scores for ``ids`` mapped to [0, 1]; ids missing from ``scores`` get the list's lowest score.

    An empty list gives 0 for every id; a constant list gives 1 for every id
    (it carries no ranking information either way).
    """
    if not scores:
        return {i: 0.0 for i in ids}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return {i: 1.0 for i in ids}
    return {i: (scores.get(i, low) - low) / (high - low) for i in ids}


def dense_weight(dense_scores: Sequence[float], sparse_scores: Sequence[float]) -> float:
    """Adaptive dense weight ``eta = 0.7 * (1 - peak_sparse) + 0.3 * peak_dense`` in [0, 1]."""
    return _SPARSE_PEAK_WEIGHT * (1.0 - peakedness(sparse_scores)) + _DENSE_PEAK_WEIGHT * peakedness(dense_scores)


def fuse_adaptive(dense: Sequence[ScoredPassage], sparse: Sequence[ScoredPassage]) -> list[ScoredPassage]:
    """Adaptive score fusion (module docstring) of two best-first lists; returns all candidates, best first."""
    by_id = _union(dense, sparse)
    ids = list(by_id)
    eta = dense_weight([s for _, s in dense], [s for _, s in sparse])
    s_dense = min_max_normalise({p.id: s for p, s in dense}, ids)
    s_sparse = min_max_normalise({p.id: s for p, s in sparse}, ids)
    fused = {i: eta * s_dense[i] + (1.0 - eta) * s_sparse[i] for i in ids}
    return _ranked(by_id, fused)


def fuse_rrf(dense: Sequence[ScoredPassage], sparse: Sequence[ScoredPassage], rrf_k: float = 60) -> list[ScoredPassage]:
    """Reciprocal-rank fusion of two best-first lists; returns all candidates, best first.

    ``rrf_k`` damps the advantage of top ranks: 0 makes rank 1 dominate, the
    usual 60 flattens the curve so agreement between lists matters more.
    """
    by_id = _union(dense, sparse)
    fused = dict.fromkeys(by_id, 0.0)
    for hits in (dense, sparse):
        for rank, (passage, _) in enumerate(hits, start=1):
            fused[passage.id] += 1.0 / (rrf_k + rank)
    return _ranked(by_id, fused)


def _union(*lists: Sequence[ScoredPassage]) -> dict[str, Passage]:
    """Passages of all lists by id, in first-appearance order."""
    by_id: dict[str, Passage] = {}
    for hits in lists:
        for passage, _ in hits:
            by_id.setdefault(passage.id, passage)
    return by_id


def _ranked(by_id: dict[str, Passage], fused: dict[str, float]) -> list[ScoredPassage]:
    """Passages sorted by fused score, best first; ties keep first-appearance order."""
    order = sorted(by_id, key=lambda i: -fused[i])
    return [(by_id[i], float(fused[i])) for i in order]


class HybridRetriever(BatchRetrieverMixin):
    """Fuse a dense and a sparse retriever over the same corpus (passages matched by id).

    Args:
        dense, sparse: any :class:`PassageRetriever` (normally a DenseRetriever
            and a BM25Retriever built from the same passages).
        fusion: "adaptive" or "rrf" (see the module docstring).
        candidates: each retriever returns ``max(k, candidates)`` hits before
            fusion; more candidates improve recall of the fused list and the
            peakedness estimate (which looks at up to 100) at a small cost.
        rrf_k: the RRF damping constant (only used by "rrf").
    """

    def __init__(
        self,
        dense: PassageRetriever,
        sparse: PassageRetriever,
        *,
        fusion: str = "adaptive",
        candidates: int = 100,
        rrf_k: float = 60,
    ) -> None:
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; expected one of {FUSIONS}")
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        if rrf_k < 0:
            raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
        self.dense = dense
        self.sparse = sparse
        self.fusion = fusion
        self.candidates = candidates
        self.rrf_k = rrf_k

    def _retrieve_nonempty(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        depth = max(k, self.candidates)
        dense_hits = self.dense.retrieve_batch(queries, depth)
        sparse_hits = self.sparse.retrieve_batch(queries, depth)
        return [self._fuse(d, s)[:k] for d, s in zip(dense_hits, sparse_hits)]

    def _fuse(self, dense: list[ScoredPassage], sparse: list[ScoredPassage]) -> list[ScoredPassage]:
        if self.fusion == "rrf":
            return fuse_rrf(dense, sparse, self.rrf_k)
        return fuse_adaptive(dense, sparse)


RETRIEVER_KINDS = ("hybrid", "dense", "bm25")


def _keyword_names(cls: type) -> set[str]:
    """Keyword parameters of ``cls.__init__`` other than self/passages/dense/sparse."""
    params = inspect.signature(cls.__init__).parameters
    return {name for name in params if name not in ("self", "passages", "dense", "sparse")}


def _split_kwargs(kw: dict[str, Any], *classes: type) -> list[dict[str, Any]]:
    """Route ``kw`` to the constructors that accept each name; unknown names raise TypeError."""
    accepted = [_keyword_names(cls) for cls in classes]
    unknown = sorted(set(kw) - set().union(*accepted))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}; accepted: {sorted(set().union(*accepted))}")
    return [{name: value for name, value in kw.items() if name in names} for names in accepted]


def build_retriever(passages: Sequence[Passage], kind: str = "hybrid", **kw: Any) -> PassageRetriever:
    """Build a retriever over ``passages``.

    Args:
        kind: "hybrid" (dense + BM25, fused), "dense" or "bm25".
        **kw: constructor options, routed by name: DenseRetriever (embedder,
            index_factory, batch_size, show_progress, nprobe, nlist, hnsw_m, ef_search,
            on_disk), BM25Retriever
            (k1, b), HybridRetriever (fusion, candidates, rrf_k).

    Raises:
        ValueError: unknown ``kind``. TypeError: an option no component accepts.
    """
    from .bm25 import BM25Retriever
    from .dense import DenseRetriever

    if kind == "dense":
        (dense_kw,) = _split_kwargs(kw, DenseRetriever)
        return DenseRetriever(passages, **dense_kw)
    if kind == "bm25":
        (bm25_kw,) = _split_kwargs(kw, BM25Retriever)
        return BM25Retriever(passages, **bm25_kw)
    if kind == "hybrid":
        dense_kw, bm25_kw, hybrid_kw = _split_kwargs(kw, DenseRetriever, BM25Retriever, HybridRetriever)
        return HybridRetriever(DenseRetriever(passages, **dense_kw), BM25Retriever(passages, **bm25_kw), **hybrid_kw)
    raise ValueError(f"unknown retriever kind {kind!r}; expected one of {RETRIEVER_KINDS}")
