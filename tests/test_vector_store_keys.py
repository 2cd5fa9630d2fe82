"""Token keys of the vector stores: precomputed on add, saved, memory-mapped, refused by another LM,
kept aligned through removals and additions; and the estimate before a long encoding."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import make_tiny_lm
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding

from nest_integrations.corpus.passages import Passage
from nest_integrations.langchain import NestLLM, NestVectorStore
from nest_integrations.store.datastore import EncodeStats, TokenDatastore
from nest_integrations.store.encode_progress import chunk_bounds
from nest_integrations.store.encoder import PassageEncoder

KNOBS = {"alpha": 5.0, "delta": 1.0, "gamma": 1e-6, "max_new_tokens": 16}
"""Retrieval dominates the random tiny LM, so answers copy from the store."""


@pytest.fixture
def docs(small_passages) -> list[Document]:
    return [Document(id=p.id, page_content=p.text, metadata={"title": p.title}) for p in small_passages]


@pytest.fixture
def embeddings() -> DeterministicFakeEmbedding:
    return DeterministicFakeEmbedding(size=16)


def lazy_keys(lm, text: str):
    """The keys a lazy datastore encodes for ``text`` on first retrieval."""
    datastore = TokenDatastore([Passage(id="x", text=text)], PassageEncoder(lm))
    return datastore.fetch([0])[0]


def assert_keys_of_texts(datastore: TokenDatastore, texts: dict[str, str], lm) -> None:
    """Every id's keys come precomputed (no encoding) and equal the lazily encoded keys of its text."""
    stats = EncodeStats()
    fetched = datastore.fetch([datastore.index_of(i) for i in texts], stats)
    assert stats.encode_passes == 0, "every document's keys must be precomputed"
    for encoded, text in zip(fetched, texts.values()):
        expected = lazy_keys(lm, text)
        assert np.array_equal(encoded.token_ids, expected.token_ids)
        assert np.array_equal(encoded.char_spans, expected.char_spans)
        assert np.array_equal(encoded.valid, expected.valid)
        assert np.array_equal(encoded.keys, expected.keys)


def answer(store: NestVectorStore, lm, question: str) -> dict:
    llm = NestLLM.from_lm(lm, retriever=store, passage_k=3, **KNOBS)
    return llm.generate([question], query=question).generations[0][0].generation_info


# --------------------------------------------------------------------------- LangChain store
def test_precomputed_store_keys_equal_the_lazily_encoded_ones(tiny_lm, docs, embeddings):
    store = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, show_progress=False)
    datastore = store.token_datastore()
    assert datastore.is_precomputed and datastore.precomputed.num_passages == len(docs)
    assert_keys_of_texts(datastore, {d.id: d.page_content for d in docs}, tiny_lm)
    lazy = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, precompute_keys=False)
    assert not lazy.token_datastore().is_precomputed, "a lazy store encodes nothing on add"
    question = docs[1].page_content[:40]
    assert answer(store, tiny_lm, question)["text"] == answer(lazy, tiny_lm, question)["text"]


def test_store_without_lm_precomputes_when_one_binds(tiny_lm, docs, embeddings):
    store = NestVectorStore.from_documents(docs, embeddings, show_progress=False)
    assert store.lm is None
    info = answer(store, tiny_lm, docs[0].page_content[:40])
    assert store.lm is tiny_lm and store.token_datastore().is_precomputed
    assert info["stats"]["encode_passes"] == 0, "the first answer finds every key precomputed"


def test_saved_store_reloads_memory_mapped_keys_with_the_same_answers(tmp_path, tiny_lm, docs, embeddings):
    store = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, show_progress=False)
    folder = store.save_local(tmp_path / "store")
    assert sorted(p.name for p in (folder / "keys").iterdir()) == [
        "char_spans.npy", "keys.npy", "offsets.npy", "token_ids.npy", "valid.npy"
    ]
    for lm in (tiny_lm, None):  # the LM given at load, or bound by the first answer
        loaded = NestVectorStore.load_local(folder, embeddings, lm=lm, show_progress=False)
        question = docs[2].page_content[:40]
        info = answer(loaded, tiny_lm, question)
        keys = loaded.token_datastore().precomputed
        assert isinstance(keys.keys, np.memmap), "saved keys are memory-mapped, not read into memory"
        assert info["stats"]["encode_passes"] == 0
        assert info["text"] == answer(store, tiny_lm, question)["text"]
        assert info["spans"] == answer(store, tiny_lm, question)["spans"]


