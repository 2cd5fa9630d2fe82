"""Linear layers with MKL pre-packed float32 weights, for forwards of a few rows on CPU.

For a product of a few input rows with a weight matrix, MKL's float32 GEMM
spends about as much time re-packing the weight into its blocked layout, on
every call, as it does computing. NEST's forwards are mostly of that size:
a speculative check feeds a draft of 4-64 tokens, and a shared batch step
(:mod:`~nest_integrations.decoding.batching`) one token or a draft per row. MKL can pack
a weight once (``cblas_sgemm_pack``, reached through torch's
``mkl::_mkl_reorder_linear_weight`` / ``mkl::_mkl_linear``, the ops torch's own
CPU compiler uses for frozen float32 linears) and compute against the packed
copy for any number of rows.

Forwards of 4-64 fed tokens run faster against the packed weights, forwards of
1-3 tokens do not, which is why fewer than :data:`MIN_PACKED_ROWS` rows keep
torch's own path (so a token-by-token step is bit for bit what it was); the
measured speed-ups are in docs/serving.md (CPU speed). Results agree with torch's
linear to float32 rounding (~1e-6 relative); from 16 rows on they are the same
bits. The costs: memory, since the packed copies hold about as much as the
weights, and the packing itself, which costs about what the packed weights save
over :data:`PACK_AFTER_CALLS` forwards (both measured in docs/serving.md). So a
layer packs its weight on its :data:`PACK_AFTER_CALLS`-th call with enough rows,
not on its first: a process
that runs a handful of forwards (one ``nest generate``) never pays for
packing, while a server packs within its first generations.

:func:`use_packed_linears` switches every float32 ``nn.Linear`` of a model to
:class:`PackedLinear`; :func:`~nest_integrations.model.lm.load_lm` does so on CPU.
Parameters, ``state_dict`` and fingerprints are untouched: the packed copy is
kept outside the module and remade whenever the weight is replaced or changed
in place (its version counter).
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["MIN_PACKED_ROWS", "PACK_AFTER_CALLS", "PackedLinear", "packing_available", "use_packed_linears"]

MIN_PACKED_ROWS = 4
"""Fewest input rows computed against the packed weight (the measured crossover, docs/serving.md)."""

PACK_AFTER_CALLS = 8
"""A layer's calls of :data:`MIN_PACKED_ROWS` or more rows before it packs its weight:
packing costs about what the packed weight saves over this many forwards."""

_calls: "weakref.WeakKeyDictionary[PackedLinear, int]" = weakref.WeakKeyDictionary()
"""Module -> its calls of enough rows so far, while it is not packed yet."""

_packed: "weakref.WeakKeyDictionary[PackedLinear, tuple[tuple[int, int], torch.Tensor]]" = weakref.WeakKeyDictionary()
"""Module -> ((weight data_ptr, weight version), packed weight). Outside the module so
that copying, pickling or saving a model never meets the opaque MKL tensor."""


def packing_available() -> bool:
    """Whether this torch build has MKL and its pre-packed linear ops."""
    return bool(getattr(torch._C, "has_mkl", False)) and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear(torch.nn.Linear):
    """``nn.Linear`` whose forward of :data:`MIN_PACKED_ROWS` or more rows runs
    against an MKL pre-packed copy of its float32 weight, from its
    :data:`PACK_AFTER_CALLS`-th such forward on.

    Every other call (fewer rows, another dtype or device, autograd needing
    the weight's gradient, or a layer not packed yet) is ``nn.Linear``'s own.
    Inputs (..., in_features), outputs (..., out_features), as ``nn.Linear``.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // self.in_features if self.in_features else 0
        if (
            rows < MIN_PACKED_ROWS
            or input.device.type != "cpu"
            or input.dtype != torch.float32
            or self.weight.dtype != torch.float32
            or self.weight.device.type != "cpu"
            or (torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad))
        ):
            return super().forward(input)
        if self not in _packed:
            calls = _calls.get(self, 0) + 1
            if calls < PACK_AFTER_CALLS:
                _calls[self] = calls
                return super().forward(input)
            _calls.pop(self, None)
        flat = input.reshape(rows, self.in_features)
        # The last argument is the row count the op checks the call against; the
        # packed layout itself does not depend on it (MKL packs the weight alone).
        out = torch.ops.mkl._mkl_linear(flat, self._packed_weight(), self.weight, self.bias, rows)
        return out.reshape(*input.shape[:-1], self.out_features)

    def _packed_weight(self) -> torch.Tensor:
        state = (self.weight.data_ptr(), self.weight._version)
        cached = _packed.get(self)
        if cached is not None and cached[0] == state:
            return cached[1]
        packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), MIN_PACKED_ROWS)
        _packed[self] = (state, packed)
        return packed


def use_packed_linears(model: torch.nn.Module) -> int:
    """Switch every plain float32 ``nn.Linear`` of ``model`` to :class:`PackedLinear`
    in place; returns how many were switched (0 where MKL packing is unavailable).

    Subclasses of ``nn.Linear`` (quantized or adapter layers) are left alone.
    """
    if not packing_available():
        return 0
    switched = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32:
            module.__class__ = PackedLinear
            switched += 1
    return switched
