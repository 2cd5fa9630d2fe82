"""A caller that gives up never disturbs the others: cancelled, timed-out and abandoned
rows leave the shared batch at the next step, the other rows decode as alone, and the
batching worker survives whatever resolving one row raises."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import CancelledError

import pytest

from nest_integrations.core.config import NestConfig
from nest_integrations.decoding import batching
from nest_integrations.decoding.batching import RowListener
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.decoding.batching_service import shared_service
from nest_integrations.decoding.verifier import SpanVerifier
from conftest import ListRetriever, held_back
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder
from test_batching import MIXED, PROMPTS, _one_by_one, _same

OVERRIDES = dict(mode="nest", **MIXED)
TARGET = 3
"""The prompt whose caller gives up (the longest: it is still decoding when cancelled)."""
OTHERS = [i for i in range(4) if i != TARGET]
BOUND_S = 60


@pytest.fixture
def decoder(tiny_lm, small_passages):
    store = TokenDatastore(small_passages, PassageEncoder(tiny_lm))
    store.precompute(show_progress=False)
    return NestDecoder(tiny_lm, store, ListRetriever(small_passages), NestConfig(max_new_tokens=24))


@pytest.fixture
def batches(monkeypatch):
    """Records the rows of each shared forward; ``on_second(rows)`` runs before the second one
    (every row has prefilled by then and is decoding). Clear ``rows`` after any one-by-one
    reference run: it runs shared forwards too."""

    class Batches:
        rows: list[list[batching.Row]] = []
        on_second = None

    forward = batching._shared_forward

    def recorded(shared, batch, rows, feeds):
        Batches.rows.append(list(rows))
        if len(Batches.rows) == 2 and Batches.on_second is not None:
            Batches.on_second(rows)
        return forward(shared, batch, rows, feeds)

    monkeypatch.setattr(batching, "_shared_forward", recorded)
    return Batches


def _wait_until_marked(rows, bound_s=10.0):
    """Wait (in the worker) until the cancellation reached one of ``rows``; returns it."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        marked = [row for row in rows if row.cancelled]
        if marked:
            return marked[0]
        time.sleep(0.002)
    raise AssertionError("the cancellation never reached the row")


def _drained(decoder):
    """The shared batching service once its worker took the cancelled row out (it does so at
    its next step, which a loaded machine may delay); fails if a row stays pending."""
    service = shared_service(decoder.shared_lm)
    deadline = time.monotonic() + BOUND_S
    while service.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.pending == 0, "no row left pending"
    return service


def _after_cancel(decoder, batches, marked, single, outputs):
    """What every cancellation path must leave: the others equal alone, the cancelled row in
    no forward after the one it was cancelled in, nothing pending, a later call served."""
    _same(outputs, [single[i] for i in OTHERS])
    assert len(batches.rows[1]) == 4, "the cancelled row was in the batch, decoding"
    assert all(marked not in rows for rows in batches.rows[2:]), "the cancelled row left at the next step"
    service = _drained(decoder)
    assert service._worker is None or service._worker.is_alive()
    later = decoder.submit(PROMPTS[0], **OVERRIDES).result(timeout=BOUND_S)
    assert later.text == single[0].text


def test_cancelling_a_future_takes_its_row_out(decoder, batches):
    single = _one_by_one(decoder, PROMPTS[:4], **OVERRIDES)
    batches.rows.clear()
    marked = []
    releaser = held_back(decoder.lm, 4)
    futures = [decoder.submit(PROMPTS[i], **OVERRIDES) for i in range(4)]

    def cancel(rows):
        assert futures[TARGET].cancel()
        marked.append(_wait_until_marked(rows))

    batches.on_second = cancel
    releaser.join(BOUND_S)
    outputs = [futures[i].result(timeout=BOUND_S) for i in OTHERS]
    with pytest.raises(CancelledError):
        futures[TARGET].result(timeout=0)
    _after_cancel(decoder, batches, marked[0], single, outputs)


def test_a_cancelled_task_takes_its_row_out(decoder, batches):
    single = _one_by_one(decoder, PROMPTS[:4], **OVERRIDES)
    batches.rows.clear()
    marked = []

    async def main():
        loop = asyncio.get_running_loop()
        target = asyncio.ensure_future(decoder.agenerate(PROMPTS[TARGET], **OVERRIDES))

        def cancel(rows):
            loop.call_soon_threadsafe(target.cancel)
            marked.append(_wait_until_marked(rows))

        batches.on_second = cancel
        others = [asyncio.ensure_future(decoder.agenerate(PROMPTS[i], **OVERRIDES)) for i in OTHERS]
        outputs = await asyncio.wait_for(asyncio.gather(*others), BOUND_S)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(target, BOUND_S)
        return outputs

    releaser = held_back(decoder.lm, 4)
    outputs = asyncio.run(main())
    releaser.join(BOUND_S)
    _after_cancel(decoder, batches, marked[0], single, outputs)


