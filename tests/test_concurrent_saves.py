"""Loads while another thread keeps saving two versions to the same path: every load returns one
version whole (passages or documents, vectors, token keys and calibrations of the same save), with
no false "does not match its checksum" error; and a load never deletes what a later save wrote.

Each store is saved and loaded in a loop for a bounded time (:data:`SECONDS`); the saves alternate
between two versions that differ in every file, so a mix is seen as soon as one file comes from the
other version.
"""

from __future__ import annotations

import threading
import time
import zlib

import numpy as np
import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.calibration import Calibration

SECONDS = 3.0
"""How long each store is loaded while it is saved (longer, up to :data:`LIMIT`, until 3 of each ran)."""
LIMIT = 20.0
DOCUMENTS = 12
EMBEDDINGS = DeterministicFakeEmbedding(size=16)


def text(version: int, i: int) -> str:
    """Document ``i`` of a version: same length in both versions (so a mix is not caught by sizes)."""
    return f"Entry {i} of version {version} says the year was {1900 + version} and nothing else."


def calibration(lm, version: int) -> Calibration:
    """A calibration that tells the versions apart by its alpha."""
    quantiles = {"0.1": 0.1, "0.5": 0.5, "0.9": 0.9}
    return Calibration(
        lm_name=lm.name, lm_fingerprint=lm.fingerprint(), alpha=0.1 * version, tau=0.1, separating_alpha=0.3,
        balanced_accuracy=0.8, known_ratio_quantiles=quantiles, unknown_ratio_quantiles=quantiles, passages=4, tokens=8, seconds=1.0,
    )


def version_of(texts: list[str]) -> int:
    """The version every text is of (AssertionError on a mix)."""
    versions = {int(t.split(" version ")[1].split()[0]) for t in texts}
    assert len(versions) == 1, f"texts of versions {sorted(versions)} in one load"
    return versions.pop()


def same_keys(loaded, expected) -> None:
    for name in ("token_ids", "char_spans", "keys", "valid", "offsets"):
        same = np.array_equal(np.asarray(getattr(loaded, name)), np.asarray(getattr(expected, name)))
        assert same, f"{name} of the other version"


def hammer(save, load) -> None:
    """Load in a loop for :data:`SECONDS` while a thread alternates ``save(1)`` and ``save(2)``; every
    ``load()`` checks that it found one version whole (it raises when it did not)."""
    stop, failures, saves = threading.Event(), [], [0]

    def saving() -> None:
        try:
            while not stop.is_set():
                save(1 + saves[0] % 2)
                saves[0] += 1
        except BaseException as err:  # reported by the test, not lost in the thread
            failures.append(err)

    saver = threading.Thread(target=saving, daemon=True)
    saver.start()
    loads, start = 0, time.monotonic()
    try:
        while not failures and time.monotonic() - start < LIMIT and (time.monotonic() - start < SECONDS or min(loads, saves[0]) < 3):
            load()
            loads += 1
    finally:
        stop.set()
        saver.join(timeout=60)
    assert not failures, failures
    assert loads >= 3 and saves[0] >= 3, f"{loads} loads during {saves[0]} saves: too few to test anything"


class WordHashEmbedder:
    """A passage embedder of no cost (hashed word counts), so a load costs its reads, not an embedder's forward."""

    def encode(self, sentences):
        vectors = np.zeros((len(sentences), 16), dtype=np.float32)
        for row, sentence in enumerate(sentences):
            for word in sentence.lower().split():
                vectors[row, zlib.crc32(word.encode()) % 16] += 1.0
        return vectors


def test_a_nest_index_load_during_saves_is_one_version(tiny_lm, tmp_path):
    from nest_integrations.index.nest_index import NestIndex

    indexes, vectors = {}, {}
    for version in (1, 2):
        passages = [Passage(id=f"p{i}", title=f"Entry {i}", text=text(version, i)) for i in range(DOCUMENTS)]
        indexes[version] = NestIndex.build(passages, tiny_lm, embedder=WordHashEmbedder(), precompute_keys=True, show_progress=False)
        indexes[version].calibrations = {tiny_lm.fingerprint(): calibration(tiny_lm, version)}
        vectors[version] = indexes[version].dense.passage_vectors(passages)
    target = tmp_path / "index"
    indexes[1].save(target)

    def load() -> int:
        index = NestIndex.load(target, tiny_lm, embedder=WordHashEmbedder())
        version = version_of([p.text for p in index.passages])
        same_keys(index.datastore.precomputed, indexes[version].datastore.precomputed)
        same = np.allclose(index.dense.passage_vectors(index.passages), vectors[version])
        assert same, "dense vectors of the other version"
        assert index.calibrations == indexes[version].calibrations, "calibrations of the other version"
        return version

    hammer(lambda v: indexes[v].save(target, overwrite=True), load)


