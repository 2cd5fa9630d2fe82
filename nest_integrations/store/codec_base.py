"""The key codec interface: what every codec of stored token keys implements, the float16
identity, and the training sample the other codecs are fitted on.

A :class:`KeyCodec` turns float keys (n, d) into stored rows (n, code_width) and scores
queries against a block of stored rows from two quantities, ``inner_products`` and
``squared_norms`` (:mod:`nest_integrations.store.key_codec` lists the codecs and what the
two mean for each). :class:`Float16Codec` stores the keys themselves and scores exactly;
the FAISS codecs (:mod:`nest_integrations.store.faiss_codecs`) and ``spq``
(:mod:`nest_integrations.store.spectral_codec`) are trained first, on a sample of at
least :data:`MIN_TRAIN_KEYS` float32 keys (:func:`sample_rows` draws it), checked here
with the parameters they are loaded from.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

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
        check_dim(dim)
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


def sample_rows(keys: np.ndarray, count: int, *, seed: int = 0) -> np.ndarray:
    """float32 (min(count, n), d): ``count`` rows of ``keys`` drawn without replacement."""
    if len(keys) <= count:
        return np.ascontiguousarray(keys, dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(len(keys), size=count, replace=False))
    return np.ascontiguousarray(keys[rows], dtype=np.float32)


# --------------------------------------------------------------------------- checks


def check_dim(dim: int) -> None:
    """Refuse a key width ``d`` that is not a positive integer (``ValueError``)."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"key width must be a positive integer, got {dim!r}")


def codec_param(value: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A trained codec parameter ``name`` as given (saved or passed in), checked: float32 of
    ``shape``, finite, returned C-contiguous; else a ``ValueError`` naming it."""
    value = np.asarray(value)
    if value.dtype != np.float32 or value.shape != shape:
        raise ValueError(f"codec parameter {name} must be float32 {shape}, got {value.dtype} {value.shape}")
    if not np.isfinite(value).all():
        raise ValueError(f"codec parameter {name} holds non-finite values")
    return np.ascontiguousarray(value)


def check_orthogonal(rotation: np.ndarray, spec: str) -> None:
    """A trained rotation must keep distances (scores stay in the keys' units)."""
    if not np.allclose(rotation @ rotation.T, np.eye(len(rotation)), atol=1e-3):
        raise ValueError(f"{spec}: the rotation is not orthogonal, so distances would change units")


def check_training_sample(sample: np.ndarray) -> np.ndarray:
    """``sample``, float32 (n, d) keys to train a codec on, once checked: at least
    :data:`MIN_TRAIN_KEYS` of them and finite (else ``ValueError``); fewer than
    :data:`RECOMMENDED_TRAIN_KEYS` train, with a warning."""
    if len(sample) < MIN_TRAIN_KEYS:
        raise ValueError(f"training a key codec needs at least {MIN_TRAIN_KEYS} keys, got {len(sample)}")
    if not np.isfinite(sample).all():
        raise ValueError("the codec's training keys hold non-finite values")
    if len(sample) < RECOMMENDED_TRAIN_KEYS:
        logger.warning("training a key codec on %d keys; %d or more give steadier centroids", len(sample), RECOMMENDED_TRAIN_KEYS)
    return sample