def test_another_lm_refuses_saved_keys_with_a_clear_error(tmp_path, tiny_lm, docs, embeddings, smol_tokenizer):
    folder = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, show_progress=False).save_local(tmp_path / "s")
    other = make_tiny_lm(smol_tokenizer, seed=1)
    with pytest.raises(ValueError, match=r"encoded by LM 'tiny-llama-0'.*'tiny-llama-1' has other weights"):
        NestVectorStore.load_local(folder, embeddings, lm=other)
    unbound = NestVectorStore.load_local(folder, embeddings)
    with pytest.raises(ValueError, match="other weights"):
        unbound.token_datastore(other)
    rekeyed = NestVectorStore.load_local(folder, embeddings, lm=other, load_keys=False, show_progress=False)
    assert_keys_of_texts(rekeyed.token_datastore(), {d.id: d.page_content for d in docs}, other)


def test_saved_keys_of_another_key_layer_are_refused(tmp_path, tiny_lm, docs, embeddings):
    folder = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, show_progress=False).save_local(tmp_path / "s")
    with pytest.raises(ValueError, match="key_layer 'ffn_input'"):
        NestVectorStore.load_local(folder, embeddings, lm=tiny_lm, key_layer="layer:-2")


def test_removing_and_adding_documents_keeps_keys_aligned(tmp_path, tiny_lm, docs, embeddings):
    store = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, show_progress=False)
    datastore = store.token_datastore()
    store.delete(["turing"])
    store.add_documents([Document(id="new", page_content="Ada Lovelace wrote the first published algorithm in 1843.")])
    store.add_documents([Document(id="curie", page_content="Marie Curie won two Nobel prizes.")])  # replaced text
    assert datastore.precomputed.num_passages == len(datastore.passages), "added documents' keys are appended"
    texts = {d.id: d.page_content for d in store.get_by_ids(["curie", "zoe", "new"])}
    assert_keys_of_texts(datastore, texts, tiny_lm)

    folder = store.save_local(tmp_path / "store")
    offsets = np.load(folder / "keys" / "offsets.npy")
    assert len(offsets) == len(texts) + 1, "removed and replaced documents' keys are not saved"
    loaded = NestVectorStore.load_local(folder, embeddings, lm=tiny_lm, show_progress=False)
    assert_keys_of_texts(loaded.token_datastore(), texts, tiny_lm)
    loaded.add_documents([Document(id="later", page_content="Grace Hopper built an early compiler.")])
    assert_keys_of_texts(loaded.token_datastore(), {**texts, "later": "Grace Hopper built an early compiler."}, tiny_lm)


def test_lazy_store_saves_keys_once_precomputed(tmp_path, tiny_lm, docs, embeddings):
    store = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, precompute_keys=False)
    assert not (store.save_local(tmp_path / "a") / "keys").exists()
    assert store.precompute_token_keys(show_progress=False) == len(docs)
    assert (store.save_local(tmp_path / "b") / "keys" / "keys.npy").is_file()


def test_tampered_key_array_is_refused(tmp_path, tiny_lm, docs, embeddings):
    folder = NestVectorStore.from_documents(docs, embeddings, lm=tiny_lm, show_progress=False).save_local(tmp_path / "s")
    keys = np.load(folder / "keys" / "keys.npy")
    np.save(folder / "keys" / "keys.npy", keys * 2)
    with pytest.raises(ValueError, match="keys/keys.npy does not match its checksum"):
        NestVectorStore.load_local(folder, embeddings, lm=tiny_lm)


# --------------------------------------------------------------------------- LlamaIndex store
def test_llama_index_store_precomputes_persists_and_refuses_another_lm(tmp_path, tiny_lm, small_passages, smol_tokenizer):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode

    from nest_integrations.llama_index import NestVectorStore as LlamaStore

    nodes = [TextNode(id_=p.id, text=p.text, embedding=[1.0, float(n), 0.5]) for n, p in enumerate(small_passages)]
    store = LlamaStore(lm=tiny_lm, show_progress=False)
    store.add(nodes[:2])
    store.add(nodes[2:])
    store.delete_nodes(["turing"])
    texts = {n.node_id: n.text for n in nodes if n.node_id != "turing"}
    assert_keys_of_texts(store.token_datastore(), texts, tiny_lm)

    path = str(tmp_path / "default__vector_store.json")
    store.persist(path)
    loaded = LlamaStore.from_persist_path(path, lm=tiny_lm)
    assert isinstance(loaded.token_datastore().precomputed.keys, np.memmap)
    assert_keys_of_texts(loaded.token_datastore(), texts, tiny_lm)
    with pytest.raises(ValueError, match="other weights"):
        LlamaStore.from_persist_path(path, lm=make_tiny_lm(smol_tokenizer, seed=1))
    (keys_file,) = tmp_path.glob("default__vector_store.keys-*.npy")
    np.save(keys_file, np.load(keys_file) * 2)
    with pytest.raises(ValueError, match="does not match its checksum"):
        LlamaStore.from_persist_path(path, lm=tiny_lm)


