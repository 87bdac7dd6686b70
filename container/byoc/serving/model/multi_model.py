"""Many models in one server: SageMaker's multi-model endpoint (MME) contract for custom containers.

SageMaker loads and unloads models in the container as traffic asks (`POST /models` with
`{"model_name", "url"}`, `GET /models` with `next_page_token` / `nextPageToken` pagination,
`GET /models/{name}`, `DELETE /models/{name}`, `POST /models/{name}/invoke`); 409 answers a model
loaded already, 507 a load the container has no memory for (SageMaker then unloads idle models and
tries again). `model_name` is opaque; the invoker's `TargetModel` arrives as the
`X-Amzn-SageMaker-Target-Model` header, for the logs.

Each model is a `ModelServer` of its own: its handlers (its own `code/inference.py`, imported under
a name of its own), its labels, its batcher. All share one inference thread: every model's batcher
has at most one batch in that thread's queue, which serves them in turn, so a hot model cannot starve
a cold one, and the cores are never split between models that run at once. Loads run on a thread of
their own, one at a time (their memory is measured), while /ping and every other model answer.

Memory: a load is refused with 507 before it allocates when the estimate from the model's files
(weights, graph, tokenizer) would pass the budget (`BYOC_MULTI_MODEL_MEMORY_MB`, by default the
container's memory limit less headroom for the server), and after it when the resident memory it
really took passes it. `DELETE` gives the memory back (malloc_trim). A request to a model being
unloaded is answered, or gets a 404 once it is gone; never a 500.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from byoc import model_folder, onnx_graph
from byoc.serving.model.model_server import ModelServer, release_memory, resident_bytes
from byoc.serving.model.threads import DaemonThreads
from byoc.serving.settings import ServeSettings

logger = logging.getLogger(__name__)

MIB = 1 << 20
PAGE_SIZE = 100  # models per GET /models page when the request names no `limit`
SESSION_OVERHEAD = 24 * MIB  # a session's own buffers, the handlers' state: beyond the files' bytes


class LoadRefused(Exception):
    """A load the server refuses: `status` is the answer's (400, 404, 409, 500, 507)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Entry:
    name: str
    url: str
    server: ModelServer
    memory: int  # bytes this model is accounted for: max(estimate, what loading it really took)
    in_flight: int = 0  # invocations being answered
    unloading: bool = False


def estimate_bytes(folder: Path, int8: bool = False) -> int:
    """Memory a model folder takes once loaded, from its files: the weights (or the int8 graph, which
    holds its own), the tokenizer (about three times its file in memory), a session's overhead."""
    weights = folder / (
        onnx_graph.INT8_GRAPH if int8 and (folder / onnx_graph.INT8_GRAPH).exists() else model_folder.WEIGHTS
    )
    tokenizer = folder / model_folder.TOKENIZER
    size = lambda path: path.stat().st_size if path.exists() else 0
    return size(weights) + 3 * size(tokenizer) + SESSION_OVERHEAD


