"""How precomputed token keys are stored and scored: float16 rows or FAISS codes.

A key codec turns float keys (n, d) into stored rows (n, code_width) and
scores queries against a subset of stored rows -- the tokens of one
generation's retrieved passages -- without reconstructing them:

* ``float16``: the identity, ``2 * d`` bytes per token (1,152 B on SmolLM2-135M);
  scores are exact.
* ``sq8``: FAISS 8-bit scalar quantization, one byte per dimension (``d`` bytes).
  A reference point: it halves the bytes, not more.
* ``pq<M>``: FAISS product quantization, ``M`` sub-quantizers of 256 centroids,
  one byte each (``M`` bytes per token; ``d`` must be divisible by ``M``). Scores
  come from asymmetric distance computation: per query, a lookup table of its
  inner product with every centroid of every sub-space (``M x 256`` numbers),
  then one table lookup per stored byte.
* ``opq<M>``: ``pq<M>`` after a learned orthogonal rotation (FAISS OPQ), which
  spreads variance evenly over the sub-spaces; same bytes, better agreement,
  slower training.
* ``spq<M>``: ``M - 1`` bytes of product quantization in the keys' PCA basis,
  with sub-spaces sized by the spectrum (narrow for the strong axes, wide for
  the weak ones; ``M`` need not divide ``d``) and trained in a metric weighted
  by it, plus one byte for each key's squared reconstruction error: at the same
  bytes, the best top-1 agreement of these codecs on SmolLM2 keys, training in
  less time than ``pq<M>``, scoring about twice as slow
  (:class:`SpectralPQCodec`).

Every codec exposes the same two quantities, from which the candidate set
computes squared L2 distances in the keys' own units (see
:meth:`nest_integrations.store.candidates.CandidateSet.search`):

* ``inner_products(queries, block)``: ``q . k~`` for every query and row;
* ``squared_norms(block)``: ``||k~||^2`` per row (for ``spq``, plus the row's
  stored squared error ``||k - k~||^2``);

where ``k~`` is the key the codes stand for (the rotation is orthogonal, so it
changes neither). ``||q - k~||^2 = ||q||^2 - 2 q.k~ + ||k~||^2``: the RRC
weight and the kNN softmax read approximate distances on the same scale as
float16 ones.

A codec is trained once (on a sample of float32 keys), then encodes any
number of batches independently: shards of one corpus share one trained codec
and append their codes. Its trained parameters are plain float32 arrays
(:meth:`KeyCodec.arrays`, :func:`codec_from_arrays`), saved beside the codes.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

PQ_CENTROIDS = 256
"""Centroids per PQ sub-quantizer: 8-bit codes, one byte per sub-quantizer."""
MIN_TRAIN_KEYS = PQ_CENTROIDS
"""Fewest training keys accepted: k-means needs at least one point per centroid."""
RECOMMENDED_TRAIN_KEYS = 39 * PQ_CENTROIDS
"""FAISS's own advice for k-means (39 points per centroid); fewer trains but logs a warning."""
DEFAULT_TRAIN_KEYS = 32_768
"""Keys sampled for training by default (``train_keys`` of the precompute): above FAISS's
advice, and training time grows linearly with it (docs/compression.md, Training, has
measured times)."""
GATHER_ELEMENTS = 1 << 22
"""Table entries gathered at once in PQ scoring (16 MiB of float32)."""
OPQ_ITERATIONS = 20
"""Rotation updates of OPQ training (FAISS's default is 50): each runs a few PQ k-means
iterations, so OPQ training costs several PQ trainings; fewer iterations, a less tuned rotation."""

ENERGY_HEADROOM = 4.0
"""spq's error levels reach this many times the largest squared error of the training keys: keys
the codec never saw are coded worse than its training sample (docs/compression.md, How spq codes
keys, has how much worse); a wider range costs resolution (~3% per level at 1,000x)."""

_SPEC = re.compile(r"^(?P<kind>float16|sq8|pq|opq|spq)(?P<m>[0-9]+)?$")
CODEC_HELP = "float16 (none), sq8, pq<M>, opq<M> (M bytes per token; M divides the hidden size) or spq<M> (M bytes, 2 <= M <= the hidden size)"


