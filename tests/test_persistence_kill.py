"""SIGKILL at random moments of a save: the path always loads the old or the new artefact,
and the next load leaves no temporary behind."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from nest_integrations.core.safe_io import leftovers
from nest_integrations.langchain import NestVectorStore

RUNS = 30  # per store: 60 kills in all
EMBEDDINGS = DeterministicFakeEmbedding(size=16)


def langchain_store(version: int) -> NestVectorStore:
    return NestVectorStore.from_texts([f"version {version} text {i}" for i in range(20)], EMBEDDINGS, ids=[str(i) for i in range(20)])


def langchain_case(tmp_path):
    target = tmp_path / "store"
    stores = {v: langchain_store(v) for v in (1, 2)}
    stores[1].save_local(target)

    def save_forever() -> None:
        for n in range(1, 10**9):
            stores[1 + n % 2].save_local(target, overwrite=True)

    def loaded_version() -> int:
        text = NestVectorStore.load_local(target, EMBEDDINGS).get_by_ids(["0"])[0].page_content
        return int(text.split()[1])

    def clean() -> bool:
        return leftovers(target) == []

    return save_forever, loaded_version, clean


def llama_index_case(tmp_path):
    from llama_index.core.schema import TextNode

    from nest_integrations.llama_index import NestVectorStore as LlamaStore

    path = str(tmp_path / "default__vector_store.json")
    stores = {}
    for v in (1, 2):
        stores[v] = LlamaStore()
        stores[v].add([TextNode(id_=str(i), text=f"version {v} node {i}", embedding=[float(v), float(i), 1.0]) for i in range(20)])
    stores[1].persist(path)

    def save_forever() -> None:
        for n in range(1, 10**9):
            stores[1 + n % 2].persist(path)

    def loaded_version() -> int:
        return int(LlamaStore.from_persist_path(path).get_nodes(["0"])[0].get_content().split()[1])

    def clean() -> bool:
        return len(list(tmp_path.iterdir())) == 3  # the manifest and the two data files it names

    return save_forever, loaded_version, clean


@pytest.mark.parametrize("case", [langchain_case, llama_index_case])
def test_sigkill_during_saves_never_loses_the_artefact(tmp_path, case):
    save_forever, loaded_version, clean = case(tmp_path)
    rng = random.Random(0)
    seen = set()
    window = 0.05  # seconds; doubled after each RUNS kills that all landed on one side (a slow machine)
    runs = 0
    while runs < RUNS or (seen != {1, 2} and runs < 4 * RUNS):
        runs += 1
        if runs > RUNS and runs % RUNS == 1:
            window *= 2
        pid = os.fork()
        if pid == 0:  # the child only saves; no torch, no threads
            try:
                save_forever()
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, window))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        version = loaded_version()
        assert version in (1, 2)
        assert clean(), sorted(p.name for p in tmp_path.iterdir())
        seen.add(version)
    assert seen == {1, 2}, "the kills should land both before and after some switches"


# --------------------------------------------------------------------------- generation jobs
JOB_ITEMS = 6
LINE_BYTES = 1 << 20  # a long line, so that some kills land in the middle of writing it


def long_outputs(chunks):
    """A ChunkRunner writing ~1 MiB per item, the same on every run (no model: the kill is what is tested)."""
    for number, chunk in enumerate(chunks):
        yield number, [{"text": f"{item.id} " + "x" * LINE_BYTES} for item in chunk]


def test_sigkill_during_a_generation_job_then_resume_gives_the_uninterrupted_output(tmp_path):
    """Kill a job at random moments: the kept lines are never regenerated wrong, a torn last line is
    dropped, and the resumed file equals the output of a job that was never killed."""
    from nest_integrations.index.jobs import read_items, run_job

    (tmp_path / "items.jsonl").write_text("".join(f'{{"id": "q{i}", "prompt": "p{i}"}}\n' for i in range(JOB_ITEMS)))
    items = read_items(tmp_path / "items.jsonl")
    settings = {"index": "index-sha", "lm": "lm-fingerprint", "mode": "nest"}
    start = time.perf_counter()
    run_job(items, tmp_path / "expected.jsonl", long_outputs, settings=settings, chunk_size=1)
    expected = (tmp_path / "expected.jsonl").read_bytes()
    window = time.perf_counter() - start
    rng = random.Random(0)
    torn = runs = 0
    while runs < RUNS // 2 or (not torn and runs < 4 * RUNS):
        runs += 1
        output = tmp_path / f"out-{runs}.jsonl"
        pid = os.fork()
        if pid == 0:  # the child only runs the job
            try:
                run_job(items, output, long_outputs, settings=settings, chunk_size=1)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, window))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        left = output.read_bytes() if output.exists() else b""
        assert expected.startswith(left)  # appended in order, nothing but whole outputs and one cut
        torn += not left.endswith(b"\n") and bool(left)
        if not left or left == expected:  # killed before the first line or after the last: aim the next kill between
            window *= 1.5 if not left else 1 / 1.5  # (a loaded machine runs the child slower, or faster, than the timed run)
        run_job(items, output, long_outputs, settings=settings, chunk_size=1)
        assert output.read_bytes() == expected
        output.unlink()
    assert torn, "some kills should land in the middle of a line"
