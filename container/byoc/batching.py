"""Server-side batching: requests that arrive together share one forward pass.

Predictions run on `lanes` inference threads (one per core by default), so the event loop stays
free to answer `/ping` and read requests while the model works. While they work, new requests
queue up; a lane that is free takes everything queued (up to `max_batch` texts, and waiting at
most `max_delay` for more when the queue is short), merges requests that share their parameters,
and splits the answers back. A request is cut into pieces of at most `max_batch` texts, and into
one piece per lane when it arrives alone, so that it never waits on one core while others idle.
The model call itself sorts a batch by length so that it pads little.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger("byoc.batching")


@dataclass
class _Request:
    inputs: list[Any]
    parameters: dict[str, Any]
    future: asyncio.Future
    results: list[Any] = field(default_factory=list)
    pending: int = 0  # chunks not answered yet


class Batcher:
    """Collects requests into batches and runs `predict(inputs, parameters) -> results` on them."""

    def __init__(self, predict: Callable[[list[Any], dict[str, Any]], list[Any]], executor: ThreadPoolExecutor,
                 max_batch: int = 32, max_delay: float = 0.002, lanes: int = 1) -> None:
        self.predict, self.executor = predict, executor
        self.max_batch, self.max_delay, self.lanes = max_batch, max_delay, max(1, lanes)
        self.queue: asyncio.Queue[tuple[_Request, int, int]] = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.idle = 0  # lanes waiting for work
        self.queued = 0  # texts in the queue

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._run(), name=f"byoc-batcher-{lane}") for lane in range(self.lanes)]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def submit(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        """Queue one request's inputs; return its results in order."""
        request = _Request(inputs, parameters, asyncio.get_running_loop().create_future())
        request.results = [None] * len(inputs)
        piece = min(self.max_batch, -(-len(inputs) // max(1, self.idle)))
        chunks = range(0, len(inputs), piece)
        request.pending = len(chunks)
        for start in chunks:
            self._put((request, start, min(start + piece, len(inputs))))
        return await request.future

    async def _run(self) -> None:
        while True:
            self.idle += 1
            try:
                first = self._took(await self.queue.get())
            finally:
                self.idle -= 1
            batch, size = [first], first[2] - first[1]
            # Leave a share of what is queued to the lanes that are idle as well.
            limit = min(self.max_batch, -(-self.queued // (1 + self.idle)) + size)
            deadline = time.monotonic() + self.max_delay
            while size < limit:
                try:
                    item = self._took(self.queue.get_nowait())
                except asyncio.QueueEmpty:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        item = self._took(await asyncio.wait_for(self.queue.get(), left))
                    except asyncio.TimeoutError:
                        break
                if size + item[2] - item[1] > limit:
                    self._put(item)  # goes into the next batch (order within a request does not matter)
                    break
                batch.append(item)
                size += item[2] - item[1]
            await self._run_batch(batch)

    def _put(self, item: tuple[_Request, int, int]) -> None:
        self.queue.put_nowait(item)
        self.queued += item[2] - item[1]

    def _took(self, item: tuple[_Request, int, int]) -> tuple[_Request, int, int]:
        self.queued -= item[2] - item[1]
        return item

    async def _run_batch(self, batch: list[tuple[_Request, int, int]]) -> None:
        groups: dict[str, list[tuple[_Request, int, int]]] = defaultdict(list)
        for item in batch:
            groups[repr(sorted(item[0].parameters.items()))].append(item)
        loop = asyncio.get_running_loop()
        for items in groups.values():
            live = [item for item in items if not item[0].future.done()]  # skip requests that failed or left
            if not live:
                continue
            inputs = [x for request, start, end in live for x in request.inputs[start:end]]
            try:
                results = await loop.run_in_executor(self.executor, self.predict, inputs, live[0][0].parameters)
            except Exception as err:  # the error belongs to these requests, not to the batcher
                for request, _, _ in live:
                    if not request.future.done():
                        request.future.set_exception(err)
                continue
            offset = 0
            for request, start, end in live:
                request.results[start:end] = results[offset:offset + end - start]
                offset += end - start
                request.pending -= 1
                if request.pending == 0 and not request.future.done():
                    request.future.set_result(request.results)