class KeyCodec(ABC):
    """Stored form of token keys, and scoring of queries against stored rows.

    Attributes:
        spec: the codec's name, e.g. ``"opq96"`` (see the module docstring).
        dim: key width ``d``.
        code_dtype: dtype of a stored row (float16 or uint8).
        code_width: columns of a stored row.
    """

    spec: str
    dim: int
    code_dtype: np.dtype
    code_width: int

    @property
    def bytes_per_key(self) -> int:
        """Stored bytes per token."""
        return int(self.code_width * np.dtype(self.code_dtype).itemsize)

    @property
    def is_trained(self) -> bool:
        return True

    @property
    def compresses(self) -> bool:
        """Whether stored rows are codes rather than the float16 keys themselves."""
        return True

    def train(self, sample: np.ndarray) -> None:
        """Fit the codec to float32 (n, d) keys (a no-op for codecs without parameters)."""

    @abstractmethod
    def encode(self, keys: np.ndarray) -> np.ndarray:
        """Stored rows of float (n, d) keys: C-contiguous ``code_dtype`` (n, code_width)."""

    @abstractmethod
    def prepare(self, rows: np.ndarray) -> Any:
        """The search form of stored rows (n, code_width), built once per candidate set."""

    @abstractmethod
    def inner_products(self, queries: "torch.Tensor", block: Any) -> "torch.Tensor":
        """float32 (T, n): ``q . k~`` for float32 (T, d) queries and a prepared block of n rows."""

    @abstractmethod
    def squared_norms(self, block: Any) -> "torch.Tensor":
        """float32 (n,): the row term of ``||q - k||^2``: ``||k~||^2`` of a prepared block,
        plus the stored squared error where the codec keeps one (``spq``)."""

    def arrays(self) -> dict[str, np.ndarray]:
        """Trained parameters by name (float32, C-contiguous), what is saved."""
        return {}

    # ------------------------------------------------------------------ helpers
    def _check_keys(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys)
        if keys.ndim != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"{self.spec} keys must be (n, {self.dim}), got {keys.shape}")
        return np.ascontiguousarray(keys, dtype=np.float32)

    def _check_trained(self) -> None:
        if not self.is_trained:
            raise ValueError(f"the {self.spec} codec is not trained; call train() on a sample of keys first")


class Float16Codec(KeyCodec):
    """The identity: rows are the float16 keys; scores are exact."""

    def __init__(self, dim: int):
        _check_dim(dim)
        self.spec, self.dim, self.code_dtype, self.code_width = "float16", dim, np.dtype(np.float16), dim

    @property
    def compresses(self) -> bool:
        return False

    def encode(self, keys: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(self._check_keys(keys), dtype=np.float16)

    def prepare(self, rows: np.ndarray) -> "torch.Tensor":
        import torch

        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))

    def inner_products(self, queries: "torch.Tensor", block: "torch.Tensor") -> "torch.Tensor":
        return queries @ block.T

    def squared_norms(self, block: "torch.Tensor") -> "torch.Tensor":
        return (block * block).sum(-1)


class ScalarQuantizer8Codec(KeyCodec):
    """FAISS 8-bit scalar quantization (``QT_8bit``: per-dimension min and range).

    Row ``c`` stands for ``k~ = vmin + (c + 0.5) / 255 * vdiff``, so
    ``q . k~ = q . (vmin + vdiff / 510) + (q * vdiff / 255) . c``: one product
    with the byte levels, which the candidate set keeps as float32 (the same
    memory as float16 keys while decoding; the saving is on disk and in the
    memory-mapped store).
    """

    def __init__(self, dim: int, *, vmin: np.ndarray | None = None, vdiff: np.ndarray | None = None):
        _check_dim(dim)
        self.spec, self.dim, self.code_dtype, self.code_width = "sq8", dim, np.dtype(np.uint8), dim
        self.vmin = None if vmin is None else _param(vmin, (dim,), "vmin")
        self.vdiff = None if vdiff is None else _param(vdiff, (dim,), "vdiff")
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
        sample = _check_sample(self._check_keys(sample))
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