def test_a_timed_out_call_frees_the_batch(decoder, batches):
    """The web-server case: ``asyncio.wait_for`` with a deadline shorter than the generation."""
    single = _one_by_one(decoder, PROMPTS[:4], **OVERRIDES)
    batches.rows.clear()
    marked = []
    batches.on_second = lambda rows: marked.append(_wait_until_marked(rows))  # the deadline passes meanwhile

    async def main():
        async def deadline():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(decoder.agenerate(PROMPTS[TARGET], **OVERRIDES), 1.0)

        others = [decoder.agenerate(PROMPTS[i], **OVERRIDES) for i in OTHERS]
        results = await asyncio.wait_for(asyncio.gather(deadline(), *others), BOUND_S)
        return results[1:]

    releaser = held_back(decoder.lm, 4)
    outputs = asyncio.run(main())
    releaser.join(BOUND_S)
    _after_cancel(decoder, batches, marked[0], single, outputs)


def test_a_cancelled_chat_model_call_takes_its_row_out(decoder, batches):
    from nest_integrations.langchain import ChatNest

    chat = ChatNest.from_decoder(decoder, nest_config=decoder.config.updated(**OVERRIDES))
    single = _one_by_one(decoder, [[{"role": "user", "content": p}] for p in PROMPTS[:4]], **OVERRIDES)
    batches.rows.clear()
    marked = []

    async def main():
        loop = asyncio.get_running_loop()
        target = asyncio.ensure_future(chat.ainvoke(PROMPTS[TARGET]))

        def cancel(rows):
            loop.call_soon_threadsafe(target.cancel)
            marked.append(_wait_until_marked(rows))

        batches.on_second = cancel
        others = await asyncio.wait_for(asyncio.gather(*(chat.ainvoke(PROMPTS[i]) for i in OTHERS)), BOUND_S)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(target, BOUND_S)
        return others

    releaser = held_back(decoder.lm, 4)
    messages = asyncio.run(main())
    releaser.join(BOUND_S)
    assert [m.text for m in messages] == [single[i].text for i in OTHERS]
    assert len(batches.rows[1]) == 4
    assert all(marked[0] not in rows for rows in batches.rows[2:])
    _drained(decoder)


def test_a_listener_that_raises_fails_its_row_only(decoder):
    """Whatever resolving one row raises, its caller gets it and the worker serves on."""
    single = _one_by_one(decoder, PROMPTS[:4], **OVERRIDES)

    class Exploding(RowListener):
        def __init__(self, where):
            self.where, self.error = where, None

        def progress(self, row):
            if self.where == "progress":
                raise RuntimeError("consumer broke while reading progress")

        def finished(self, row, output):
            raise RuntimeError("consumer broke while taking the output")

        def failed(self, row, error):
            self.error = error
            raise RuntimeError("and again while told of it")

    service = shared_service(decoder.shared_lm)
    config = decoder._call_config(OVERRIDES)
    releaser = held_back(decoder.lm, 4)
    futures = [service.submit(decoder.prepare_row(PROMPTS[i], None, None, config)) for i in OTHERS[:2]]
    broken = [decoder.prepare_row(PROMPTS[i], None, None, config) for i in (TARGET, OTHERS[2])]
    listeners = [Exploding("progress"), Exploding("finished")]
    for row, listener in zip(broken, listeners):
        row.listener = listener
        service._enqueue(row)
    releaser.join(BOUND_S)
    _same([f.result(timeout=BOUND_S) for f in futures], [single[i] for i in OTHERS[:2]])
    deadline = time.monotonic() + BOUND_S
    while any(listener.error is None for listener in listeners) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "progress" in str(listeners[0].error) and "output" in str(listeners[1].error)
    assert service._worker is None or service._worker.is_alive()
    assert decoder.generate(PROMPTS[0], **OVERRIDES).text == single[0].text


def test_a_row_whose_decisions_raise_fails_alone(decoder, monkeypatch):
    single = _one_by_one(decoder, PROMPTS[:4], **OVERRIDES)
    accept = SpanVerifier.verify
    doomed = {}

    def flaky(self, gen, *args):
        if gen is doomed.get("gen"):
            raise RuntimeError("a bug in one row's verification")
        return accept(self, gen, *args)

    monkeypatch.setattr(SpanVerifier, "verify", flaky)
    service = shared_service(decoder.shared_lm)
    config = decoder._call_config(OVERRIDES)
    rows = [decoder.prepare_row(PROMPTS[i], None, None, config) for i in range(4)]
    doomed["gen"] = rows[TARGET].gen
    releaser = held_back(decoder.lm, 4)
    futures = [service.submit(row) for row in rows]
    releaser.join(BOUND_S)
    with pytest.raises(RuntimeError, match="one row's verification"):
        futures[TARGET].result(timeout=BOUND_S)
    _same([futures[i].result(timeout=BOUND_S) for i in OTHERS], [single[i] for i in OTHERS])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_worker_is_replaced(decoder, monkeypatch):
    """Should the worker thread ever die with rows queued, a new one takes them over."""
    service = shared_service(decoder.shared_lm)
    service.close()
    serve = type(service)._serve
    deaths = []

    def dies_once(self):
        if not deaths:
            deaths.append(threading.current_thread().name)
            raise SystemExit("the worker thread died")
        return serve(self)

    monkeypatch.setattr(type(service), "_serve", dies_once)
    future = decoder.submit(PROMPTS[0], **OVERRIDES)
    assert future.result(timeout=BOUND_S).text == _one_by_one(decoder, PROMPTS[:1], **OVERRIDES)[0].text
    assert deaths, "the first worker died"
