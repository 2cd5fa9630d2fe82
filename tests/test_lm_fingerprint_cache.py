"""The LM fingerprint kept on disk across processes: read back while the weights are the loaded
ones, computed again when a file or a parameter changes."""

from __future__ import annotations

import torch

from nest_integrations.model import lm as lm_module
from nest_integrations.model.lm import load_lm, model_fingerprint
from conftest import make_tiny_lm


def _saved_tiny(smol_tokenizer, folder):
    tiny = make_tiny_lm(smol_tokenizer, seed=3)
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return folder


def test_a_reloaded_lm_reads_its_fingerprint_from_the_cache(smol_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("NEST_CACHE_DIR", str(tmp_path / "cache"))
    folder = _saved_tiny(smol_tokenizer, tmp_path / "model")
    first = load_lm(str(folder), device="cpu")
    expected = model_fingerprint(first.model)
    assert first.fingerprint() == expected
    assert len(list((tmp_path / "cache" / "fingerprints").iterdir())) == 1

    computed = []
    monkeypatch.setattr(lm_module, "model_fingerprint", lambda model: computed.append(model) or expected)
    again = load_lm(str(folder), device="cpu")
    assert again.fingerprint() == expected and not computed  # read, not hashed

    with torch.no_grad():
        again.model.get_input_embeddings().weight.mul_(2.0)  # changed in place after loading
    again.fingerprint()
    assert computed == [again.model]


def test_another_file_or_dtype_is_another_entry(smol_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("NEST_CACHE_DIR", str(tmp_path / "cache"))
    folder = _saved_tiny(smol_tokenizer, tmp_path / "model")
    float32 = load_lm(str(folder), device="cpu")
    bfloat16 = load_lm(str(folder), device="cpu", dtype="bfloat16")
    assert float32.weights_stamp != bfloat16.weights_stamp
    assert float32.fingerprint().startswith("float32|") and bfloat16.fingerprint().startswith("bfloat16|")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # rewritten: new modification time
    assert load_lm(str(folder), device="cpu").weights_stamp != float32.weights_stamp


def test_a_corrupt_cache_entry_is_recomputed(smol_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("NEST_CACHE_DIR", str(tmp_path / "cache"))
    folder = _saved_tiny(smol_tokenizer, tmp_path / "model")
    loaded = load_lm(str(folder), device="cpu")
    entry = tmp_path / "cache" / "fingerprints" / str(loaded.weights_stamp)
    entry.parent.mkdir(parents=True)
    entry.write_text("float32|garbage")
    assert loaded.fingerprint() == model_fingerprint(loaded.model)
    assert entry.read_text() == loaded.fingerprint()


def test_the_tokenizer_fingerprint_is_read_back_while_the_tokenizer_is_as_loaded(smol_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("NEST_CACHE_DIR", str(tmp_path / "cache"))
    folder = _saved_tiny(smol_tokenizer, tmp_path / "model")
    first = load_lm(str(folder), device="cpu")
    expected = lm_module.tokenizer_fingerprint(first.tokenizer)
    assert first.tokenizer_fingerprint() == expected
    assert (tmp_path / "cache" / "fingerprints" / f"{first.weights_stamp}.tokenizer").read_text() == expected

    computed = []
    original = lm_module.tokenizer_fingerprint
    monkeypatch.setattr(lm_module, "tokenizer_fingerprint", lambda tokenizer: computed.append(tokenizer) or original(tokenizer))
    again = load_lm(str(folder), device="cpu")
    assert again.tokenizer_fingerprint() == expected and not computed  # read, not hashed

    again.tokenizer.add_tokens(["<new-token>"])  # changed after loading: hashed, and differs
    assert again.tokenizer_fingerprint() != expected and computed == [again.tokenizer]
