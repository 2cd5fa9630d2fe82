"""The shared batch's SDPA attention: the same logits as transformers' own, without copied heads."""

from __future__ import annotations

import pytest
import torch

from nest_integrations.decoding.batching import supports_batching
from nest_integrations.model.attention import PACKED_SDPA, use_packed_sdpa
from conftest import make_tiny_lm


@pytest.fixture(scope="module")
def plain_and_packed(smol_tokenizer):
    plain = make_tiny_lm(smol_tokenizer, seed=3).model
    plain.set_attn_implementation("sdpa")
    packed = make_tiny_lm(smol_tokenizer, seed=3).model
    assert use_packed_sdpa(packed)
    return plain, packed


def _packed_mask(owners: list[int], fed: list[int]) -> torch.Tensor:
    """A shared step's additive mask: each fed token sees its row's columns up to itself."""
    columns = torch.tensor(owners + fed)
    fed_t = torch.tensor(fed)
    past, q = len(owners), len(fed)
    allowed = (columns[None, :] == fed_t[:, None]) & (torch.arange(past + q)[None, :] <= past + torch.arange(q)[:, None])
    return torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)[None, None]


def _logits(model, ids, **kwargs):
    with torch.inference_mode():
        return model(input_ids=ids, **kwargs).logits


def test_masked_grouped_query_step_equals_sdpa_bit_for_bit(plain_and_packed):
    plain, packed = plain_and_packed
    owners, fed = [0] * 6 + [1] * 4 + [2] * 5, [0, 1, 1, 2, 2, 2]
    ids = torch.randint(0, 1000, (1, len(owners) + len(fed)), generator=torch.Generator().manual_seed(0))
    mask = _packed_mask([], owners + fed)
    positions = torch.tensor([[*range(6), *range(4), *range(5), 6, 4, 5, 5, 6, 7]])
    a = _logits(plain, ids, attention_mask=mask, position_ids=positions)
    b = _logits(packed, ids, attention_mask=mask, position_ids=positions)
    assert torch.equal(a, b)


@pytest.mark.parametrize("padded", [False, True])
def test_unmasked_and_padded_calls_are_plain_sdpa(plain_and_packed, padded):
    """Prefill, one-by-one decoding and padded batches (``generate``) keep sdpa's own masks."""
    plain, packed = plain_and_packed
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    kwargs = {}
    if padded:
        kwargs["attention_mask"] = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9])
    assert torch.equal(_logits(plain, ids, **kwargs), _logits(packed, ids, **kwargs))


def test_masked_step_copies_no_key_value_heads(plain_and_packed, monkeypatch):
    from transformers.integrations import sdpa_attention

    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or real(x, n))
    plain, packed = plain_and_packed
    ids = torch.randint(0, 1000, (1, 5))
    mask = _packed_mask([], [0, 0, 1, 1, 1])
    _logits(packed, ids, attention_mask=mask)
    assert copies == []
    _logits(plain, ids, attention_mask=mask)
    assert copies  # transformers' sdpa copies the heads under a mask: what this attention avoids


def test_only_sdpa_models_switch(smol_tokenizer):
    eager = make_tiny_lm(smol_tokenizer).model
    eager.set_attn_implementation("eager")
    assert not use_packed_sdpa(eager)
    assert eager.config._attn_implementation == "eager"
    packed = make_tiny_lm(smol_tokenizer).model
    assert use_packed_sdpa(packed) and use_packed_sdpa(packed)  # idempotent
    assert packed.config._attn_implementation == PACKED_SDPA
    assert supports_batching(packed)
