"""Server-side batching: requests that arrive together share one forward pass.

Every prediction runs on one inference thread (torch uses the worker's cores inside it), so the
event loop stays free to answer `/ping` and read requests while the model works. While it works,
new requests queue up; when it is free it takes everything queued (up to `max_batch` texts, and
waiting at most `max_delay` for more when the queue is short), merges requests that share their
parameters, and splits the answers back. A request with more texts than `max_batch` is cut into
several batches. The model call itself sorts a batch by length so that it pads little.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

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

    def __init__(
        self,
        predict: Callable[[list[Any], dict[str, Any]], list[Any]],
        executor: ThreadPoolExecutor,
        max_batch: int = 32,
        max_delay: float = 0.002,
    ) -> None:
        self.predict, self.executor = predict, executor
        self.max_batch, self.max_delay = max_batch, max_delay
        self.queue: asyncio.Queue[tuple[_Request, int, int]] = asyncio.Queue()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="byoc-batcher")

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def submit(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        """Queue one request's inputs; return its results in order."""
        request = _Request(inputs, parameters, asyncio.get_running_loop().create_future())
        request.results = [None] * len(inputs)
        chunks = range(0, len(inputs), self.max_batch)
        request.pending = len(chunks)
        for start in chunks:
            self.queue.put_nowait((request, start, min(start + self.max_batch, len(inputs))))
        return await request.future

    async def _run(self) -> None:
        while True:
            first = await self.queue.get()
            batch, size = [first], first[2] - first[1]
            deadline = time.monotonic() + self.max_delay
            while size < self.max_batch:
                try:
                    item = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self.queue.get(), left)
                    except asyncio.TimeoutError:
                        break
                if size + item[2] - item[1] > self.max_batch:
                    self.queue.put_nowait(item)  # goes into the next batch (order within a request does not matter)
                    break
                batch.append(item)
                size += item[2] - item[1]
            await self._run_batch(batch)

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
                request.results[start:end] = results[offset : offset + end - start]
                offset += end - start
                request.pending -= 1
                if request.pending == 0 and not request.future.done():
                    request.future.set_result(request.results)
