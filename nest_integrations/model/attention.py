"""SDPA attention for the shared batch's masked forwards, registered with transformers.

A shared forward (:mod:`~nest_integrations.decoding.batching`) passes a 4-D mask, and with a
mask transformers' ``sdpa`` attention copies every key/value head
``num_key_value_groups`` times before the kernel (``repeat_kv``; it leaves
grouped heads to the kernel only without a mask, where some GPU kernels need
that). On CPU the kernel takes grouped heads with a mask as well
(``enable_gqa=True``), and the result is the same to the bit (checked in the
tests), and it takes less time than attention over the copied heads (measured
on the default model's grouped-query layers in docs/serving.md, Throughput).

:data:`PACKED_SDPA` is that attention: transformers' own ``sdpa`` for every call
except a masked multi-token call of a grouped-query layer on CPU. :func:`use_packed_sdpa`
switches a model that runs ``sdpa`` to it; :func:`~nest_integrations.model.lm.load_lm` does so
(on other devices every call is plain ``sdpa``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PACKED_SDPA", "use_packed_sdpa"]

PACKED_SDPA = "nest_packed_sdpa"
"""The name under which the attention is registered with transformers' attention and mask interfaces."""


def _packed_sdpa_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple[Any, None]:
    """transformers' ``sdpa_attention_forward``, with grouped key/value heads left to the
    CPU kernel when a mask is given. Shapes as there: query (B, H, Q, D), key and
    value (B, H_kv, K, D), mask (B or 1, 1, Q, K) additive or boolean; returns (B, Q, H, D)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (
        attention_mask is None
        or groups == 1
        or query.shape[2] == 1  # transformers folds the groups into the query there, no copy
        or query.device.type != "cpu"
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions", False)
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=kwargs.get("dropout", 0.0),
        scale=kwargs.get("scaling"),
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    """Register (again: each registration is one dict entry) with transformers' global interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_SDPA, _packed_sdpa_attention)
    # The same masks as sdpa (a name without a mask function would get none at all).
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


def use_packed_sdpa(model: Any) -> bool:
    """Switch ``model`` from transformers' ``sdpa`` attention to :data:`PACKED_SDPA`
    (same results, cheaper masked grouped-query calls on CPU). Models running any
    other attention are left as they are. Returns whether the model now runs it."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == PACKED_SDPA:
        return True
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    _register()
    model.set_attn_implementation(PACKED_SDPA)
    return True
