"""The precision of the LM forward that encodes datastore keys.

Keys are stored as float16 whatever precision computes them. On a CPU with
bfloat16 matrix instructions, a float32 model encodes passages through a
bfloat16 copy of itself (made once per model, remade when its weights
change): oneDNN's bfloat16 kernels run the large encoding batches faster,
while the decoder, whose queries are searched against the keys, keeps the
float32 model. The trade-off was measured before this became the default
(``results/bench-key-dtype/bench.md``, made by ``bench_key_dtype.py`` beside it:
speed, top-1 neighbour agreement of decoding queries with float32 keys, NEST
outputs item by item); the copy costs the model's size in bfloat16 (2 bytes
per parameter) of memory.

"Supports bfloat16 well" means torch's probes find AVX512-BF16 or AMX tiles
(:func:`cpu_has_bf16`); elsewhere bfloat16 is emulated and slower, so
float32 stays. Models already in half precision, or on a GPU, encode as they
are. ``NEST_KEY_ENCODING=float32`` (or ``bfloat16``) overrides the choice
for the process, e.g. for keys bit for bit the same on every machine.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from nest_integrations.model.key_reader import KeyReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from nest_integrations.model.lm import LoadedLM

logger = logging.getLogger(__name__)

ENV_VAR = "NEST_KEY_ENCODING"
"""``auto`` (default), ``float32`` or ``bfloat16``."""
_CHOICES = ("auto", "float32", "bfloat16")

_copies: "weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], Any]]" = weakref.WeakKeyDictionary()
"""float32 model -> (its weights' state, its bfloat16 copy)."""
_copy_lock = threading.Lock()


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AVX512-BF16 or AMX tiles), per torch's probes."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def encoding_dtype(lm: "LoadedLM") -> "torch.dtype":
    """The dtype passages are encoded in for ``lm`` (see the module docstring).

    Raises:
        ValueError: ``NEST_KEY_ENCODING`` is set to something else than auto, float32 or bfloat16.
    """
    import torch

    choice = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(_CHOICES)}, got {choice!r}")
    own = next(lm.model.parameters()).dtype
    if own != torch.float32 or lm.device.type != "cpu" or choice == "float32":
        return own
    if choice == "bfloat16" or cpu_has_bf16():
        return torch.bfloat16
    return own


def _weights_state(model: Any) -> tuple[Any, ...]:
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def encoding_model(lm: "LoadedLM", reader: KeyReader) -> tuple[Any, KeyReader]:
    """The model to run an encoding forward on and the key reader hooked into it.

    ``lm.model`` and ``reader`` themselves, or a bfloat16 copy of the model with
    a reader of the same key layer (:func:`encoding_dtype`).
    """
    import torch

    if encoding_dtype(lm) != torch.bfloat16 or next(lm.model.parameters()).dtype == torch.bfloat16:
        return lm.model, reader
    state = _weights_state(lm.model)
    with _copy_lock:
        cached = _copies.get(lm.model)
        if cached is None or cached[0] != state:
            logger.info("Encoding keys of %s through a bfloat16 copy of the model (this CPU has bfloat16 instructions)", lm.name)
            cached = (state, copy.deepcopy(lm.model).to(torch.bfloat16))
            _copies[lm.model] = cached
    return cached[1], KeyReader(cached[1], reader.key_layer)
