"""Concurrent callers served together: one running batch per LM.

Threads calling ``decoder.generate`` / ``decoder.stream`` at once, asyncio tasks
awaiting ``decoder.agenerate`` / ``decoder.astream``, LangChain ``batch`` /
``abatch`` and LlamaIndex's async calls all hand their prepared rows
(:meth:`NestDecoder.prepare_row`: retrieval, gate and candidates, in the caller's
own thread) to the :class:`BatchingService` of their LM. One worker thread runs a
:class:`~nest_integrations.decoding.batching.RowScheduler`: a row joins the running batch
at its next step, so a caller arriving while others decode does not wait for
them to finish, and a caller alone decodes as before (a batch of one).

The worker starts with the first row and ends after ``idle_s`` seconds without
work. It is kept between calls because torch's CPU thread pool belongs to the
thread that runs the ops: a fresh thread per call builds a fresh pool while the
last one's threads still spin, which made one-by-one calls measurably slower
(docs/serving.md, Concurrent callers). At
interpreter exit the rows in flight finish and every worker ends, those of LMs released
earlier too.

A service belongs to an LM *and* a key layer (rows of one forward read their keys
at one layer), given when it is made (:class:`~nest_integrations.decoding.batching.SharedLM`);
decoders over other datastores or with other configs share it.

Models that cannot share a batch (:func:`~nest_integrations.decoding.batching.supports_batching`)
get a :class:`OneByOneService` instead, with the same methods: each row decodes alone, in the
caller's thread (in a worker thread for asyncio callers).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import weakref
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Optional, Sequence, Union

from .batching import Row, RowListener, RowScheduler, SharedLM, batched_generate, run_rows
from .generation import StreamChunk, StreamCursor

if TYPE_CHECKING:  # pragma: no cover
    from .output import NestOutput

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_BATCH", "BatchingService", "OneByOneService", "shared_service"]

IDLE_SECONDS = 30.0
"""How long a worker waits for new rows before its thread ends."""

DEFAULT_MAX_BATCH = 16
"""Rows sharing a forward at most. Every row holds its own KV columns (``2 x layers x
key/value heads x head size`` floats per token: 46,080 B in float32 on the default 135M
model), so the cache grows with rows x tokens (docs/serving.md, Concurrent callers, gives
it at this bound); more callers wait and join as rows finish."""

_registry_lock = threading.Lock()  # guards the two sets below; held for nothing else
_every_service: "weakref.WeakSet[BatchingService]" = weakref.WeakSet()
"""Every service alive: a service whose LM was released lives on until its worker ends."""
_every_worker: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
"""Every worker thread not yet gone, one that is freeing its service's tensors as it ends too."""


