"""The FAISS key codecs: 8-bit scalar quantization (``sq8``) and product quantization,
optionally after an OPQ rotation (``pq<M>``, ``opq<M>``).

``sq8`` scores from its byte levels with one matrix product; ``pq`` and ``opq`` (and ``spq``,
:mod:`nest_integrations.store.spectral_codec`) share :class:`LookupTableCodec`: codes of one
byte per sub-quantizer, scored by asymmetric distance computation, a lookup table per query
and one table lookup per stored byte. Training runs FAISS's k-means (:func:`kmeans_centroids`
for a single sub-space); the trained parameters are plain float32 arrays.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np

from .codec_base import PQ_CENTROIDS, KeyCodec, check_dim, check_orthogonal, check_training_sample, codec_param

if TYPE_CHECKING:  # pragma: no cover
    import torch

GATHER_ELEMENTS = 1 << 22
"""Table entries gathered at once in PQ scoring (16 MiB of float32)."""
OPQ_ITERATIONS = 20
"""Rotation updates of OPQ training (FAISS's default is 50): each runs a few PQ k-means
iterations, so OPQ training costs several PQ trainings; fewer iterations, a less tuned rotation."""


class ScalarQuantizer8Codec(KeyCodec):
    """FAISS 8-bit scalar quantization (``QT_8bit``: per-dimension min and range).

    Row ``c`` stands for ``k~ = vmin + (c + 0.5) / 255 * vdiff``, so
    ``q . k~ = q . (vmin + vdiff / 510) + (q * vdiff / 255) . c``: one product
    with the byte levels, which the candidate set keeps as float32 (the same
    memory as float16 keys while decoding; the saving is on disk and in the
    memory-mapped store).
    """

    def __init__(self, dim: int, *, vmin: np.ndarray | None = None, vdiff: np.ndarray | None = None):
        check_dim(dim)
        self.spec, self.dim, self.code_dtype, self.code_width = "sq8", dim, np.dtype(np.uint8), dim
        self.vmin = None if vmin is None else codec_param(vmin, (dim,), "vmin")
        self.vdiff = None if vdiff is None else codec_param(vdiff, (dim,), "vdiff")
        if (self.vmin is None) != (self.vdiff is None):
            raise ValueError("sq8 needs both vmin and vdiff, or neither")

    @property
    def is_trained(self) -> bool:
        return self.vmin is not None

    def _faiss_quantizer(self) -> Any:
        faiss = _faiss()
        quantizer = faiss.ScalarQuantizer(self.dim, faiss.ScalarQuantizer.QT_8bit)
        if self.is_trained:
            faiss.copy_array_to_vector(np.concatenate([self.vmin, self.vdiff]), quantizer.trained)
        return quantizer

    def train(self, sample: np.ndarray) -> None:
        sample = check_training_sample(self._check_keys(sample))
        quantizer = self._faiss_quantizer()
        quantizer.train(sample)
        trained = _faiss().vector_to_array(quantizer.trained)
        self.vmin, self.vdiff = trained[: self.dim].copy(), trained[self.dim :].copy()

    def encode(self, keys: np.ndarray) -> np.ndarray:
        self._check_trained()
        return np.ascontiguousarray(self._faiss_quantizer().compute_codes(self._check_keys(keys)))

    def prepare(self, rows: np.ndarray) -> "torch.Tensor":
        import torch

        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))

    def inner_products(self, queries: "torch.Tensor", block: "torch.Tensor") -> "torch.Tensor":
        import torch

        vmin, vdiff = torch.from_numpy(self.vmin), torch.from_numpy(self.vdiff)
        offset = queries @ (vmin + vdiff / 510.0)
        return offset[:, None] + (queries * (vdiff / 255.0)) @ block.T

    def squared_norms(self, block: "torch.Tensor") -> "torch.Tensor":
        import torch

        decoded_sq = torch.zeros(block.shape[0])
        vmin, vdiff = torch.from_numpy(self.vmin), torch.from_numpy(self.vdiff)
        for lo in range(0, block.shape[0], 4096):  # bounded float32 temporaries
            part = vmin + (block[lo : lo + 4096] + 0.5) / 255.0 * vdiff
            decoded_sq[lo : lo + 4096] = (part * part).sum(-1)
        return decoded_sq

    def arrays(self) -> dict[str, np.ndarray]:
        self._check_trained()
        return {"vmin": self.vmin, "vdiff": self.vdiff}


class LookupTableCodec(KeyCodec):
    """Codes of ``m`` bytes, one 256-centroid sub-quantizer per byte, scored by table lookups.

    Subclasses give :meth:`lookup_tables` (a query's inner product with every
    centroid of every sub-quantizer) and :meth:`centroid_squared_norms`; the
    sub-spaces are disjoint, so both add up over a row's ``m`` codes.

    Search form of n rows: int64 (n, m) indices into the flattened (m * 256)
    lookup table; ``inner_products`` gathers the m table entries of every row
    for a chunk of queries at once (one ``index_select``, temporaries bounded
    by :data:`GATHER_ELEMENTS`) and sums them, many times faster than
    ``embedding_bag`` over the same codes (docs/compression.md, Speed).
    """

    m: int

    @abstractmethod
    def lookup_tables(self, queries: "torch.Tensor") -> "torch.Tensor":
        """float32 (T, m, 256): inner product of each query's sub-vectors with every centroid."""

    @abstractmethod
    def centroid_squared_norms(self) -> np.ndarray:
        """float32 (m, 256): squared norm of every centroid."""

    def prepare(self, rows: np.ndarray) -> "torch.Tensor":
        import torch

        rows = np.asarray(rows)
        assert rows.ndim == 2 and rows.shape[1] == self.m and rows.dtype == np.uint8, (rows.shape, rows.dtype)
        return torch.from_numpy(rows.astype(np.int64) + np.arange(self.m, dtype=np.int64) * PQ_CENTROIDS)

    def _sum_tables(self, block: "torch.Tensor", tables: "torch.Tensor") -> "torch.Tensor":
        """float32 (C, n): for each of C tables (C, m * 256), the sum over each row's m codes."""
        import torch

        n = block.shape[0]
        flat = block.reshape(-1)
        out = torch.empty((tables.shape[0], n))
        stride = max(1, GATHER_ELEMENTS // max(flat.numel(), 1))
        for lo in range(0, tables.shape[0], stride):
            part = tables[lo : lo + stride]
            out[lo : lo + stride] = part.index_select(1, flat).view(part.shape[0], n, self.m).sum(-1)
        return out

    def inner_products(self, queries: "torch.Tensor", block: "torch.Tensor") -> "torch.Tensor":
        self._check_trained()
        return self._sum_tables(block, self.lookup_tables(queries).reshape(queries.shape[0], self.m * PQ_CENTROIDS))

    def squared_norms(self, block: "torch.Tensor") -> "torch.Tensor":
        import torch

        self._check_trained()
        return self._sum_tables(block, torch.from_numpy(self.centroid_squared_norms().reshape(1, -1)))[0]


class ProductQuantizerCodec(LookupTableCodec):
    """FAISS product quantization, optionally after an OPQ rotation.

    Args:
        dim: key width ``d``.
        m: sub-quantizers (bytes per token); must divide ``d``. Fewer bytes,
            coarser keys: top-1 agreement with float16 falls as ``m`` does.
        rotate: learn an OPQ rotation first (``opq<M>``). Training then costs
            several PQ trainings (:data:`OPQ_ITERATIONS`; docs/compression.md has the times).
        centroids: trained float32 (m, 256, d / m), or None (untrained).
        rotation: trained orthogonal float32 (d, d) with ``x_rot = x @ rotation.T``
            (``rotate`` only), or None.
        opq_iterations: rotation updates when training (``rotate`` only).

    Scored as :class:`LookupTableCodec`.
    """

    def __init__(
        self, dim: int, m: int, *, rotate: bool = False,
        centroids: np.ndarray | None = None, rotation: np.ndarray | None = None, opq_iterations: int = OPQ_ITERATIONS,
    ):
        check_dim(dim)
        if m < 1 or dim % m:
            raise ValueError(f"pq needs a sub-quantizer count M that divides the key width {dim}; got M={m}")
        if opq_iterations < 1:
            raise ValueError(f"opq_iterations must be at least 1, got {opq_iterations}")
        self.opq_iterations = opq_iterations
        self.spec = f"{'opq' if rotate else 'pq'}{m}"
        self.dim, self.m, self.rotate = dim, m, rotate
        self.code_dtype, self.code_width = np.dtype(np.uint8), m
        self.dsub = dim // m
        self.centroids = None if centroids is None else codec_param(centroids, (m, PQ_CENTROIDS, self.dsub), "centroids")
        self.rotation = None if rotation is None else codec_param(rotation, (dim, dim), "rotation")
        if rotate != (self.rotation is not None) and self.centroids is not None:
            raise ValueError(f"{self.spec}: a rotation is needed exactly when the codec is opq")
        if self.rotation is not None:
            check_orthogonal(self.rotation, self.spec)

    @property
    def is_trained(self) -> bool:
        return self.centroids is not None

    def train(self, sample: np.ndarray) -> None:
        faiss = _faiss()
        sample = check_training_sample(self._check_keys(sample))
        if self.rotate:
            opq = faiss.OPQMatrix(self.dim, self.m)
            inner = _faiss_pq(self.dim, self.m)  # OPQ's own PQ, with the same k-means settings
            opq.pq = inner
            opq.niter = self.opq_iterations
            opq.train(sample)
            self.rotation = faiss.vector_to_array(opq.A).reshape(self.dim, self.dim).astype(np.float32)
            sample = self._rotated(sample)
        pq = _faiss_pq(self.dim, self.m)
        pq.train(sample)
        self.centroids = faiss.vector_to_array(pq.centroids).reshape(self.m, PQ_CENTROIDS, self.dsub).astype(np.float32)

    def _rotated(self, keys: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(keys @ self.rotation.T) if self.rotation is not None else keys

    def encode(self, keys: np.ndarray) -> np.ndarray:
        self._check_trained()
        pq = _faiss_pq(self.dim, self.m)
        _faiss().copy_array_to_vector(self.centroids.ravel(), pq.centroids)
        return np.ascontiguousarray(pq.compute_codes(self._rotated(self._check_keys(keys))))

    def lookup_tables(self, queries: "torch.Tensor") -> "torch.Tensor":
        """float32 (T, m, 256): inner product of each query's sub-vectors with every centroid."""
        import torch

        if self.rotation is not None:
            queries = queries @ torch.from_numpy(self.rotation).T
        return torch.einsum("tms,mks->tmk", queries.reshape(-1, self.m, self.dsub), torch.from_numpy(self.centroids))

    def centroid_squared_norms(self) -> np.ndarray:
        return (self.centroids**2).sum(-1)

    def arrays(self) -> dict[str, np.ndarray]:
        self._check_trained()
        out = {"centroids": self.centroids}
        if self.rotation is not None:
            out["rotation"] = self.rotation
        return out


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - faiss-cpu is a core dependency
        raise ImportError("compressed keys need faiss: pip install faiss-cpu") from err
    return faiss


def kmeans_centroids(points: np.ndarray) -> np.ndarray:
    """float32 (256, w): FAISS k-means centroids of (n, w) points (same settings as :func:`_faiss_pq`)."""
    kmeans = _faiss().Kmeans(points.shape[1], PQ_CENTROIDS, niter=25, seed=1234, min_points_per_centroid=1)
    kmeans.train(np.ascontiguousarray(points, dtype=np.float32))
    return kmeans.centroids.astype(np.float32)


def _faiss_pq(dim: int, m: int) -> Any:
    """A FAISS 8-bit ProductQuantizer whose k-means accepts small samples quietly
    (:func:`~nest_integrations.store.codec_base.check_training_sample` warns once instead of FAISS once per sub-space)."""
    pq = _faiss().ProductQuantizer(dim, m, 8)
    pq.cp.min_points_per_centroid = 1
    return pq
