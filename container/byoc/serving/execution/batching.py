"""Server-side batching: requests that arrive together share one forward pass.

Every prediction runs on one inference thread (torch uses the worker's cores inside it), so the
event loop stays free to answer `/ping` and read requests while the model works. While it works,
new requests queue up; when it is free it takes what is queued (up to `max_batch` inputs, waiting
at most `max_delay` for more when the queue is short), merges requests that share their
parameters, and splits the answers back. The model call itself sorts a batch by length so that it
pads little.

The wait, unless set (`max_delay`): none for a lone client, whose request runs at once. Under
concurrent load (the last batch merged several requests) a batch not yet full waits for the
clients the last batch answered: until it holds as many requests as were in flight when that batch
ended (the ones it answered, and those waiting then), for at most 30% of the last batch's
inference time, 1 to 5 ms (a shorter window rarely catches a client's next request). Closed-loop
clients otherwise settle into two halves taking turns at the model; one larger batch runs faster a
text and sorts by length into fuller passes, and stopping once they are all back wastes no wait.
MiniLM embeddings on ONNX Runtime, 2 cores, 1 text a request from 32 clients: 6% more texts a
second than a wait of a fixed share (3-9% in three runs; docs/serving.md, Batching).

Many clients share it, so no client can hurt the others:
- Fair: a request with more inputs than `max_batch` is cut into chunks, and waiting requests take
  turns: each batch takes at most one chunk of a request, which then goes behind every other
  waiting request. A small request waits for one chunk of each big one, not for all of them.
- Bounded: at most `max_queued` inputs wait; beyond that `submit` raises `QueueFull` at once.
- Isolated: when a merged batch fails (an exception, or not one answer per input), its requests
  run again one at a time, so that only the faulty one fails, with its own error.
- Contained: nothing a `predict` does (a `BaseException`, a wrong answer) ends the batching task.
  If it ends anyway (a bug here), every waiting request fails at once and `on_death` is called.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from byoc.serving.protocol import outputs

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """More inputs are waiting than the queue holds: the request is refused at once (503)."""


class BatcherStopped(Exception):
    """The batching task is not running (it ended, or the server is stopping): 503."""


class HandlerFailed(RuntimeError):
    """A handler raised something that is not an Exception (SystemExit, KeyboardInterrupt...), or a
    batchable predict did not return one answer per input: a fault of the handler code (500)."""


class Observer(Protocol):
    """What the batcher reports as it works (byoc.serving.prometheus.ModelMetrics, or nothing)."""

    def waited(self, seconds: float) -> None: ...  # a request, from its arrival to its first batch

    def ran(self, inputs: int, seconds: float) -> None: ...  # one predict call, in the inference thread

    def queued(self, inputs: int) -> None: ...  # inputs waiting now


class Unobserved:
    """An observer that reports nowhere (a batcher outside a server: tests, tools)."""

    def waited(self, seconds: float) -> None:
        pass

    def ran(self, inputs: int, seconds: float) -> None:
        pass

    def queued(self, inputs: int) -> None:
        pass


@dataclass(eq=False)
class _Request:
    inputs: list[Any]
    parameters: dict[str, Any]
    shape: str | None  # the answer's shape, from the body's form (byoc.serving.protocol.bodies): part of the key
    key: object  # requests with equal keys share a predict call
    future: asyncio.Future
    arrived: float  # time.perf_counter() at submit
    results: list[Any] = field(default_factory=list)
    next: int = 0  # the first input not yet taken into a batch
    pending: int = 0  # chunks taken and not answered yet


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a handler in the inference thread; a BaseException it raises comes back as HandlerFailed
    (a SystemExit carried to the event loop would stop the server, a CancelledError would look like
    the batcher being stopped)."""
    try:
        return fn(*args)
    except Exception:
        raise
    except BaseException as err:
        raise HandlerFailed(f"the handler raised {type(err).__name__}: {err}") from err


def timed(observer: Observer, inputs: int, fn: Callable[..., Any], *args: Any) -> Any:
    """`guarded(fn, *args)`, its duration reported as one model call of `inputs` inputs. Timed in the
    inference thread itself: a wait for it (another model's batch) is queueing, not inference."""
    started = time.perf_counter()
    try:
        return guarded(fn, *args)
    finally:
        observer.ran(inputs, time.perf_counter() - started)