def test_a_langchain_store_load_during_saves_is_one_version(tiny_lm, tmp_path):
    from nest_integrations.langchain import NestVectorStore

    stores, keys = {}, {}
    for version in (1, 2):
        texts = [text(version, i) for i in range(DOCUMENTS)]
        stores[version] = NestVectorStore.from_texts(texts, EMBEDDINGS, ids=[str(i) for i in range(DOCUMENTS)], lm=tiny_lm, show_progress=False)
        stores[version].calibrations[tiny_lm.fingerprint()] = calibration(tiny_lm, version)
        keys[version] = stores[version].token_datastore().precomputed
    target = tmp_path / "store"
    stores[1].save_local(target)

    def load() -> int:
        store = NestVectorStore.load_local(target, EMBEDDINGS, lm=tiny_lm, show_progress=False)
        documents = store.get_by_ids([str(i) for i in range(DOCUMENTS)])
        version = version_of([d.page_content for d in documents])
        found = store.similarity_search_with_score_by_vector(EMBEDDINGS.embed_query(text(version, 0)), k=1)
        assert found[0][0].page_content == text(version, 0) and found[0][1] == pytest.approx(1.0), "vectors of the other version"
        same_keys(store.token_datastore().precomputed, keys[version])
        assert store.calibrations == stores[version].calibrations, "calibrations of the other version"
        return version

    hammer(lambda v: stores[v].save_local(target, overwrite=True), load)


def llama_store(lm, version: int):
    from llama_index.core.schema import TextNode

    from nest_integrations.llama_index import NestVectorStore

    store = NestVectorStore(lm=lm, show_progress=False)
    store.add([TextNode(id_=str(i), text=text(version, i), embedding=[float(version), float(i), 1.0]) for i in range(DOCUMENTS)])
    store.calibrations[lm.fingerprint()] = calibration(lm, version)
    return store


def test_a_llama_index_store_load_during_persists_is_one_version(tiny_lm, tmp_path):
    from nest_integrations.llama_index import NestVectorStore

    stores = {version: llama_store(tiny_lm, version) for version in (1, 2)}
    keys = {version: store.token_datastore().precomputed for version, store in stores.items()}
    path = str(tmp_path / "default__vector_store.json")
    stores[1].persist(path)

    def load() -> int:
        store = NestVectorStore.from_persist_path(path, lm=tiny_lm)
        nodes = store.get_nodes([str(i) for i in range(DOCUMENTS)])
        version = version_of([n.get_content() for n in nodes])
        assert {float(v[0]) for v in store._vectors.values()} == {float(version)}, "embeddings of the other version"
        same_keys(store.token_datastore().precomputed, keys[version])
        assert store.calibrations == stores[version].calibrations, "calibrations of the other version"
        return version

    hammer(lambda v: stores[v].persist(path), load)


def test_a_llama_index_load_never_deletes_what_a_later_persist_wrote(tiny_lm, tmp_path, monkeypatch):
    """The load reads version 1; before it ends (a store without saved keys encodes them then, which can
    take hours) version 2 is persisted in its place. The load's cleaning must keep version 2's files."""
    from nest_integrations.index.vector_store_keys import VectorStoreKeys
    from nest_integrations.llama_index import NestVectorStore

    stores = {version: llama_store(tiny_lm, version) for version in (1, 2)}
    path = str(tmp_path / "default__vector_store.json")
    stores[1].persist(path)
    after_add = VectorStoreKeys.after_add

    def persisted_meanwhile(self):
        monkeypatch.setattr(VectorStoreKeys, "after_add", after_add)
        stores[2].persist(path)  # another process, while this load still encodes
        return after_add(self)

    monkeypatch.setattr(VectorStoreKeys, "after_add", persisted_meanwhile)
    first = NestVectorStore.from_persist_path(path, lm=tiny_lm)
    assert version_of([n.get_content() for n in first.get_nodes()]) == 1
    again = NestVectorStore.from_persist_path(path, lm=tiny_lm)
    assert version_of([n.get_content() for n in again.get_nodes()]) == 2
