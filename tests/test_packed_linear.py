"""Linears on MKL pre-packed weights: torch's results, torch's own path where packing does not pay."""

from __future__ import annotations

import copy

import pytest
import torch

from nest_integrations.model import packed_linear
from nest_integrations.model.lm import model_fingerprint
from nest_integrations.model.packed_linear import MIN_PACKED_ROWS, PACK_AFTER_CALLS, PackedLinear, packing_available, use_packed_linears
from conftest import make_tiny_lm

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no MKL packing")


@pytest.fixture(autouse=True)
def pack_at_once(monkeypatch):
    """The packed path from a layer's first call of enough rows (production waits for PACK_AFTER_CALLS)."""
    monkeypatch.setattr(packed_linear, "PACK_AFTER_CALLS", 1)


def _pair(in_features=48, out_features=80, bias=True):
    torch.manual_seed(0)
    plain = torch.nn.Linear(in_features, out_features, bias=bias)
    packed = copy.deepcopy(plain)
    use_packed_linears(packed)
    assert type(packed) is PackedLinear
    return plain, packed


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 16, 40, 130])
@pytest.mark.parametrize("bias", [True, False])
def test_results_equal_torch_linear_to_float32_rounding(rows, bias):
    plain, packed = _pair(bias=bias)
    x = torch.randn(1, rows, 48)
    with torch.inference_mode():
        expected, got = plain(x), packed(x)
    assert got.shape == expected.shape == (1, rows, 80)
    if rows < MIN_PACKED_ROWS:
        assert torch.equal(got, expected)  # torch's own path, bit for bit
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_layer_packs_only_from_its_nth_call_of_enough_rows(monkeypatch):
    """A process running a few forwards never pays for packing: torch's own path, bit for bit, until then."""
    monkeypatch.setattr(packed_linear, "PACK_AFTER_CALLS", PACK_AFTER_CALLS)
    packings = []
    pack = PackedLinear._packed_weight
    monkeypatch.setattr(PackedLinear, "_packed_weight", lambda self: packings.append(1) or pack(self))
    plain, packed = _pair(in_features=64, out_features=96)
    x, few = torch.randn(9, 64), torch.randn(2, 64)
    with torch.inference_mode():
        for _ in range(PACK_AFTER_CALLS - 1):
            assert torch.equal(packed(few), plain(few))  # too few rows: not counted
            assert torch.equal(packed(x), plain(x))
        assert not packings
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    assert len(packings) == 2  # the packed path from then on


def test_a_changed_weight_is_packed_again():
    plain, packed = _pair()
    x = torch.randn(6, 48)
    with torch.inference_mode():
        packed(x)
    with torch.no_grad():
        for layer in (plain, packed):
            layer.weight.mul_(-2.0)  # in place: same storage, new version
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    new = torch.nn.Parameter(torch.randn(80, 48))
    plain.weight, packed.weight = new, new  # replaced
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)


def test_gradients_still_flow():
    plain, packed = _pair()
    x = torch.randn(8, 48, requires_grad=True)
    packed(x).sum().backward()
    plain(x.detach().requires_grad_()).sum().backward()
    torch.testing.assert_close(packed.weight.grad, plain.weight.grad)


def test_other_dtypes_and_subclasses_are_left_alone():
    half = torch.nn.Linear(8, 8).to(torch.bfloat16)

    class Adapter(torch.nn.Linear):
        pass

    adapter = Adapter(8, 8)
    model = torch.nn.Sequential(half, adapter, torch.nn.Linear(8, 8))
    assert use_packed_linears(model) == 1
    assert type(half) is torch.nn.Linear and type(adapter) is Adapter and type(model[2]) is PackedLinear


def test_a_model_keeps_its_weights_logits_and_copies(smol_tokenizer):
    """What the rest of the package relies on: state_dict and fingerprint unchanged,
    logits of a multi-token forward as before, and a deep copy that still runs."""
    lm = make_tiny_lm(smol_tokenizer, seed=5)
    model = lm.model
    assert all(type(m) is not torch.nn.Linear for m in model.modules())  # the fixture switched them
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        packed_logits = model(input_ids=ids).logits
    fingerprint = model_fingerprint(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__class__ = torch.nn.Linear
    with torch.inference_mode():
        plain_logits = model(input_ids=ids).logits
    torch.testing.assert_close(packed_logits, plain_logits, rtol=1e-4, atol=1e-4)
    assert model_fingerprint(model) == fingerprint
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    use_packed_linears(model)
    clone = copy.deepcopy(model)
    with torch.inference_mode():
        torch.testing.assert_close(clone(input_ids=ids).logits, packed_logits, rtol=1e-5, atol=1e-5)
