"""Shared fixtures: a tiny random Llama with the SmolLM2 tokenizer, and small corpora."""

from __future__ import annotations

import os

import pytest
import torch

from nest_integrations.corpus.passages import Passage
from nest_integrations.model.lm import LoadedLM, default_model_path
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder

os.environ["NEST_AUTO_SERVE"] = "0"  # no test leaves a background `nest serve` behind; its subprocesses inherit this


@pytest.fixture(scope="session")
def smol_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


class ListRetriever:
    """A first stage that returns its passages in order, each scored 1.0."""

    def __init__(self, passages):
        self.passages = list(passages)

    def retrieve(self, query, k):
        return [(p, 1.0) for p in self.passages][:k]


def tampered_copy(path, tmp_path, edit):
    """A copy of the saved folder ``path`` in ``tmp_path / "copy"``, after ``edit(copy, manifest)``
    changed its files or its manifest dict (written back)."""
    import json
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(copy, manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def make_tiny_lm(tokenizer, seed: int = 0) -> LoadedLM:
    """A 2-layer, hidden-64 random Llama over the SmolLM2 vocabulary (built in ~1 s)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from nest_integrations.model.attention import use_packed_sdpa
    from nest_integrations.model.packed_linear import use_packed_linears

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    use_packed_sdpa(model)  # as load_lm does: the batch tests run the attention and linears the package runs
    use_packed_linears(model)
    return LoadedLM(model=model, tokenizer=tokenizer, name=f"tiny-llama-{seed}")


@pytest.fixture(scope="session")
def tiny_lm(smol_tokenizer) -> LoadedLM:
    return make_tiny_lm(smol_tokenizer)


@pytest.fixture
def small_passages() -> list[Passage]:
    return [
        Passage(id="curie", title="Marie Curie", text="Marie Curie was a Polish and naturalised-French physicist and chemist who conducted pioneering research on radioactivity. She was born in 1867 in Warsaw.", metadata={"topic": "People"}),
        Passage(id="turing", title="Alan Turing", text="Alan Turing was an English mathematician, computer scientist and cryptanalyst, born in 1912. He formalised the concepts of algorithm and computation.", metadata={"topic": "People"}),
        Passage(id="zoe", title="Zoë Ångström", text="Zoë Ångström ☃ is a fictional Swedish astronomer who catalogued comets near the Oort cloud in 2031.", metadata={"topic": "Fiction"}),
    ]


@pytest.fixture
def tiny_datastore(tiny_lm, small_passages) -> TokenDatastore:
    return TokenDatastore(small_passages, PassageEncoder(tiny_lm, "ffn_input", "auto"))


@pytest.fixture
def shared_rows(monkeypatch):
    """Rows taking part in each shared forward of the batching scheduler."""
    from nest_integrations.decoding import batching

    rows = []
    forward = batching._shared_forward

    def counted(shared, batch, active, fed):
        rows.append(len(active))
        return forward(shared, batch, active, fed)

    monkeypatch.setattr(batching, "_shared_forward", counted)
    return rows


def held_back(lm, count):
    """A started thread holding ``lm`` until ``count`` rows are queued in its batching
    service, so concurrent callers decode together (the tests' only timing). Rows must
    be preparable without the LM (precomputed keys), or they wait out the 60 s."""
    import threading
    import time

    from nest_integrations.decoding.batching_service import _services

    held = threading.Event()

    def queued():
        return sum(service.pending for (lm_id, _), service in list(_services.items()) if lm_id == id(lm))

    def hold():
        with lm.forward_lock:
            held.set()
            deadline = time.monotonic() + 60
            while queued() < count and time.monotonic() < deadline:
                time.sleep(0.01)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    return holder


def word_share(query: str, texts: list[str]) -> list[float]:
    """A stand-in for the embedder's cosine (a ``Relevance``): the share of the query's content
    words each text holds."""
    from nest_integrations.policy.relevance import content_words, text_stems

    wanted = content_words(query)
    return [len(wanted & text_stems(text)) / max(len(wanted), 1) for text in texts]
