"""Concurrent callers share batches (nest_integrations.decoding.batching_service) and get what they get alone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nest_integrations.core.config import NestConfig
from nest_integrations.decoding import batching
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.decoding.batching_service import BatchingService, shared_service
from conftest import ListRetriever, held_back
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder
from test_batching import MIXED, PROMPTS, _one_by_one, _same

OVERRIDES = dict(mode="nest", **MIXED)


@pytest.fixture
def decoder(tiny_lm, small_passages):
    store = TokenDatastore(small_passages, PassageEncoder(tiny_lm))
    store.precompute(show_progress=False)  # preparing a row then needs no forward of the LM
    return NestDecoder(tiny_lm, store, ListRetriever(small_passages), NestConfig(max_new_tokens=24))


def test_concurrent_threads_share_forwards_and_equal_alone(decoder, shared_rows):
    single = _one_by_one(decoder, PROMPTS, **OVERRIDES)
    results = [None] * len(PROMPTS)

    def call(i):
        results[i] = decoder.generate(PROMPTS[i], **OVERRIDES)

    releaser = held_back(decoder.lm, len(PROMPTS))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in [*threads, releaser]:
        thread.join(120)
    _same(results, single)
    assert max(shared_rows) == len(PROMPTS), "the callers decoded in one batch"


def test_asyncio_tasks_share_forwards(decoder, shared_rows):
    single = _one_by_one(decoder, PROMPTS, **OVERRIDES)

    async def main():
        return await asyncio.gather(*(decoder.agenerate(p, **OVERRIDES) for p in PROMPTS))

    releaser = held_back(decoder.lm, len(PROMPTS))
    _same(asyncio.run(main()), single)
    releaser.join(60)
    assert max(shared_rows) == len(PROMPTS)


def test_streams_stream_while_sharing(decoder, shared_rows):
    single = _one_by_one(decoder, PROMPTS[:3], **OVERRIDES)
    pieces = [[] for _ in range(3)]

    def consume(i):
        pieces[i] = list(decoder.stream(PROMPTS[i], **OVERRIDES))

    releaser = held_back(decoder.lm, 3)
    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in [*threads, releaser]:
        thread.join(120)
    for chunks, alone in zip(pieces, single):
        assert len(chunks) > 2, "text arrives in pieces, not at the end"
        assert "".join(c.text for c in chunks) == alone.text
        assert chunks[-1].output is not None and chunks[-1].output.spans == alone.spans
    assert max(shared_rows) == 3


def test_async_stream_matches_output(decoder):
    async def main():
        return [chunk async for chunk in decoder.astream(PROMPTS[1], **OVERRIDES)]

    chunks = asyncio.run(main())
    alone = _one_by_one(decoder, PROMPTS[1:2], **OVERRIDES)[0]
    assert "".join(c.text for c in chunks) == alone.text and chunks[-1].output.text == alone.text


def test_an_abandoned_stream_leaves_the_batch(decoder):
    stream = decoder.stream(PROMPTS[3], **{**OVERRIDES, "max_new_tokens": 40})
    next(stream)
    stream.close()
    # the other callers are served; the abandoned row is gone by then
    out = decoder.generate(PROMPTS[0], **OVERRIDES)
    assert out.text == _one_by_one(decoder, PROMPTS[:1], **OVERRIDES)[0].text
    assert not shared_service(decoder.shared_lm)._scheduler.busy


def test_a_failed_forward_fails_its_batch_and_the_service_goes_on(decoder, monkeypatch):
    forward = batching._shared_forward
    calls = []

    def broken_once(shared, batch, active, fed):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return forward(shared, batch, active, fed)

    monkeypatch.setattr(batching, "_shared_forward", broken_once)
    with pytest.raises(RuntimeError, match="out of memory"):
        decoder.generate(PROMPTS[0], **OVERRIDES)
    assert decoder.generate(PROMPTS[0], **OVERRIDES).text == _one_by_one(decoder, PROMPTS[:1], **OVERRIDES)[0].text


def test_bad_input_raises_in_the_callers_thread(decoder):
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate("Hi", max_new_tokens=100_000)
    with pytest.raises(ValueError, match="max_batch"):
        decoder.generate_batch(PROMPTS, max_batch=0)
    with pytest.raises(ValueError, match="max_batch"):
        shared_service(decoder.shared_lm).max_batch = 0


def test_the_worker_stays_for_the_next_call_and_ends_when_idle_or_closed(decoder):
    service = shared_service(decoder.shared_lm)
    decoder.generate(PROMPTS[0], **OVERRIDES)
    worker = service._worker
    decoder.generate(PROMPTS[1], **OVERRIDES)
    assert worker is not None and service._worker is worker, "one thread (and torch thread pool) across calls"
    service.close()
    assert service._worker is None
    assert decoder.generate(PROMPTS[0], **OVERRIDES).text  # a later call starts a new worker

    brief = BatchingService(decoder.shared_lm, idle_s=0.05)
    brief.submit(decoder.prepare_row(PROMPTS[0], None, None, decoder._call_config(OVERRIDES))).result()
    deadline = time.monotonic() + 10
    while brief._worker is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert brief._worker is None
    with pytest.raises(ValueError, match="idle_s"):
        BatchingService(decoder.shared_lm, idle_s=0)


def test_decoders_of_one_lm_share_a_service(decoder, tiny_lm, small_passages):
    other = NestDecoder(tiny_lm, TokenDatastore(small_passages[:2], PassageEncoder(tiny_lm)), ListRetriever(small_passages[:2]))
    assert shared_service(other.shared_lm) is shared_service(decoder.shared_lm)


def test_a_caller_alone_runs_the_models_own_causal_path(decoder):
    masks = []

    def record(module, args, kwargs):
        if kwargs.get(decoder.cache_arg) is not None:
            masks.append(kwargs.get("attention_mask"))

    hook = decoder.lm.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = decoder.generate(PROMPTS[3], **OVERRIDES)
    finally:
        hook.remove()
    assert out.stats.forward_passes > 2 and len(masks) == out.stats.forward_passes
    assert all(mask is None for mask in masks), "no 4-D mask, no foreign or dead columns"


EXIT_SCRIPT = """
import atexit, gc, sys, threading, time
sys.path.insert(0, {tests!r})