class _LookupTableCodec(KeyCodec):
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


class ProductQuantizerCodec(_LookupTableCodec):
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

    Scored as :class:`_LookupTableCodec`.
    """

    def __init__(
        self, dim: int, m: int, *, rotate: bool = False,
        centroids: np.ndarray | None = None, rotation: np.ndarray | None = None, opq_iterations: int = OPQ_ITERATIONS,
    ):
        _check_dim(dim)
        if m < 1 or dim % m:
            raise ValueError(f"pq needs a sub-quantizer count M that divides the key width {dim}; got M={m}")
        if opq_iterations < 1:
            raise ValueError(f"opq_iterations must be at least 1, got {opq_iterations}")
        self.opq_iterations = opq_iterations
        self.spec = f"{'opq' if rotate else 'pq'}{m}"
        self.dim, self.m, self.rotate = dim, m, rotate
        self.code_dtype, self.code_width = np.dtype(np.uint8), m
        self.dsub = dim // m
        self.centroids = None if centroids is None else _param(centroids, (m, PQ_CENTROIDS, self.dsub), "centroids")
        self.rotation = None if rotation is None else _param(rotation, (dim, dim), "rotation")
        if rotate != (self.rotation is not None) and self.centroids is not None:
            raise ValueError(f"{self.spec}: a rotation is needed exactly when the codec is opq")
        if self.rotation is not None:
            _check_orthogonal(self.rotation, self.spec)

    @property
    def is_trained(self) -> bool:
        return self.centroids is not None

    def train(self, sample: np.ndarray) -> None:
        faiss = _faiss()
        sample = _check_sample(self._check_keys(sample))
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


@dataclass(frozen=True)
class _SpectralBlock:
    """Search form of spq rows: lookup-table indices of the sub-space codes, and each row's
    stored squared reconstruction error (float32 (n,))."""

    codes: "torch.Tensor"
    residual_energy: "torch.Tensor"


class SpectralPQCodec(_LookupTableCodec):
    """Product quantization in the keys' PCA basis, weighted by the spectrum, plus each key's error (``spq<M>``).

    A row is ``M`` bytes: ``M - 1`` sub-space codes and one byte for the
    key's squared reconstruction error ``||k - k~||^2``.

    * **Sub-spaces.** Keys are rotated onto their principal axes (orthogonal, so
      scores keep their units), then cut into ``M - 1`` runs of consecutive axes,
      each coded by one byte (256 centroids). The widths follow reverse
      water-filling (:func:`spectral_widths`), so the leading axes get narrow
      sub-spaces and the weak tail wide ones; ``M`` need not divide ``d``.
    * **Metric.** Centroids are trained, and keys encoded, in the metric that
      weights axis ``i`` by its variance ``lambda_i``. A ranking error of a
      candidate ``k`` is ``2 (q - k) . (k - k~)``, and ``q - k`` for a decoding
      query and its nearest candidates spreads along the axes roughly as the
      keys do (measured: docs/compression.md, How spq codes keys), so bits go where that product is
      large; water-filling runs on ``lambda^2``, the weighted variances.
    * **Error byte.** ``||q - k||^2 = ||q - k~||^2 + 2 (q - k~) . (k~ - k) + ||k - k~||^2``:
      the middle term averages out, the last does not, and it is largest for the
      outlying keys that codes pull towards the bulk (they would look closer than
      they are). Each row stores it on a 256-level logarithmic scale
      (``energy_levels``), and :meth:`squared_norms` adds it to ``||k~||^2``.

    Measured on ``nest bench keys``: at the same bytes spq finds the float16
    nearest entry more often than pq and opq, most of all for queries far from
    the corpus (the LM's own answers); docs/compression.md has the figures.
    Training is one eigendecomposition
    plus ``M - 1`` small k-means (no OPQ-style alternation).

    Args:
        dim: key width ``d``.
        m: bytes per token (``2 <= m <= d``).
        rotation: trained orthogonal float32 (d, d), rows the principal axes by
            falling variance, ``x_rot = x @ rotation.T``; or None (untrained).
        spectrum: trained float32 (d,): the variance along each axis (the
            metric's weights), positive and falling.
        centroids: trained float32 (256, d): column block ``j`` (``widths[j]``
            columns, in order) holds sub-space ``j``'s 256 centroids, in the
            rotated (unweighted) coordinates.
        widths: trained float32 (m - 1,) of positive integers summing to ``d``.
        energy_levels: trained float32 (256,), non-negative and rising: the
            squared errors the error byte stands for.

    Scored as :class:`_LookupTableCodec` over the ``m - 1`` codes; a query's
    lookup table costs one elementwise product with the (256, d) centroids and
    a cumulative sum over the columns.
    """

    def __init__(
        self, dim: int, m: int, *,
        rotation: np.ndarray | None = None, spectrum: np.ndarray | None = None, centroids: np.ndarray | None = None,
        widths: np.ndarray | None = None, energy_levels: np.ndarray | None = None,
    ):
        _check_dim(dim)
        if not 2 <= m <= dim:
            raise ValueError(f"spq needs 2 <= M <= the key width {dim}; got M={m}")
        self.spec, self.dim = f"spq{m}", dim
        self.m = m - 1  # sub-quantizers; the last byte is the error
        self.code_dtype, self.code_width = np.dtype(np.uint8), m
        trained = {"rotation": rotation, "spectrum": spectrum, "centroids": centroids, "widths": widths, "energy_levels": energy_levels}
        given = [value is not None for value in trained.values()]
        if any(given) and not all(given):
            raise ValueError(f"spq needs {', '.join(trained)}, or none of them")
        self.rotation = self.spectrum = self.centroids = self.widths = self.energy_levels = None
        if all(given):
            self._set_trained(**trained)

    def _set_trained(
        self, rotation: np.ndarray, spectrum: np.ndarray, centroids: np.ndarray, widths: np.ndarray, energy_levels: np.ndarray
    ) -> None:
        rotation = _param(rotation, (self.dim, self.dim), "rotation")
        spectrum = _param(spectrum, (self.dim,), "spectrum")
        centroids = _param(centroids, (PQ_CENTROIDS, self.dim), "centroids")
        widths = _param(widths, (self.m,), "widths")
        energy_levels = _param(energy_levels, (PQ_CENTROIDS,), "energy_levels")
        if (widths < 1).any() or (widths != np.round(widths)).any() or int(widths.sum()) != self.dim:
            raise ValueError(f"spq widths must be positive integers summing to {self.dim}")
        if (spectrum <= 0).any():
            raise ValueError("spq spectrum must be positive")
        if (energy_levels < 0).any() or (np.diff(energy_levels) < 0).any():
            raise ValueError("spq energy_levels must be non-negative and rising")
        _check_orthogonal(rotation, self.spec)
        self.rotation, self.spectrum, self.centroids, self.widths, self.energy_levels = rotation, spectrum, centroids, widths, energy_levels
        self._ends = np.cumsum(widths.astype(np.int64))
        self._starts = self._ends - widths.astype(np.int64)

    @property
    def is_trained(self) -> bool:
        return self.centroids is not None

    def train(self, sample: np.ndarray) -> None:
        sample = _check_sample(self._check_keys(sample)).astype(np.float64)
        eigenvalues, axes = np.linalg.eigh(np.cov(sample, rowvar=False))
        order = np.argsort(eigenvalues)[::-1]
        spectrum = np.maximum(eigenvalues[order], 1e-9 * max(eigenvalues[order[0]], 1e-30))
        rotation = np.ascontiguousarray(axes[:, order].T, dtype=np.float32)
        widths = spectral_widths(spectrum**2, self.m)
        scale = np.sqrt(spectrum)
        weighted = np.ascontiguousarray((sample @ rotation.T.astype(np.float64)) * scale, dtype=np.float32)
        ends = np.cumsum(widths)
        centroids = np.concatenate([_kmeans(weighted[:, b - w : b]) / scale[b - w : b] for b, w in zip(ends, widths)], axis=1)
        self._set_trained(rotation, spectrum.astype(np.float32), centroids.astype(np.float32), widths.astype(np.float32), np.zeros(PQ_CENTROIDS, np.float32))
        energies = self._codes_and_energies(sample.astype(np.float32))[1]
        positive = energies[energies > 0]
        low = float(positive.min()) if len(positive) else 1e-6
        high = ENERGY_HEADROOM * max(float(energies.max()), low)
        self.energy_levels = np.geomspace(low, high, PQ_CENTROIDS).astype(np.float32)

    def _codes_and_energies(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """uint8 (n, m - 1) nearest centroids in the weighted metric, float32 (n,) squared errors."""
        rotated = keys @ self.rotation.T
        codes = np.empty((len(rotated), self.m), dtype=np.uint8)
        energies = np.zeros(len(rotated), dtype=np.float32)
        for j, (a, b) in enumerate(zip(self._starts, self._ends)):
            sub, cents, weights = rotated[:, a:b], self.centroids[:, a:b], self.spectrum[a:b]
            half_sq = 0.5 * (cents * cents) @ weights
            for lo in range(0, len(sub), 16_384):  # nearest centroid: argmax of x.W.c - c.W.c / 2
                part = sub[lo : lo + 16_384]
                chosen = np.argmax((part * weights) @ cents.T - half_sq, axis=1)
                codes[lo : lo + 16_384, j] = chosen
                energies[lo : lo + 16_384] += ((part - cents[chosen]) ** 2).sum(1)
        return codes, energies

    def encode(self, keys: np.ndarray) -> np.ndarray:
        self._check_trained()
        codes, energies = self._codes_and_energies(self._check_keys(keys))
        return np.ascontiguousarray(np.concatenate([codes, self._energy_bytes(energies)[:, None]], axis=1))

    def _energy_bytes(self, energies: np.ndarray) -> np.ndarray:
        """uint8 (n,): the nearest level of each squared error on the levels' logarithmic scale."""
        log_levels = np.log(np.maximum(self.energy_levels, 1e-30))
        midpoints = 0.5 * (log_levels[1:] + log_levels[:-1])
        return np.searchsorted(midpoints, np.log(np.maximum(energies, 1e-30))).astype(np.uint8)

    def prepare(self, rows: np.ndarray) -> _SpectralBlock:
        import torch

        rows = np.asarray(rows)
        assert rows.ndim == 2 and rows.shape[1] == self.code_width and rows.dtype == np.uint8, (rows.shape, rows.dtype)
        self._check_trained()
        return _SpectralBlock(super().prepare(rows[:, :-1]), torch.from_numpy(self.energy_levels[rows[:, -1]]))

    def inner_products(self, queries: "torch.Tensor", block: _SpectralBlock) -> "torch.Tensor":
        return super().inner_products(queries, block.codes)

    def squared_norms(self, block: _SpectralBlock) -> "torch.Tensor":
        """``||k~||^2`` plus the stored squared error: ``||q||^2 - 2 q.k~ +`` this estimates ``||q - k||^2``."""
        return super().squared_norms(block.codes) + block.residual_energy

    def _segment_sums(self, per_column: "torch.Tensor") -> "torch.Tensor":
        """(..., m - 1): sums of the last axis (d columns) over each sub-space's columns."""
        import torch

        totals = per_column.cumsum(-1).index_select(-1, torch.from_numpy(self._ends - 1))
        return torch.cat([totals[..., :1], totals[..., 1:] - totals[..., :-1]], dim=-1)

    def lookup_tables(self, queries: "torch.Tensor") -> "torch.Tensor":
        import torch

        self._check_trained()
        rotated = queries @ torch.from_numpy(self.rotation).T
        centroids = torch.from_numpy(self.centroids)
        tables = torch.empty((len(rotated), self.m, PQ_CENTROIDS))
        stride = max(1, GATHER_ELEMENTS // centroids.numel())  # bounded (stride, 256, d) products
        for lo in range(0, len(rotated), stride):
            tables[lo : lo + stride] = self._segment_sums(rotated[lo : lo + stride, None, :] * centroids).transpose(1, 2)
        return tables

    def centroid_squared_norms(self) -> np.ndarray:
        import torch

        return self._segment_sums(torch.from_numpy(self.centroids**2)).T.contiguous().numpy()

    def arrays(self) -> dict[str, np.ndarray]:
        self._check_trained()
        return {
            "rotation": self.rotation, "spectrum": self.spectrum, "centroids": self.centroids,
            "widths": self.widths, "energy_levels": self.energy_levels,
        }


def spectral_widths(eigenvalues: np.ndarray, m: int) -> np.ndarray:
    """int64 (m,): widths of ``m`` runs of consecutive principal axes, each worth ~``8`` bits.

    Reverse water-filling spends ``8 * m`` bits on axes of variance
    ``eigenvalues`` (falling): ``bits_i = max(0, log2(eigenvalue_i / theta) / 2)``
    for the level ``theta`` at which they sum to ``8 * m``; run ``j`` ends at the
    first axis where the cumulative bits reach ``(j + 1) / m`` of the total
    (each run at least one axis; axes given no bits join the last run).
    """
    variances = np.maximum(np.asarray(eigenvalues, dtype=np.float64), 1e-12)
    total = 8.0 * m
    lo, hi = variances.min() * 1e-12, variances.max()
    for _ in range(200):  # bisection on log(theta)
        theta = np.sqrt(lo * hi)
        bits = np.maximum(0.0, 0.5 * np.log2(variances / theta)).sum()
        lo, hi = (theta, hi) if bits > total else (lo, theta)
    bits = np.maximum(0.0, 0.5 * np.log2(variances / np.sqrt(lo * hi)))
    cumulative = np.cumsum(bits) / max(bits.sum(), 1e-12)
    d, ends = len(variances), []
    for j in range(m - 1):
        end = int(np.searchsorted(cumulative, (j + 1) / m - 1e-9)) + 1
        ends.append(min(max(end, (ends[-1] if ends else 0) + 1), d - (m - 1 - j)))
    return np.diff(np.concatenate([[0], ends, [d]])).astype(np.int64)


# --------------------------------------------------------------------------- construction
def make_codec(spec: str, dim: int) -> KeyCodec:
    """An untrained codec from its name (see :data:`CODEC_HELP`); ``"none"`` means float16.

    Raises:
        ValueError: an unknown name, or M that does not divide ``dim`` (pq, opq)
            or exceeds it (spq).
    """
    kind, m = parse_spec(spec)
    if kind == "float16":
        return Float16Codec(dim)
    if kind == "sq8":
        return ScalarQuantizer8Codec(dim)
    if kind == "spq":
        return SpectralPQCodec(dim, m)
    return ProductQuantizerCodec(dim, m, rotate=kind == "opq")


def resolve_codec(codec: "KeyCodec | str", dim: int) -> KeyCodec:
    """``codec`` itself, or an untrained codec from its name, checked against the key width ``dim``.

    Raises:
        ValueError: an unknown name, or a codec of another width than ``dim`` (the LM's hidden size).
    """
    codec = make_codec(codec, dim) if isinstance(codec, str) else codec
    if codec.dim != dim:
        raise ValueError(f"the key codec is {codec.dim}-d, the LM's hidden size is {dim}")
    return codec


def parse_spec(spec: str) -> tuple[str, int]:
    """``(kind, M)`` of a codec name (M = 0 for float16 and sq8).

    Raises:
        ValueError: not ``none``, ``float16``, ``sq8``, ``pq<M>``, ``opq<M>`` or ``spq<M>``.
    """
    match = _SPEC.match("float16" if spec == "none" else spec) if isinstance(spec, str) else None
    if match is None or (match["kind"] in ("pq", "opq", "spq")) != (match["m"] is not None) or match["kind"] == "sq8" and match["m"]:
        raise ValueError(f"unknown key codec {spec!r}; choose {CODEC_HELP}")
    return match["kind"], int(match["m"] or 0)


def codec_from_arrays(spec: str, dim: int, arrays: Mapping[str, np.ndarray]) -> KeyCodec:
    """A trained codec from saved parameters (see :meth:`KeyCodec.arrays`).

    Raises:
        ValueError: an unknown spec, missing or extra arrays, or arrays of the
            wrong dtype, shape or with non-finite values.
    """
    kind, m = parse_spec(spec)
    expected = set(saved_array_names(spec))
    if set(arrays) != expected:
        raise ValueError(f"a {spec} codec is saved as {sorted(expected) or 'no arrays'}, found {sorted(arrays)}")
    if kind == "float16":
        return Float16Codec(dim)
    if kind == "sq8":
        return ScalarQuantizer8Codec(dim, vmin=arrays["vmin"], vdiff=arrays["vdiff"])
    if kind == "spq":
        return SpectralPQCodec(dim, m, **arrays)
    return ProductQuantizerCodec(dim, m, rotate=kind == "opq", centroids=arrays["centroids"], rotation=arrays.get("rotation"))


def saved_array_names(spec: str) -> tuple[str, ...]:
    """Names of the arrays a trained ``spec`` codec saves (see :meth:`KeyCodec.arrays`)."""
    kind, _ = parse_spec(spec)
    return {
        "float16": (), "sq8": ("vmin", "vdiff"), "pq": ("centroids",), "opq": ("centroids", "rotation"),
        "spq": ("centroids", "energy_levels", "rotation", "spectrum", "widths"),
    }[kind]


def sample_rows(keys: np.ndarray, count: int, *, seed: int = 0) -> np.ndarray:
    """float32 (min(count, n), d): ``count`` rows of ``keys`` drawn without replacement."""
    if len(keys) <= count:
        return np.ascontiguousarray(keys, dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(len(keys), size=count, replace=False))
    return np.ascontiguousarray(keys[rows], dtype=np.float32)


# --------------------------------------------------------------------------- checks
def _check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"key width must be a positive integer, got {dim!r}")


def _param(value: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    value = np.asarray(value)
    if value.dtype != np.float32 or value.shape != shape:
        raise ValueError(f"codec parameter {name} must be float32 {shape}, got {value.dtype} {value.shape}")
    if not np.isfinite(value).all():
        raise ValueError(f"codec parameter {name} holds non-finite values")
    return np.ascontiguousarray(value)


def _check_orthogonal(rotation: np.ndarray, spec: str) -> None:
    """A trained rotation must keep distances (scores stay in the keys' units)."""
    if not np.allclose(rotation @ rotation.T, np.eye(len(rotation)), atol=1e-3):
        raise ValueError(f"{spec}: the rotation is not orthogonal, so distances would change units")


def _check_sample(sample: np.ndarray) -> np.ndarray:
    if len(sample) < MIN_TRAIN_KEYS:
        raise ValueError(f"training a key codec needs at least {MIN_TRAIN_KEYS} keys, got {len(sample)}")
    if not np.isfinite(sample).all():
        raise ValueError("the codec's training keys hold non-finite values")
    if len(sample) < RECOMMENDED_TRAIN_KEYS:
        logger.warning("training a key codec on %d keys; %d or more give steadier centroids", len(sample), RECOMMENDED_TRAIN_KEYS)
    return sample


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - faiss-cpu is a core dependency
        raise ImportError("compressed keys need faiss: pip install faiss-cpu") from err
    return faiss


def _kmeans(points: np.ndarray) -> np.ndarray:
    """float32 (256, w): FAISS k-means centroids of (n, w) points (same settings as :func:`_faiss_pq`)."""
    kmeans = _faiss().Kmeans(points.shape[1], PQ_CENTROIDS, niter=25, seed=1234, min_points_per_centroid=1)
    kmeans.train(np.ascontiguousarray(points, dtype=np.float32))
    return kmeans.centroids.astype(np.float32)


def _faiss_pq(dim: int, m: int) -> Any:
    """A FAISS 8-bit ProductQuantizer whose k-means accepts small samples quietly
    (:func:`_check_sample` warns once instead of FAISS once per sub-space)."""
    pq = _faiss().ProductQuantizer(dim, m, 8)
    pq.cp.min_points_per_centroid = 1
    return pq
