"""Safe persistence: refusals, atomic replacement, leftovers, confined and checked reads, each file read once."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from nest_integrations.core import folder_snapshot, safe_io
from nest_integrations.core.folder_snapshot import FolderSnapshot
from nest_integrations.core.safe_io import ArtefactManifest, atomic_folder, leftovers, recover
from nest_integrations.langchain import NestVectorStore

KIND = "test-artefact"


def write_artefact(folder, payload: str = "v1") -> None:
    (folder / "data.txt").write_text(payload)
    manifest = {"format": KIND, "format_version": 1, "checksums": {"data.txt": safe_io.sha256_file(folder / "data.txt")}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def save(target, payload: str = "v1", overwrite: bool = False):
    with atomic_folder(target, kind=KIND, overwrite=overwrite) as tmp:
        write_artefact(tmp, payload)
    return target


def test_a_foreign_folder_a_file_or_a_link_is_never_replaced(tmp_path):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    (tmp_path / "note.txt").write_text("keep")
    (tmp_path / "link").symlink_to(thesis)
    for target in (thesis, tmp_path / "note.txt", tmp_path / "link"):
        with pytest.raises(ValueError, match="refusing to replace"):
            save(target, overwrite=True)
    assert (thesis / "thesis.tex").read_text() == "years of work" and (tmp_path / "note.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "note.txt", "thesis"]


def test_same_kind_needs_overwrite_and_an_empty_folder_is_fine(tmp_path):
    (tmp_path / "a").mkdir()
    save(tmp_path / "a")
    with pytest.raises(ValueError, match="overwrite=True"):
        save(tmp_path / "a", "v2")
    save(tmp_path / "a", "v2", overwrite=True)
    assert (tmp_path / "a" / "data.txt").read_text() == "v2"
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_new_folders_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        save(tmp_path / "a")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o750


def test_a_failing_save_leaves_the_old_artefact_and_no_temporary(tmp_path):
    save(tmp_path / "a")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_folder(tmp_path / "a", kind=KIND, overwrite=True) as tmp:
            write_artefact(tmp, "v2")
            raise RuntimeError("boom")
    assert (tmp_path / "a" / "data.txt").read_text() == "v1" and leftovers(tmp_path / "a") == []


def test_the_two_rename_fallback_replaces_too(tmp_path, monkeypatch):
    monkeypatch.setattr(safe_io, "_exchange", lambda a, b: False)
    save(tmp_path / "a")
    save(tmp_path / "a", "v2", overwrite=True)
    assert (tmp_path / "a" / "data.txt").read_text() == "v2" and leftovers(tmp_path / "a") == []


def test_recover_restores_the_old_copy_of_a_fallback_crash_and_cleans_temporaries(tmp_path):
    save(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / ".a-old-0123456789abcdef")
    (tmp_path / ".a-tmp-fedcba9876543210").mkdir()
    (tmp_path / ".a-mine").mkdir()  # not our pattern: never touched
    recover(tmp_path / "a")
    assert (tmp_path / "a" / "data.txt").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a-mine", "a"]


@pytest.mark.parametrize(
    "checksums, needed, match",
    [
        ({}, ["data.txt"], "not listed"),
        ({"../secret.txt": "0" * 64}, [], "not a plain relative path"),
        ({"/etc/hostname": "0" * 64}, [], "not a plain relative path"),
        ({"out/x": "0" * 64}, [], "symbolic link"),
        ({"data.txt": "0" * 64}, ["data.txt"], "does not match its checksum"),
    ],
)
def test_reads_are_listed_confined_and_checked(tmp_path, checksums, needed, match):
    folder = save(tmp_path / "a")
    (tmp_path / "secret.txt").write_text("secret")
    (folder / "out").symlink_to(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "checksums": checksums}))
    with pytest.raises(ValueError, match=match), FolderSnapshot(folder, what="test artefact") as snapshot:
        snapshot.read_manifest(ArtefactManifest, kind=KIND, supported_version=1)
        snapshot.require(needed)
        for rel in checksums:
            snapshot.read(rel)


def read_manifest(path):
    with FolderSnapshot(path.parent, what="test artefact") as snapshot:
        return snapshot.read_manifest(ArtefactManifest, kind=KIND, supported_version=1)


@pytest.mark.parametrize("version", [True, 0, -5, 99, "1", 1.0, None])
def test_format_version_must_be_a_supported_int(tmp_path, version):
    folder = save(tmp_path / "a")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format_version": version}))
    with pytest.raises(ValueError, match="format version"):
        read_manifest(folder / "manifest.json")


def test_a_mistyped_manifest_field_is_named(tmp_path):
    folder = save(tmp_path / "a")
    (folder / "manifest.json").write_text(json.dumps({"format": KIND, "format_version": 1, "checksums": {"data.txt": 5}}))
    with pytest.raises(ValueError, match=r"checksums\.data\.txt"):
        read_manifest(folder / "manifest.json")


def test_an_update_beside_an_artefact_goes_only_into_its_version_and_waits_for_a_save_a_bounded_time(tmp_path, monkeypatch):
    import time

    from nest_integrations.core.folder_snapshot import update_if_current
    from nest_integrations.core.safe_io import locked_folder

    folder = save(tmp_path / "a")
    digest = safe_io.sha256_file(folder / "manifest.json")

    def update(value):
        return update_if_current(folder / "cache.json", lambda raw: (raw or b"") + value, manifest=folder / "manifest.json", digest=digest, lock=tmp_path)

    assert update(b"x") and update(b"y") and (folder / "cache.json").read_bytes() == b"xy"
    save(tmp_path / "a", "v2", overwrite=True)  # another version in its place
    assert not update(b"z") and not (folder / "cache.json").exists()
    monkeypatch.setattr(folder_snapshot, "UPDATE_WAIT_S", 0.2)
    with locked_folder(tmp_path, blocking=True):  # a save holding the folder's lock
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            update(b"z")
        assert time.monotonic() - started < 2


# --------------------------------------------------------------------------- the LangChain and LlamaIndex stores
def test_langchain_store_refuses_an_empty_checksum_list(tmp_path):
    store = NestVectorStore.from_texts(["a", "b"], DeterministicFakeEmbedding(size=8), ids=["1", "2"])
    folder = store.save_local(tmp_path / "s")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "checksums": {}}))
    with pytest.raises(ValueError, match="not listed"):
        NestVectorStore.load_local(folder, DeterministicFakeEmbedding(size=8))


def llama_store(n: int):
    from llama_index.core.schema import TextNode

    from nest_integrations.llama_index import NestVectorStore as LlamaStore

    store = LlamaStore()
    store.add([TextNode(id_=f"n{i}", text=f"node {i}", embedding=[float(i), 1.0, 0.5]) for i in range(n)])
    return store


def test_llama_index_persist_replaces_as_a_whole_and_cleans_old_data(tmp_path):
    from nest_integrations.llama_index import NestVectorStore as LlamaStore

    path = str(tmp_path / "default__vector_store.json")
    llama_store(2).persist(path)
    llama_store(3).persist(path)
    assert len(LlamaStore.from_persist_path(path).get_nodes()) == 3
    assert len(list(tmp_path.iterdir())) == 3, "the manifest and the two data files it names"


def test_llama_index_persist_refuses_a_foreign_file_and_unlisted_data(tmp_path):
    from nest_integrations.llama_index import NestVectorStore as LlamaStore

    path = tmp_path / "default__vector_store.json"
    path.write_text(json.dumps({"embedding_dict": {}}))  # a SimpleVectorStore's
    with pytest.raises(ValueError, match="not a NestVectorStore manifest"):
        llama_store(1).persist(str(path))
    path.unlink()
    llama_store(1).persist(str(path))
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "checksums": {}}))
    with pytest.raises(ValueError, match="not listed"):
        LlamaStore.from_persist_path(str(path))
    path.write_text(json.dumps({**manifest, "files": {"nodes": "../x.json", "embeddings": "e.npy"}}))
    with pytest.raises(ValueError, match="files.nodes"):
        LlamaStore.from_persist_path(str(path))


@pytest.mark.parametrize(
    "ids, error", [(["", "b"], ValueError), ([0, "b"], TypeError), ([1, "1"], TypeError), (["a", "a"], ValueError)]
)
def test_langchain_store_ids_are_strings_or_none(ids, error):
    store = NestVectorStore(DeterministicFakeEmbedding(size=8))
    with pytest.raises(error, match=r"ids"):
        store.add_texts(["x", "y"], ids=ids)
    assert len(store) == 0
    assert len(store.add_texts(["x", "y"], ids=[None, "b"])) == 2


@pytest.mark.parametrize("k, error", [(1.5, TypeError), (True, TypeError), (-1, ValueError)])
def test_langchain_store_k_must_be_a_non_negative_int(k, error):
    store = NestVectorStore.from_texts(["a", "b"], DeterministicFakeEmbedding(size=8))
    with pytest.raises(error, match="k must"):
        store.similarity_search("a", k=k)


# --------------------------------------------------------------------------- key files
@pytest.fixture(scope="module")
def keyed_index(tiny_lm, tmp_path_factory):
    from nest_integrations.corpus.passages import Passage
    from nest_integrations.index.nest_index import NestIndex

    passages = [Passage(id=f"p{i}", text=f"Passage {i} holds a sentence. It has a second one too.") for i in range(4)]
    return NestIndex.build(passages, tiny_lm, precompute_keys=True, show_progress=False).save(tmp_path_factory.mktemp("keyed") / "index")


def truncate(path):
    os.truncate(path, path.stat().st_size - 64)  # in place, inside the key rows


def folder_instead(path):
    path.unlink()
    path.mkdir()


def fifo_instead(path):
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize(
    "damage, match",
    [
        (truncate, r"keys/keys\.npy holds \d+ bytes; its header describes \d+: the file was truncated"),
        (folder_instead, r"keys/keys\.npy is not a regular file"),
        (fifo_instead, r"keys/keys\.npy is not a regular file"),
    ],
)
def test_a_damaged_key_file_is_an_error_naming_it_before_anything_is_mapped(keyed_index, tiny_lm, tmp_path, damage, match):
    """Unhashed (verify_checksums=False), a truncated key file would be mapped and fault (SIGBUS) at its first
    read; a FIFO would block the load. Each is refused by its size or type, naming the file."""
    import shutil

    from nest_integrations.index.nest_index import NestIndex

    folder = tmp_path / "index"
    shutil.copytree(keyed_index, folder)
    damage(folder / "keys" / "keys.npy")
    with pytest.raises(ValueError, match=match):
        NestIndex.load(folder, tiny_lm, verify_checksums=False)


def test_a_key_file_truncated_in_place_after_loading_is_an_error_not_a_sigbus(keyed_index, tiny_lm, tmp_path):
    """A process holds an index whose keys are memory-mapped; something truncates keys.npy in place. Reading
    the lost pages would kill the process with SIGBUS: the datastore refuses them with a ValueError naming the file."""
    import shutil

    from nest_integrations.index.nest_index import NestIndex

    folder = tmp_path / "index"
    shutil.copytree(keyed_index, folder)
    index = NestIndex.load(folder, tiny_lm)
    last = len(index.passages) - 1
    assert len(index.datastore.fetch([last])[0].token_ids)  # mapped and readable
    truncate(folder / "keys" / "keys.npy")
    with pytest.raises(ValueError, match=r"keys/keys\.npy was truncated after it was loaded"):
        index.datastore.fetch([last])  # no page of the file was read