class Registry:
    """The loaded models by name, their memory, and the one thread they all infer on."""

    def __init__(self, settings: ServeSettings, budget: int, on_death: Callable[[str], None]) -> None:
        self.settings, self.budget, self.on_death = settings, budget, on_death
        self.entries: dict[str, Entry] = {}
        self.executor = DaemonThreads(1, "byoc-inference")  # every model's: they take turns
        self.handler_threads = DaemonThreads(settings.max_concurrency, "byoc-handler")
        self.loader = DaemonThreads(1, "byoc-loader")
        self._loading: set[str] = set()
        self._load_lock = asyncio.Lock()

    async def warm_up(self) -> None:
        """Import the runtime before the first load, so that what the first model takes is measured
        as the model's and not as the import's (tens of MiB of ONNX Runtime)."""
        async with self._load_lock:
            await asyncio.get_running_loop().run_in_executor(self.loader, _import_runtime)

    @property
    def used(self) -> int:
        return sum(entry.memory for entry in self.entries.values())

    def describe(self, entry: Entry) -> dict[str, str]:
        return {"modelName": entry.name, "modelUrl": entry.url}

    def page(self, token: str | None, limit: int) -> dict[str, Any]:
        """One page of the loaded models, by name; `nextPageToken` where more follow."""
        names = sorted(name for name, entry in self.entries.items() if not entry.unloading)
        start = int(token) if token and token.isdigit() else 0
        chosen = names[start : start + limit]
        page: dict[str, Any] = {"models": [self.describe(self.entries[name]) for name in chosen]}
        if start + limit < len(names):
            page["nextPageToken"] = str(start + limit)
        return page

    def get(self, name: str) -> Entry | None:
        entry = self.entries.get(name)
        return None if entry is None or entry.unloading else entry

    async def load(self, name: str, url: str) -> Entry:
        """Load the model folder `url` as `name`; LoadRefused says why not."""
        if name in self.entries or name in self._loading:
            raise LoadRefused(409, f"a model named {name!r} is loaded already: unload it first to load it again")
        folder = Path(url)
        if not folder.is_dir():
            raise LoadRefused(404, f"the model folder {url} does not exist (an unpacked model.tar.gz)")
        self._loading.add(name)
        try:
            async with self._load_lock:  # one at a time: each load's memory is measured alone
                return await self._load(name, url, folder)
        finally:
            self._loading.discard(name)

    async def _load(self, name: str, url: str, folder: Path) -> Entry:
        estimate = estimate_bytes(folder, int8=self.settings.inference.precision == "int8")
        self._check_budget(name, estimate, "would take about")
        settings = replace(self.settings, model_dir=folder)
        server = ModelServer(settings, executor=self.executor, handler_threads=self.handler_threads, name=name)
        before = resident_bytes()
        started = time.monotonic()
        await server.start(self.on_death, loader=self.loader)
        if server.error:
            await server.stop(shared=True)
            raise LoadRefused(500, f"the model {name!r} could not load: {server.error}")
        took = max(estimate, resident_bytes() - before)
        entry = Entry(name, url, server, took)
        try:
            self._check_budget(name, took, "took")
        except LoadRefused:
            await self._drop(entry)
            raise
        self.entries[name] = entry
        logger.info(
            "model %r loaded from %s in %.1f s: %d MiB (%d of %d MiB in use, %d model(s))",
            name,
            url,
            time.monotonic() - started,
            took // MIB,
            self.used // MIB,
            self.budget // MIB,
            len(self.entries),
        )
        return entry

    def _check_budget(self, name: str, size: int, verb: str) -> None:
        if self.used + size > self.budget:
            raise LoadRefused(
                507,
                f"not enough memory for {name!r}: it {verb} {size // MIB} MiB and {self.used // MIB} of the "
                f"{self.budget // MIB} MiB of BYOC_MULTI_MODEL_MEMORY_MB are in use; unload a model first",
            )

    async def unload(self, name: str, wait: float) -> None:
        """Stop taking requests for `name`, let those in flight finish (up to `wait` s), free it."""
        entry = self.get(name)
        if entry is None:
            raise LoadRefused(404, f"no model named {name!r} is loaded")
        entry.unloading = True
        deadline = time.monotonic() + wait
        while entry.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.entries.pop(name, None)
        await self._drop(entry)
        logger.info("model %r unloaded (%d MiB in use, %d model(s))", name, self.used // MIB, len(self.entries))

    async def _drop(self, entry: Entry) -> None:
        await entry.server.stop(shared=True)
        entry.server.forget()
        gc.collect()  # the session and the handlers' module hold cycles: free them now, not later
        release_memory()

    def problem(self) -> str | None:
        """Why no model can be served (/ping 503), or None: a stuck inference call, a dead batcher."""
        for entry in self.entries.values():
            problem = entry.server.problem()
            if problem:
                return f"model {entry.name!r}: {problem}"
        return None

    async def stop(self) -> None:
        for entry in list(self.entries.values()):
            await entry.server.stop(shared=True)
        for pool in (self.executor, self.handler_threads, self.loader):
            pool.shutdown(wait=False, cancel_futures=True)


def _import_runtime() -> None:
    try:
        import onnxruntime  # noqa: F401  (the default handlers' runtime, imported by the first model otherwise)
    except ImportError:
        pass  # a torch-only host: the first load imports what it needs
