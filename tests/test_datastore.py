"""Token datastore: keys, values, sources, lazy vs precomputed, search, persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nest_integrations.corpus.passages import Passage
from nest_integrations.index.nest_index import NestIndex
from nest_integrations.model.key_reader import KeyReader, parse_key_layer
from nest_integrations.store.datastore import EncodeStats, TokenDatastore
from nest_integrations.store.encoder import PassageEncoder, tiling_char_spans

from conftest import make_tiny_lm, tampered_copy


@pytest.mark.parametrize("key_layer", ["ffn_input", "layer:-2"])
def test_keys_equal_direct_forward_hidden_states(tiny_lm, small_passages, key_layer):
    encoder = PassageEncoder(tiny_lm, key_layer, "")
    encoded = encoder.encode([p.text for p in small_passages])
    for passage, enc in zip(small_passages, encoded):
        ids = torch.tensor([enc.token_ids.tolist()])
        with torch.no_grad():
            if key_layer == "layer:-2":
                expected = tiny_lm.model(ids, output_hidden_states=True).hidden_states[-2][0]
            else:
                captured = {}
                layer = tiny_lm.model.model.layers[-1].post_attention_layernorm
                handle = layer.register_forward_hook(lambda m, i, o: captured.setdefault("k", o))
                tiny_lm.model(ids)
                handle.remove()
                expected = captured["k"][0]
        # keys[j] is the state just before token j; bare passages have none before token 0.
        np.testing.assert_allclose(enc.keys[1:].astype(np.float32), expected[:-1].numpy(), atol=2e-2, rtol=1e-2)
        assert not enc.keys[0].any()


def test_unknown_key_layer_is_a_clear_error(tiny_lm):
    with pytest.raises(ValueError, match="key_layer"):
        parse_key_layer("middle")
    with pytest.raises(ValueError, match="out of range"):
        KeyReader(tiny_lm.model, "layer:7")


def test_char_spans_tile_the_passage_and_decode_verbatim(tiny_lm, small_passages):
    encoder = PassageEncoder(tiny_lm)
    for passage, enc in zip(small_passages, encoder.encode([p.text for p in small_passages])):
        spans = enc.char_spans
        assert spans[0, 0] == 0 and spans[-1, 1] == len(passage.text)
        assert (spans[1:, 0] == spans[:-1, 1]).all()
        for a, b in [(0, 5), (3, len(enc.token_ids))]:
            decoded = tiny_lm.tokenizer.decode(enc.token_ids[a:b].tolist(), clean_up_tokenization_spaces=False)
            assert decoded == passage.text[spans[a, 0] : spans[b - 1, 1]]


def test_tiling_char_spans_handles_shared_offsets():
    spans = tiling_char_spans([(0, 3), (3, 5), (4, 5), (5, 9)], 9)
    assert spans.tolist() == [[0, 3], [3, 5], [5, 5], [5, 9]]


def test_attention_sink_keys_are_not_entries(tiny_lm, small_passages):
    bare = PassageEncoder(tiny_lm, encoding_prefix="").encode([small_passages[0].text])[0]
    assert not bare.valid[0], "a bare passage's first token has no preceding state"
    assert not bare.valid[1], "the key at absolute position 0 (attention sink) must be excluded"
    assert bare.valid[2:].all()
    chat = PassageEncoder(tiny_lm, encoding_prefix="chat").encode([small_passages[0].text])[0]
    assert chat.valid.all(), "inside the chat prefix, even the first token can be copied"


def test_chat_prefix_is_the_default_for_chat_models(tiny_lm):
    encoder = PassageEncoder(tiny_lm)
    assert encoder.prefix_text.endswith("<|im_start|>assistant\n")


def test_lazy_and_precomputed_return_identical_neighbours(tiny_lm, small_passages):
    lazy = TokenDatastore(small_passages, PassageEncoder(tiny_lm))
    pre = TokenDatastore(small_passages, PassageEncoder(tiny_lm))
    pre.precompute(show_progress=False)
    queries = torch.randn(4, tiny_lm.hidden_size)
    a = lazy.candidates([0, 1, 2]).search(queries, 16)
    b = pre.candidates([0, 1, 2]).search(queries, 16)
    assert torch.equal(a.entries, b.entries) and torch.equal(a.values, b.values)
    torch.testing.assert_close(a.scores, b.scores)


def test_a_passage_key_is_its_own_nearest_neighbour(tiny_datastore):
    candidates = tiny_datastore.candidates([0, 1, 2])
    probe = candidates.keys[[3, 10, 25]]
    nb = candidates.search(probe, 1)
    assert nb.entries[:, 0].tolist() == [3, 10, 25]
    assert torch.allclose(nb.scores[:, 0], torch.zeros(3), atol=1e-3)


def test_search_with_r_larger_than_entries_and_masking(tiny_datastore):
    candidates = tiny_datastore.candidates([2])
    n = len(candidates)
    nb = candidates.search(torch.randn(2, tiny_datastore.hidden_size), 10_000)
    assert nb.scores.shape == (2, n)
    passage, pos = candidates.entry_source(int(nb.entries[0, 0]))
    candidates.mark_used(passage, pos, pos)
    after = candidates.search(torch.randn(1, tiny_datastore.hidden_size), 10_000)
    assert torch.isinf(after.scores[0, -1]) and int(torch.isfinite(after.scores).sum()) == n - 1


def test_lazy_cache_is_bounded_and_counts_encoding(tiny_lm, small_passages):
    store = TokenDatastore(small_passages, PassageEncoder(tiny_lm), cache_mb=0.001)
    stats = EncodeStats()
    store.fetch([0, 1, 2], stats)
    assert stats.encoded_passages == 3 and stats.encode_passes == 1
    assert len(store._cache) == 1  # the bound evicts all but the newest


def test_an_index_decoder_copies_from_the_datastore_it_is_given(tiny_lm, small_passages):
    index = NestIndex.build(small_passages, tiny_lm, show_progress=False, calibrate=False)
    fresh = TokenDatastore(index.passages, index.datastore.encoder, codec=index.datastore.codec)
    prompt, query = "Tell me a bio of Alan Turing.", "Alan Turing"
    given = index.decoder(datastore=fresh).generate(prompt, query=query, mode="nest", alpha=0.3, tau=0.1, max_new_tokens=4)
    assert given.stats.encoded_passages > 0
    again = index.decoder(datastore=fresh).generate(prompt, query=query, mode="nest", alpha=0.3, tau=0.1, max_new_tokens=4)
    assert again.stats.encoded_passages == 0  # its keys are cached in the datastore given
    own = index.decoder().generate(prompt, query=query, mode="nest", alpha=0.3, tau=0.1, max_new_tokens=4)
    assert own.stats.encoded_passages == given.stats.encoded_passages  # the index's own datastore was never used


def test_dynamic_passages_enter_lazily(tiny_datastore):
    index = tiny_datastore.add(Passage(id="new", text="A brand new passage about nothing in particular."))
    assert index == 3 and tiny_datastore.add(Passage(id="new", text="A brand new passage about nothing in particular.")) == 3
    changed = tiny_datastore.add(Passage(id="new", text="Changed text."))
    assert changed == 4 and len(tiny_datastore.candidates([changed])) > 0


def test_removing_a_passage_keeps_the_others_keys(tiny_datastore):
    tiny_datastore.fetch([0, 1, 2])
    turing_keys = tiny_datastore.fetch([1])[0]
    assert tiny_datastore.remove(["curie", "no-such-id"]) == 1
    assert tiny_datastore.index_of("curie") is None and tiny_datastore.index_of("turing") == 1
    assert [p.id for p in tiny_datastore.live_passages()] == ["turing", "zoe"]
    stats = EncodeStats()
    assert tiny_datastore.fetch([1], stats)[0] is turing_keys and stats.encoded_passages == 0
    assert 0 not in tiny_datastore._cache
    assert tiny_datastore.add(Passage(id="curie", text="Marie Curie, again.")) == 3, "a removed id comes back on a fresh index"


def test_empty_and_unicode_passages(tiny_lm):
    store = TokenDatastore([Passage(id="e", text="x"), Passage(id="u", text="Ωμέγα ☃ 東京 — naïve café")], PassageEncoder(tiny_lm))
    assert len(store.candidates([0])) == 1  # its single token, after the chat prefix
    assert len(store.candidates([1])) > 0


# --------------------------------------------------------------------------- persistence
@pytest.fixture(scope="module")
def saved_index(tmp_path_factory, tiny_lm):
    from nest_integrations.corpus.loaders import load_wikipedia_summaries

    index = NestIndex.build(load_wikipedia_summaries(limit=12), tiny_lm, precompute_keys=True, show_progress=False)
    path = index.save(tmp_path_factory.mktemp("idx") / "index")
    return index, path


def test_save_load_round_trips_exactly(saved_index, tiny_lm):
    index, path = saved_index
    loaded = NestIndex.load(path, tiny_lm)
    assert [p.to_dict() for p in loaded.passages] == [p.to_dict() for p in index.passages]
    a, b = index.datastore.precomputed, loaded.datastore.precomputed
    for name in ("token_ids", "char_spans", "keys", "valid", "offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert [p.id for p, _ in loaded.retrieve(index.passages[3].title, 3)] == [p.id for p, _ in index.retrieve(index.passages[3].title, 3)]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["key_layer"] == "ffn_input" and manifest["encoding_prefix_text"].endswith("assistant\n")
    assert not any(f.suffix in (".pkl", ".pickle") for f in path.rglob("*"))


def test_tampered_file_fails_to_load(saved_index, tiny_lm, tmp_path):
    import shutil

    _, path = saved_index
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    keys = copy / "keys" / "keys.npy"
    data = bytearray(keys.read_bytes())
    data[-1] ^= 0xFF
    keys.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted"):
        NestIndex.load(copy, tiny_lm)


def test_another_lm_fails_to_load(saved_index, smol_tokenizer):
    _, path = saved_index
    with pytest.raises(ValueError, match="rebuild the index"):
        NestIndex.load(path, make_tiny_lm(smol_tokenizer, seed=1))


def test_newer_format_fails_to_load(saved_index, tiny_lm, tmp_path):
    import shutil

    _, path = saved_index
    copy = tmp_path / "newer"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="format"):
        NestIndex.load(copy, tiny_lm)


def test_empty_corpus_is_a_clear_error(tiny_lm):
    with pytest.raises(ValueError, match="empty corpus"):
        NestIndex.build([], tiny_lm)


def test_save_never_replaces_a_foreign_folder_and_needs_overwrite_for_an_index(saved_index, tmp_path):
    index, path = saved_index
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="refusing to replace"):
        index.save(tmp_path / "thesis", overwrite=True)
    assert (tmp_path / "thesis" / "thesis.tex").read_text() == "years of work"
    with pytest.raises(ValueError, match="overwrite=True"):
        index.save(path)
    assert index.save(path, overwrite=True) == path


def _shifted_offsets(copy, manifest):
    from nest_integrations.core.safe_io import sha256_file

    offsets = np.load(copy / "keys" / "offsets.npy")
    offsets[1] += 1
    np.save(copy / "keys" / "offsets.npy", offsets)
    manifest["checksums"]["keys/offsets.npy"] = sha256_file(copy / "keys" / "offsets.npy")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c, m: m.update(checksums={}), "not listed"),
        (lambda c, m: m["checksums"].update({"../secret.txt": "0" * 64}), "plain relative path"),
        (lambda c, m: m.update(format_version=True), "format version"),
        (lambda c, m: m.update(key_layer="layer:x"), "key_layer"),
        (lambda c, m: m.update(hidden_size="64"), "hidden_size"),
        (_shifted_offsets, "offsets and spans disagree"),
    ],
)
def test_a_tampered_manifest_or_key_array_is_refused(saved_index, tiny_lm, tmp_path, edit, match):
    _, path = saved_index
    with pytest.raises(ValueError, match=match):
        NestIndex.load(tampered_copy(path, tmp_path, edit), tiny_lm)


def test_a_model_path_named_in_the_folder_is_not_loaded_unasked(saved_index, tmp_path):
    _, path = saved_index
    copy = tampered_copy(path, tmp_path, lambda c, m: m["lm"].update(name="/somewhere/evil-model"))
    with pytest.raises(ValueError, match="trust_paths=True"):
        NestIndex.load(copy)


def test_the_fingerprint_ignores_dtype_and_sees_any_weight_change(smol_tokenizer):
    from nest_integrations.model.lm import fingerprints_match

    lm = make_tiny_lm(smol_tokenizer, seed=3)
    fp32 = lm.fingerprint()
    assert fingerprints_match(fp32, model_fp(lm, torch.float16))
    assert fingerprints_match(fp32, model_fp(lm, torch.bfloat16))
    with torch.no_grad():
        lm.model.model.layers[1].mlp.up_proj.weight[3, 5] += 1e-3
    assert not fingerprints_match(fp32, lm.fingerprint())


def model_fp(lm, dtype):
    import copy

    from nest_integrations.model.lm import model_fingerprint

    return model_fingerprint(copy.deepcopy(lm.model).to(dtype))


def test_long_passages_are_encoded_whole_in_overlapping_windows(tiny_lm):
    text = " ".join(f"word{i}" for i in range(300))
    whole = PassageEncoder(tiny_lm, max_passage_tokens=1024, window_overlap=8, batch_tokens=2048).encode([text])[0]
    windowed = PassageEncoder(tiny_lm, max_passage_tokens=128, window_overlap=64).encode([text, "short"])
    assert len(windowed[0].token_ids) == len(tiny_lm.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert windowed[0].keys.shape == whole.keys.shape and bool(windowed[0].valid[-1]), "the last token can be copied"
    assert int(windowed[0].char_spans[-1, 1]) == len(text)
    np.testing.assert_allclose(windowed[0].keys[:128].astype(np.float32), whole.keys[:128].astype(np.float32), atol=1e-2)
    assert PassageEncoder(tiny_lm, max_passage_tokens=128, window_overlap=64).windows(300) == [
        (0, 128, 0), (64, 192, 128), (128, 256, 192), (192, 300, 256)
    ]
    with pytest.raises(ValueError):
        PassageEncoder(tiny_lm, max_passage_tokens=128, window_overlap=128)


def test_precompute_refuses_a_training_sample_below_one_key_and_a_codec_of_another_width(tiny_lm, small_passages):
    from nest_integrations.store.key_codec import make_codec

    store = TokenDatastore(small_passages, PassageEncoder(tiny_lm))
    with pytest.raises(ValueError, match="train_keys must be positive"):
        store.precompute(train_keys=0, show_progress=False)  # even with float16 keys, which train nothing
    with pytest.raises(ValueError, match="hidden size"):
        store.precompute(codec=make_codec("sq8", tiny_lm.hidden_size * 2), show_progress=False)


def test_the_chunk_that_goes_on_from_a_passage_is_the_next_of_its_document(tiny_lm):
    """Chunks chain by document and offset: the next one starts after the white space cut between
    them (or, overlapping, inside this one); another document's chunk, a chunk missing between
    two (removed) or no document is no continuation."""
    middle = "The second part of the text goes on for a while, long enough that it is missed when gone. "
    doc = "First part of the text.  \n\n    " + middle + "Third part."
    second, third = doc.index("The second"), doc.index("Third")
    chunks = [
        Passage(id="d#2", text=doc[third:], doc_id="d", doc_char_start=third),
        Passage(id="d#0", text=doc[:23], doc_id="d"),  # ends before the blank line and indentation cut at the seam
        Passage(id="d#1", text=doc[second:third], doc_id="d", doc_char_start=second),
        Passage(id="e#0", text=doc[:23], doc_id="e"),
        Passage(id="loose", text=doc[:23]),
    ]
    store = TokenDatastore(chunks, PassageEncoder(tiny_lm))
    following = {p.id: store.following_chunk(store.index_of(p.id)) for p in chunks}
    assert {k: (store.passages[v].id if v is not None else None) for k, v in following.items()} == {
        "d#0": "d#1", "d#1": "d#2", "d#2": None, "e#0": None, "loose": None,
    }
    preceding = {p.id: store.preceding_chunk(store.index_of(p.id)) for p in chunks}
    assert {k: (store.passages[v].id if v is not None else None) for k, v in preceding.items()} == {
        "d#0": None, "d#1": "d#0", "d#2": "d#1", "e#0": None, "loose": None,
    }
    assert store.remove(["d#1"]) == 1 and store.following_chunk(store.index_of("d#0")) is None, "a chunk is missing before d#2"
    assert store.preceding_chunk(store.index_of("d#2")) is None
    store.add(Passage(id="d#1b", text=doc[second - 9 : third], doc_id="d", doc_char_start=second - 9))  # overlapping the cut
    assert store.passages[store.following_chunk(store.index_of("d#0"))].id == "d#1b"
    assert store.passages[store.preceding_chunk(store.index_of("d#1b"))].id == "d#0"