# --------------------------------------------------------------------------- the estimate
def test_chunks_start_with_a_small_probe():
    assert chunk_bounds([100] * 10, 0, 4, probe_tokens=250) == [(0, 3), (3, 7), (7, 10)]
    assert chunk_bounds([900, 5, 5], 1, 4, probe_tokens=1) == [(1, 2), (2, 3)]
    assert chunk_bounds([5] * 3, 3, 4, probe_tokens=10) == []


def test_the_estimate_is_logged_before_the_bulk_of_the_work(tiny_lm, small_passages, caplog):
    passages = [Passage(id=f"{p.id}-{n}", text=p.text) for n in range(8) for p in small_passages]
    # One forward of at most 100 tokens: the probe chunk is the first few passages.
    datastore = TokenDatastore(passages, PassageEncoder(tiny_lm, max_passage_tokens=100, window_overlap=16, batch_tokens=100))
    events = []
    encode = datastore.encoder.encode

    def counted(texts):
        events.append(("encode", len(texts)))
        return encode(texts)

    class Recorder(logging.Handler):
        def emit(self, record):
            events.append(("log", record.getMessage()))

    datastore.encoder.encode = counted
    recorder = Recorder()
    logging.getLogger("nest_integrations.store.encode_progress").addHandler(recorder)
    try:
        with caplog.at_level(logging.INFO, logger="nest_integrations.store.encode_progress"):
            datastore.precompute(show_progress=False, chunk_passages=8)
    finally:
        logging.getLogger("nest_integrations.store.encode_progress").removeHandler(recorder)
    total = sum(len(datastore.encoder.tokenize(p.text)[0]) for p in passages)
    assert events[0] == ("log", f"Encoding datastore: {len(passages)} passages, {total} tokens to encode")
    assert events[1][0] == "encode" and events[1][1] < 8, "a small probe chunk first"
    assert events[2][0] == "log" and f"the {total} tokens should take about" in events[2][1]
    assert [kind for kind, _ in events[3:]] == ["encode"] * (len(events) - 3), "then the bulk of the work"


# --------------------------------------------------------------------------- encoding precision
def test_bfloat16_encoding_runs_on_one_copy_kept_in_step_with_the_weights(tiny_lm, small_passages, monkeypatch, smol_tokenizer):
    import torch

    from nest_integrations.store import key_precision
    from nest_integrations.store.key_precision import encoding_model

    lm = make_tiny_lm(smol_tokenizer, seed=2)  # its weights are changed below
    encoder = PassageEncoder(lm)
    monkeypatch.setenv("NEST_KEY_ENCODING", "auto")
    monkeypatch.setattr(key_precision, "cpu_has_bf16", lambda: False)
    assert encoding_model(lm, encoder.reader) == (lm.model, encoder.reader), "float32 without bfloat16 instructions"
    monkeypatch.setenv("NEST_KEY_ENCODING", "float32")
    assert encoding_model(lm, encoder.reader) == (lm.model, encoder.reader)
    float32 = encoder.encode([p.text for p in small_passages])
    monkeypatch.setenv("NEST_KEY_ENCODING", "bfloat16")
    model, reader = encoding_model(lm, encoder.reader)
    assert next(model.parameters()).dtype == torch.bfloat16 and reader.model is model
    assert encoding_model(lm, encoder.reader)[0] is model, "one copy per model"
    bfloat16 = encoder.encode([p.text for p in small_passages])
    for a, b in zip(float32, bfloat16):
        assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.valid, b.valid)
        error = np.linalg.norm(a.keys[a.valid].astype(np.float32) - b.keys[b.valid].astype(np.float32), axis=1)
        assert (error <= 0.05 * np.linalg.norm(a.keys[a.valid].astype(np.float32), axis=1)).all()
    with torch.no_grad():
        lm.model.model.norm.weight.mul_(2.0)
    assert encoding_model(lm, encoder.reader)[0] is not model, "changed weights get a fresh copy"
    monkeypatch.setenv("NEST_KEY_ENCODING", "half")
    with pytest.raises(ValueError, match="NEST_KEY_ENCODING must be one of auto, float32, bfloat16"):
        encoder.encode(["x"])
