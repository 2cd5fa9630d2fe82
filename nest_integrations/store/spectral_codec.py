"""The ``spq<M>`` key codec: product quantization in the keys' PCA basis, with sub-spaces sized by
the spectrum and a byte for each key's squared reconstruction error (:class:`SpectralPQCodec`).

At the same bytes it finds the float16 nearest entry more often than ``pq`` and ``opq``
(:mod:`nest_integrations.store.faiss_codecs`), whose lookup-table scoring it shares;
docs/compression.md has the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .codec_base import PQ_CENTROIDS, check_dim, check_orthogonal, check_training_sample, codec_param
from .faiss_codecs import GATHER_ELEMENTS, LookupTableCodec, kmeans_centroids

if TYPE_CHECKING:  # pragma: no cover
    import torch

ENERGY_HEADROOM = 4.0
"""spq's error levels reach this many times the largest squared error of the training keys: keys
the codec never saw are coded worse than its training sample (docs/compression.md, How spq codes
keys, has how much worse); a wider range costs resolution (~3% per level at 1,000x)."""


@dataclass(frozen=True)
class _SpectralBlock:
    """Search form of spq rows: lookup-table indices of the sub-space codes, and each row's
    stored squared reconstruction error (float32 (n,))."""

    codes: "torch.Tensor"
    residual_energy: "torch.Tensor"


class SpectralPQCodec(LookupTableCodec):
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

    Scored as :class:`LookupTableCodec` over the ``m - 1`` codes; a query's
    lookup table costs one elementwise product with the (256, d) centroids and
    a cumulative sum over the columns.
    """

    def __init__(
        self, dim: int, m: int, *,
        rotation: np.ndarray | None = None, spectrum: np.ndarray | None = None, centroids: np.ndarray | None = None,
        widths: np.ndarray | None = None, energy_levels: np.ndarray | None = None,
    ):
        check_dim(dim)
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
        rotation = codec_param(rotation, (self.dim, self.dim), "rotation")
        spectrum = codec_param(spectrum, (self.dim,), "spectrum")
        centroids = codec_param(centroids, (PQ_CENTROIDS, self.dim), "centroids")
        widths = codec_param(widths, (self.m,), "widths")
        energy_levels = codec_param(energy_levels, (PQ_CENTROIDS,), "energy_levels")
        if (widths < 1).any() or (widths != np.round(widths)).any() or int(widths.sum()) != self.dim:
            raise ValueError(f"spq widths must be positive integers summing to {self.dim}")
        if (spectrum <= 0).any():
            raise ValueError("spq spectrum must be positive")
        if (energy_levels < 0).any() or (np.diff(energy_levels) < 0).any():
            raise ValueError("spq energy_levels must be non-negative and rising")
        check_orthogonal(rotation, self.spec)
        self.rotation, self.spectrum, self.centroids, self.widths, self.energy_levels = rotation, spectrum, centroids, widths, energy_levels
        self._ends = np.cumsum(widths.astype(np.int64))
        self._starts = self._ends - widths.astype(np.int64)

    @property
    def is_trained(self) -> bool:
        return self.centroids is not None

    def train(self, sample: np.ndarray) -> None:
        sample = check_training_sample(self._check_keys(sample)).astype(np.float64)
        eigenvalues, axes = np.linalg.eigh(np.cov(sample, rowvar=False))
        order = np.argsort(eigenvalues)[::-1]
        spectrum = np.maximum(eigenvalues[order], 1e-9 * max(eigenvalues[order[0]], 1e-30))
        rotation = np.ascontiguousarray(axes[:, order].T, dtype=np.float32)
        widths = spectral_widths(spectrum**2, self.m)
        scale = np.sqrt(spectrum)
        weighted = np.ascontiguousarray((sample @ rotation.T.astype(np.float64)) * scale, dtype=np.float32)
        ends = np.cumsum(widths)
        centroids = np.concatenate([kmeans_centroids(weighted[:, b - w : b]) / scale[b - w : b] for b, w in zip(ends, widths)], axis=1)
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