class BatchingService:
    """A queue of prepared rows and the worker thread that decodes them in shared batches.

    Thread-safe: any thread may :meth:`submit` or :meth:`stream`.

    Args:
        shared: the LM (and key layer) every row runs on.
        max_batch: rows sharing a forward at most (>= 1).
        idle_s: seconds the worker thread waits for work before it ends (> 0).
    """

    def __init__(self, shared: SharedLM, max_batch: int = DEFAULT_MAX_BATCH, idle_s: float = IDLE_SECONDS):
        if not idle_s > 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s}")
        self._scheduler = RowScheduler(shared, max_batch=max_batch)
        self.idle_s = float(idle_s)
        self._lock = threading.Lock()  # guards the queue's emptiness and the worker's start and end
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._worker: Optional[threading.Thread] = None
        with _registry_lock:
            _every_service.add(self)

    @property
    def pending(self) -> int:
        """Rows queued or decoding now."""
        return len(self._scheduler)

    @property
    def max_batch(self) -> int:
        return self._scheduler.max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:
        if int(value) < 1:
            raise ValueError(f"max_batch must be >= 1, got {value}")
        self._scheduler.max_batch = int(value)

    def submit(self, row: Row) -> "Future[NestOutput]":
        """Queue ``row``; the future resolves to its output (or raises its error).
        Cancelling the future (directly, or an asyncio task awaiting it through
        ``asyncio.wrap_future``) takes the row out of the batch at its next step."""
        future: "Future[NestOutput]" = Future()
        row.listener = _Resolve(future)

        def leave_if_cancelled(done: "Future[NestOutput]") -> None:
            if done.cancelled():
                row.cancelled = True

        future.add_done_callback(leave_if_cancelled)
        self._enqueue(row)
        return future

    async def aresult(self, row: Row) -> "NestOutput":
        """:meth:`submit` for asyncio: awaits the output without a thread waiting; cancelling the
        awaiting task takes the row out of the batch at its next step."""
        return await asyncio.wrap_future(self.submit(row))

    def run_batch(self, rows: Sequence[Row], max_batch: int) -> "list[NestOutput]":
        """Decode ``rows`` in a batch of their own in this thread, ``max_batch`` sharing each
        forward at most (:func:`~nest_integrations.decoding.batching.batched_generate`)."""
        return batched_generate(rows, self._scheduler.shared, max_batch=max_batch)

    def stream(self, row: Row) -> Iterator[StreamChunk]:
        """Queue ``row`` and yield its chunks as they are accepted (the last one carries
        the output). Closing the iterator early cancels the row."""
        chunks: "queue.SimpleQueue[Union[StreamChunk, BaseException, None]]" = queue.SimpleQueue()
        row.listener = _Forward(row, chunks.put)
        self._enqueue(row)
        try:
            while (item := chunks.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            row.cancelled = True  # a no-op once the row finished

    async def astream(self, row: Row) -> AsyncIterator[StreamChunk]:
        """:meth:`stream` for asyncio: the chunks reach the event loop without a thread waiting."""
        loop = asyncio.get_running_loop()
        chunks: "asyncio.Queue[Union[StreamChunk, BaseException, None]]" = asyncio.Queue()
        row.listener = _Forward(row, lambda item: loop.call_soon_threadsafe(chunks.put_nowait, item))
        self._enqueue(row)
        try:
            while (item := await chunks.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            row.cancelled = True

    # ------------------------------------------------------------------ worker
    def close(self) -> None:
        """Let the rows in flight finish, then end the worker (a later row starts a new one)."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join()

    def _enqueue(self, row: Row) -> None:
        with self._lock:
            self._scheduler.add(row)
            self._closing = False
            if self._worker is None:
                self._start_worker()
            self._wake.notify()

    def _start_worker(self) -> None:
        """Start the worker thread; the caller holds ``_lock``."""
        self._worker = threading.Thread(target=self._work, name="nest-batching", daemon=True)
        with _registry_lock:
            _every_worker.add(self._worker)
        self._worker.start()

    def _work(self) -> None:
        try:
            self._serve()
        finally:
            # Normally the queue is empty here. Should the worker ever die with rows
            # still queued, a new one takes them over rather than leaving them waiting.
            with self._lock:
                self._worker = None
                if self._scheduler.busy:
                    logger.error("the batching worker stopped with %d rows pending; starting a new one", self.pending)
                    self._start_worker()

    def _serve(self) -> None:
        scheduler = self._scheduler
        while True:
            with self._lock:
                if not scheduler.busy:
                    self._wake.wait_for(lambda: scheduler.busy or self._closing, timeout=self.idle_s)
                if not scheduler.busy:  # idle for idle_s, or closing
                    return
            try:
                scheduler.step()
            except BaseException as error:  # a bug in the shared step itself: fail the batch, keep serving
                logger.exception("batched decoding step failed; failing %d rows", len(scheduler.active))
                scheduler.fail_all(error)


class _Resolve(RowListener):
    """Resolves a future with the row's output or error."""

    def __init__(self, future: "Future[NestOutput]"):
        self.future = future

    def finished(self, row: Row, output: "NestOutput") -> None:
        try:
            self.future.set_result(output)
        except InvalidStateError:  # cancelled by its caller meanwhile: nobody waits for it
            pass

    def failed(self, row: Row, error: BaseException) -> None:
        try:
            self.future.set_exception(error)
        except InvalidStateError:
            pass


class _Forward(RowListener):
    """Hands a row's stream chunks to ``put``: chunks, then None at the end, or the error."""

    def __init__(self, row: Row, put: Callable[[Any], None]):
        self.cursor = StreamCursor(row.speculation.passages)
        self.put = put

    def progress(self, row: Row) -> None:
        chunk = self.cursor.advance(row.gen)
        if chunk is not None:
            self.put(chunk)

    def finished(self, row: Row, output: "NestOutput") -> None:
        self.put(self.cursor.last(output))
        self.put(None)

    def failed(self, row: Row, error: BaseException) -> None:
        self.put(error)


_services: dict[tuple[int, str], BatchingService] = {}
_services_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    """Finish the rows in flight and wait for every worker to end before the interpreter
    finalizes: a daemon thread still running then is killed where it stands, and killed inside
    torch (a forward, or freeing its batch's tensors as it ends) it aborts the process. The
    services of LMs released earlier are closed too, so their workers need not wait out ``idle_s``."""
    with _registry_lock:
        services, workers = list(_every_service), list(_every_worker)
    for service in services:
        service.close()
    for worker in workers:
        worker.join()


def shared_service(shared: SharedLM) -> BatchingService:
    """The service of ``shared``'s LM and key layer (made on first use, dropped with the LM):
    every decoder of that LM and key layer gets the same one (``decoder.shared_lm``)."""
    lm = shared.lm
    key = (id(lm), shared.reader.key_layer)
    with _services_lock:
        service = _services.get(key)
        if service is None:
            service = _services[key] = BatchingService(shared)
            weakref.finalize(lm, _services.pop, key, None)
        return service


class OneByOneService:
    """:class:`BatchingService`'s methods for a model whose rows cannot share a batch (sliding-window
    or chunked attention, an attention kernel without 4-D masks): each row decodes alone, as a
    batch of one, in the calling thread (in a worker thread for :meth:`aresult` and
    :meth:`astream`). One step loop serves both (:func:`~nest_integrations.decoding.batching.run_rows`).

    Args:
        shared: the LM the rows run on.
    """

    def __init__(self, shared: SharedLM):
        self.shared = shared

    def submit(self, row: Row) -> "Future[NestOutput]":
        """Decode ``row`` now; the returned future holds its output (or its error)."""
        future: "Future[NestOutput]" = Future()
        try:
            future.set_result(self.run_batch([row], 1)[0])
        except Exception as error:
            future.set_exception(error)
        return future

    async def aresult(self, row: Row) -> "NestOutput":
        """Decode ``row`` in a worker thread, so the event loop goes on meanwhile."""
        return (await asyncio.to_thread(self.run_batch, [row], 1))[0]

    def run_batch(self, rows: Sequence[Row], max_batch: int) -> "list[NestOutput]":
        """Decode ``rows`` one after another in this thread (``max_batch`` is ignored: one row per forward)."""
        return batched_generate(rows, self.shared, max_batch=1)

    def stream(self, row: Row) -> Iterator[StreamChunk]:
        """Decode ``row`` in this thread, yielding its chunks as they are accepted (the last one
        carries the output). Closing the iterator early abandons the row."""
        cursor = StreamCursor(row.speculation.passages)
        for _ in run_rows([row], self.shared, max_batch=1):
            if (chunk := cursor.advance(row.gen)) is not None:
                yield chunk
        if row.error is not None:
            raise row.error
        assert row.output is not None
        yield cursor.last(row.output)

    async def astream(self, row: Row) -> AsyncIterator[StreamChunk]:
        """:meth:`stream` stepped in a worker thread, one chunk at a time."""
        chunks, done = self.stream(row), object()
        while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
            yield chunk  # type: ignore[misc]
