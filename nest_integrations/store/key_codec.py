"""How precomputed token keys are stored and scored, by codec name: float16 rows or FAISS codes.

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
  (:class:`~nest_integrations.store.spectral_codec.SpectralPQCodec`).

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
(:meth:`~nest_integrations.store.codec_base.KeyCodec.arrays`, :func:`codec_from_arrays`), saved beside the codes.

This module is the codecs' registry: a name (``--key-compression``, ``key_codec=``) to an
untrained codec (:func:`make_codec`), and saved parameters to a trained one
(:func:`codec_from_arrays`). The codecs themselves: the interface and the float16 identity in
:mod:`nest_integrations.store.codec_base`, ``sq8`` / ``pq`` / ``opq`` in
:mod:`nest_integrations.store.faiss_codecs`, ``spq`` in :mod:`nest_integrations.store.spectral_codec`.
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from .codec_base import Float16Codec, KeyCodec
from .faiss_codecs import ProductQuantizerCodec, ScalarQuantizer8Codec
from .spectral_codec import SpectralPQCodec

_SPEC = re.compile(r"^(?P<kind>float16|sq8|pq|opq|spq)(?P<m>[0-9]+)?$")
CODEC_HELP = "float16 (none), sq8, pq<M>, opq<M> (M bytes per token; M divides the hidden size) or spq<M> (M bytes, 2 <= M <= the hidden size)"


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