def count_workers():  # registered first, so it runs after the library's own exit handler
    print("workers at exit:", sum(t.name == "nest-batching" and t.is_alive() for t in threading.enumerate()))
    print(f"exit took {{time.monotonic() - ended:.1f}} s")

atexit.register(count_workers)
from conftest import ListRetriever, make_tiny_lm
from transformers import AutoTokenizer
from nest_integrations.core.config import NestConfig
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.model.lm import default_model_path
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder
from nest_integrations.corpus.passages import Passage

passages = [Passage(id="p", title="P", text="Marie Curie was a physicist and chemist born in Warsaw in 1867.")]
lm = make_tiny_lm(AutoTokenizer.from_pretrained(default_model_path()))
decoder = NestDecoder(lm, TokenDatastore(passages, PassageEncoder(lm)), ListRetriever(passages), NestConfig(max_new_tokens=4))
decoder.generate("Marie Curie was")  # starts the LM's worker thread, which then waits idle
del decoder, lm
gc.collect()  # the LM is released; its worker still waits for rows
ended = time.monotonic()
"""


def test_every_worker_ends_before_the_interpreter_finalizes(tmp_path):
    """A worker still running when the interpreter finalizes is killed wherever it stands, inside
    torch freeing its batch's tensors too, which aborts the process: at exit every worker ends,
    the worker of an LM released earlier as well, and the exit does not wait out its idle time."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT.format(tests=str(Path(__file__).parent)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "workers at exit: 0" in done.stdout, done.stdout + done.stderr[-2000:]
    exit_s = float(done.stdout.split("exit took ")[1].split()[0])
    assert exit_s < 15, f"the exit waited out the worker's idle time ({exit_s} s)"