def parameters_key(parameters: dict[str, Any], shape: str | None = None) -> object:
    try:
        return repr((shape, sorted(parameters.items())))
    except (TypeError, RecursionError):  # keys that do not sort, parameters nested too deeply
        return object()  # a key of its own: the request is never merged


WAIT_SHARE, WAIT_MIN, WAIT_MAX = 0.3, 0.001, 0.005  # the adaptive wait (above): share of a batch's time, bounds


def adaptive_delay(requests: int, seconds: float) -> float:
    """How long the next batch waits for more requests, after a batch that merged `requests` requests
    and ran `seconds`: nothing for a lone client, or where the window would be under WAIT_MIN."""
    if requests < 2:
        return 0.0
    delay = min(WAIT_MAX, WAIT_SHARE * seconds)
    return delay if delay >= WAIT_MIN else 0.0


class Batcher:
    """Collects requests into batches and runs `predict(inputs, parameters, shape) -> results` on them
    (`shape`: the requests' answer shape, None for one answer per input; only requests of one shape and
    equal parameters share a call)."""

    def __init__(
        self,
        predict: Callable[[list[Any], dict[str, Any], str | None], list[Any]],
        executor: Executor,
        max_batch: int,  # the server passes ServeSettings.max_batch (BYOC_MAX_BATCH_SIZE): one default, there
        max_delay: float | None = None,  # seconds a short batch waits for more; None: adaptive_delay
        max_queued: int = 1 << 30,
        on_death: Callable[[str], None] | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.predict, self.executor = predict, executor
        self.observer: Observer = observer or Unobserved()
        self.max_batch, self.max_delay, self.max_queued = max_batch, max_delay, max_queued
        self.on_death = on_death
        self.waiting: deque[_Request] = deque()
        self.queued = 0  # inputs of waiting requests not yet taken into a batch
        self.running: list[_Request] = []  # the requests of the batch being predicted
        self.task: asyncio.Task | None = None
        self.death: str | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        # The last batch's requests and seconds (adaptive_delay), and the requests in flight when it
        # ended: those it answered and those waiting then (how many the adaptive wait waits for).
        self._last = (0, 0.0, 0)

    @property
    def idle(self) -> bool:
        return not self.waiting

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        self._wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(), name="byoc-batcher")
        self.task.add_done_callback(self._ended)

    async def stop(self) -> None:
        self._stopping = True
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def check_room(self) -> None:
        """QueueFull where no request could join the queue now (it holds `max_queued` inputs already):
        checked before a request's body is parsed, so that a refused request costs nothing."""
        if self.queued >= self.max_queued:
            raise QueueFull(f"{self.queued} inputs are waiting for the model")

    async def submit(self, inputs: list[Any], parameters: dict[str, Any], shape: str | None = None) -> list[Any]:
        """Queue one request's inputs; return its results in order."""
        if not self.alive or self._wake is None:
            raise BatcherStopped(self.death or "the server is stopping")
        if self.queued + len(inputs) > self.max_queued:
            raise QueueFull(f"{self.queued} inputs are waiting for the model, and this request has {len(inputs)}")
        future = asyncio.get_running_loop().create_future()
        key = parameters_key(parameters, shape)
        request = _Request(inputs, parameters, shape, key, future, time.perf_counter(), [None] * len(inputs))
        self.waiting.append(request)
        self.queued += len(inputs)
        self.observer.queued(self.queued)
        self._wake.set()
        try:
            return await future
        finally:
            if request.next < len(request.inputs):  # it failed or left (timeout, disconnect): drop the rest
                self._drop(request)

    def _drop(self, request: _Request) -> None:
        try:
            self.waiting.remove(request)
        except ValueError:
            return
        self.queued -= len(request.inputs) - request.next
        self.observer.queued(self.queued)

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            await self._run_batch(batch)

    async def _collect(self) -> list[tuple[_Request, int, int]]:
        """The next batch: requests in turn, each giving one chunk, while they fit in max_batch."""
        assert self._wake is not None
        while not self.waiting:
            self._wake.clear()
            await self._wake.wait()
        batch: list[tuple[_Request, int, int]] = []
        requests, seconds, in_flight = self._last
        if self.max_delay is None:  # wait for the clients the last batch answered, not beyond their number
            delay, enough = adaptive_delay(requests, seconds), in_flight
        else:  # a fixed wait: until the batch is full
            delay, enough = self.max_delay, None
        size, deadline = 0, time.monotonic() + delay
        while size < self.max_batch:
            if self.waiting:
                request = self.waiting[0]
                if request.future.done():  # failed or left: nothing more to do for it
                    self._drop(request)
                    continue
                take = min(len(request.inputs) - request.next, self.max_batch)
                if size + take > self.max_batch:
                    break  # it heads the next batch
                self.waiting.popleft()
                if request.next == 0:
                    self.observer.waited(time.perf_counter() - request.arrived)
                batch.append((request, request.next, request.next + take))
                request.next += take
                request.pending += 1
                self.queued -= take
                size += take
                if request.next < len(request.inputs):
                    self.waiting.append(request)  # its next chunk comes after every other waiting request
                continue
            left = deadline - time.monotonic()
            if left <= 0 or (enough is not None and len(batch) >= enough):
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except asyncio.TimeoutError:
                break
        self.observer.queued(self.queued)
        return batch

    async def _run_batch(self, batch: list[tuple[_Request, int, int]]) -> None:
        groups: dict[object, list[tuple[_Request, int, int]]] = {}
        for item in batch:
            groups.setdefault(item[0].key, []).append(item)
        self.running = [request for request, _, _ in batch]  # kept if the task dies here: _ended fails them
        started = time.perf_counter()
        for items in groups.values():
            live = [item for item in items if not item[0].future.done()]  # skip requests that failed or left
            if live:
                await self._predict(live, isolate=len(live) > 1)
        self.running = []
        answered = sum(1 for request, _, _ in batch if request.future.done())  # the rest wait for more chunks
        self._last = (len(batch), time.perf_counter() - started, answered + len(self.waiting))

    async def _predict(self, items: list[tuple[_Request, int, int]], isolate: bool) -> None:
        inputs = [x for request, start, end in items for x in request.inputs[start:end]]
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.executor,
                timed,
                self.observer,
                len(inputs),
                self.predict,
                inputs,
                items[0][0].parameters,
                items[0][0].shape,
            )
            if not isinstance(results, (list, tuple)) or len(results) != len(inputs):
                raise HandlerFailed(
                    f"predict_fn returned {_describe(results)} for {len(inputs)} inputs: a batchable "
                    "predict_fn returns a list with one answer per input, in order"
                )
        except asyncio.CancelledError:
            raise  # the batcher is stopping
        except Exception as err:
            if isolate:  # find the faulty request: each runs alone, and only its own fault fails it
                logger.info("a batch of %d requests failed (%s); running them one at a time", len(items), err)
                for item in items:
                    if not item[0].future.done():
                        await self._predict([item], isolate=False)
                return
            for request, _, _ in items:
                if not request.future.done():
                    request.future.set_exception(err)
            return
        offset = 0
        kind = outputs.kind_of(results)  # (a predict_fn's answers that say their kind keep it, request by request)
        for request, start, end in items:
            if kind is not None and not isinstance(request.results, outputs.Answers):
                request.results = outputs.Answers(request.results, kind)
            request.results[start:end] = results[offset : offset + end - start]
            offset += end - start
            request.pending -= 1
            if request.pending == 0 and request.next == len(request.inputs) and not request.future.done():
                request.future.set_result(request.results)

    def _ended(self, task: asyncio.Task) -> None:
        """The batching task ended. Asked to (stop): nothing to do. Otherwise it died: say why, fail
        every request it holds (they would wait for their timeout), and tell the server."""
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        self.death = f"the batching task ended: {type(error).__name__}: {error}" if error else "the batching task ended"
        logger.error("%s; requests can no longer be batched", self.death, exc_info=error)
        for request in [*self.running, *self.waiting]:
            if not request.future.done():
                request.future.set_exception(BatcherStopped(self.death))
        self.waiting.clear()
        self.queued = 0
        self.observer.queued(0)
        if self.on_death is not None:
            self.on_death(self.death)


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"{len(value)} answers"
    return f"a {type(value).__name__}"
