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
from byoc.serving.execution.memory import release_memory, resident_bytes
from byoc.serving.execution.model_server import ModelServer
from byoc.serving.execution.threads import DaemonThreads
from byoc.serving.prometheus import ModelMetrics, ServerMetrics
from byoc.serving.settings import ServeSettings

logger = logging.getLogger(__name__)

MIB = 1 << 20
# A load's outcome in the metrics (byoc_model_loads_total), by the status that refused it.
LOAD_OUTCOMES = {400: "refused", 404: "refused", 409: "refused", 500: "failed", 504: "timeout", 507: "no_memory"}
PAGE_SIZE = 100  # models per GET /models page when the request names no `limit`
SESSION_OVERHEAD = 24 * MIB  # a session's own buffers, the handlers' state: beyond the files' bytes


class LoadRefused(Exception):
    """A load the server refuses: `status` is the answer's (400, 404, 409, 500, 507)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Hung:
    """A load that did not end within BYOC_MULTI_MODEL_LOAD_TIMEOUT: its thread still runs, and holds
    memory (its estimate stays counted) until it ends; its result is then dropped."""

    name: str
    memory: int
    since: float  # when the load began (time.monotonic)


MAX_HUNG = 3  # loads hung at once from which /ping answers 503: their threads and memory never come back


@dataclass
class Entry:
    name: str
    url: str
    server: ModelServer
    memory: int  # bytes this model is accounted for: max(estimate, what loading it really took)
    in_flight: int = 0  # invocations being answered
    unloading: bool = False


# What a model folder may hold its model in, in the order the estimate reads them.
MODEL_FILES = (model_folder.WEIGHTS, "pytorch_model.bin", onnx_graph.GRAPH)
MAX_NAME = 1024  # characters of a model_name: SageMaker's TargetModel is at most 1024 too


def estimate_bytes(folder: Path, int8: bool = False) -> int:
    """Memory a model folder takes once loaded, from its files: the weights (or the int8 graph, which
    holds its own; or the graph alone), the tokenizer (about three times its file in memory), a
    session's overhead."""
    candidates = ((onnx_graph.INT8_GRAPH,) if int8 else ()) + MODEL_FILES
    folder = model_folder.weights_dir(folder)  # (an inference-free sparse model's transformer is inside it)
    weights = next((folder / name for name in candidates if (folder / name).is_file()), None)
    tokenizer = folder / model_folder.TOKENIZER
    size = lambda path: path.stat().st_size if path is not None and path.exists() else 0
    return size(weights) + 3 * size(tokenizer) + SESSION_OVERHEAD


def check_request(name: str, url: str, program: str) -> Path:
    """The model folder of a load request; LoadRefused (400, 404) says what is wrong with it."""
    if len(name) > MAX_NAME:
        raise LoadRefused(400, f"model_name is {len(name)} characters long: at most {MAX_NAME}")
    folder = Path(url)
    if folder.is_file():
        raise LoadRefused(400, f"the url {url} is a file: it must be the folder of an unpacked model.tar.gz")
    if not folder.is_dir():
        raise LoadRefused(404, f"the model folder {url} does not exist (an unpacked model.tar.gz)")
    files = model_folder.weights_dir(folder)
    if not any((files / name).is_file() for name in MODEL_FILES) and not (folder / "code" / program).is_file():
        raise LoadRefused(
            400,
            f"no model in {url}: it holds none of {', '.join(MODEL_FILES)} (as byoc train writes them), nor a "
            f"code/{program} whose model_fn loads one",
        )
    return folder


class Registry:
    """The loaded models by name, their memory, and the one thread they all infer on."""

    def __init__(
        self,
        settings: ServeSettings,
        budget: int,
        on_death: Callable[[str], None],
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.settings, self.budget, self.on_death = settings, budget, on_death
        self.metrics = metrics  # byoc.serving.prometheus: loads, unloads, memory, and each model's series
        self.baseline = resident_bytes()  # the server's own memory, with no model (again after warm_up)
        self.entries: dict[str, Entry] = {}
        self.executor = DaemonThreads(1, "byoc-inference")  # every model's: they take turns
        self.handler_threads = DaemonThreads(settings.max_concurrency, "byoc-handler")
        self._loading: set[str] = set()
        self._load_lock = asyncio.Lock()
        self.hung: dict[str, Hung] = {}
        self.orphans: list[ModelServer] = []  # unloaded while a call of theirs held the inference thread

    async def warm_up(self) -> None:
        """Import the runtime before the first load, so that what the first model takes is measured
        as the model's and not as the import's (tens of MiB of ONNX Runtime)."""
        async with self._load_lock:
            await asyncio.get_running_loop().run_in_executor(None, _import_runtime)
            self.baseline = resident_bytes()

    @property
    def used(self) -> int:
        loaded = sum(entry.memory for entry in self.entries.values())
        return loaded + sum(hung.memory for hung in self.hung.values())

    def absent(self, name: str) -> str:
        """What a route answers (404) for a name that is not loaded: its state, the same on every route."""
        if name in self._loading:
            return f"the model {name!r} is loading: not loaded yet"
        if name in self.hung:
            return f"the model {name!r} is not loaded: {self._hung_text(self.hung[name])}"
        return f"no model named {name!r} is loaded: load it with POST /models first"

    def _hung_text(self, hung: Hung) -> str:
        return (
            f"its load began {time.monotonic() - hung.since:.0f} s ago and has not ended (its model_fn or the import "
            f"of its code hangs; BYOC_MULTI_MODEL_LOAD_TIMEOUT={self.settings.multi_model_load_timeout:g} s)"
        )

    def describe(self, entry: Entry) -> dict[str, str]:
        return {"modelName": entry.name, "modelUrl": entry.url}

    def page(self, token: str | None, limit: int) -> dict[str, Any]:
        """One page of the loaded models, by name; `nextPageToken` where more follow. LoadRefused
        (400) for a token no page gave."""
        names = sorted(name for name, entry in self.entries.items() if not entry.unloading)
        token = token or "0"
        start = small_int(token)
        if start is None:
            raise LoadRefused(400, f"next_page_token {token[:20]!r} is no token a page gave: list from the start")
        chosen = names[start : start + limit]
        page: dict[str, Any] = {"models": [self.describe(self.entries[name]) for name in chosen]}
        if start + limit < len(names):
            page["nextPageToken"] = str(start + limit)
        return page

    def get(self, name: str) -> Entry | None:
        entry = self.entries.get(name)
        return None if entry is None or entry.unloading else entry

    async def load(self, name: str, url: str) -> Entry:
        """Load the model folder `url` as `name`; LoadRefused says why not. Each load, whatever its
        outcome (LOAD_OUTCOMES), is counted and timed in the metrics."""
        started, outcome = time.monotonic(), "failed"
        try:
            entry = await self._checked_load(name, url)
            outcome = "loaded"
            return entry
        except LoadRefused as refused:
            outcome = LOAD_OUTCOMES.get(refused.status, "failed")
            raise
        finally:
            self._observe_load(outcome, time.monotonic() - started)

    async def _checked_load(self, name: str, url: str) -> Entry:
        folder = check_request(name, url, self.settings.program)
        if name in self.hung:  # answered at once: another try would hang as long, and hold the loads queued behind
            raise LoadRefused(504, f"the model {name!r} cannot load now: {self._hung_text(self.hung[name])}")
        if name in self._loading:
            raise LoadRefused(409, f"a model named {name!r} is loading already")
        if name in self.entries:
            raise LoadRefused(409, f"a model named {name!r} is loaded already: unload it first to load it again")
        self._loading.add(name)
        try:
            async with self._load_lock:  # one at a time: each load's memory is measured alone
                return await self._load(name, url, folder)
        finally:
            self._loading.discard(name)

    async def _load(self, name: str, url: str, folder: Path) -> Entry:
        estimate = estimate_bytes(folder, int8=self.settings.inference.precision == "int8")
        self._check_budget(name, estimate, "would take about")
        series = self.metrics.model(name) if self.metrics is not None else None
        try:
            return await self._start(name, url, folder, estimate, series)
        except BaseException:
            # Only this load, which holds the name, forgets its series: a request refused for a name
            # loading or loaded (409, or a bad url: 400, 404) never touches that model's.
            if self.metrics is not None:
                self.metrics.forget(name)  # the series a failed load made (none ever answered)
            raise

    async def _start(self, name: str, url: str, folder: Path, estimate: int, series: ModelMetrics | None) -> Entry:
        settings = replace(self.settings, model_dir=folder)
        server = ModelServer(
            settings, executor=self.executor, handler_threads=self.handler_threads, name=name, metrics=series
        )
        before = resident_bytes()
        started = time.monotonic()
        loader = DaemonThreads(1, "byoc-loader")  # one thread per load: a hung one holds no other load's
        loading = server.start(self.on_death, loader=loader)
        loader.shutdown(wait=False)  # its thread ends once the load returns
        try:
            await asyncio.wait_for(asyncio.shield(loading), self.settings.multi_model_load_timeout)
        except asyncio.TimeoutError:
            await self._abandon(name, server, loading, estimate, started)
            raise LoadRefused(504, f"the model {name!r} did not load: {self._hung_text(self.hung[name])}") from None
        if server.error:
            await server.stop(shared=True)
            server.forget()  # the code it imported before model_fn failed: a retried load would add more
            raise LoadRefused(500, f"the model {name!r} could not load: {server.error}")
        took = max(estimate, resident_bytes() - before)
        entry = Entry(name, url, server, took)
        try:
            self._check_budget(name, took, "took", measured_with_it=True)
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

    async def _abandon(
        self, name: str, server: ModelServer, loading: asyncio.Future, memory: int, since: float
    ) -> None:
        """Give up waiting for a load: the name is free on every route; the memory stays counted until
        the load's thread ends, and what it loaded is then dropped."""
        await server.stop(shared=True)
        self.hung[name] = hung = Hung(name, memory, since)
        logger.error("model %r: %s; later loads go on", name, self._hung_text(hung))

        def ended(_: asyncio.Future) -> None:
            server.forget()
            if self.hung.get(name) is hung:
                del self.hung[name]
            gc.collect()
            release_memory()
            took = time.monotonic() - since
            logger.warning("the hung load of %r ended after %.0f s; what it loaded was dropped", name, took)

        loading.add_done_callback(ended)

    def _check_budget(self, name: str, size: int, verb: str, measured_with_it: bool = False) -> None:
        """LoadRefused (507) when `size` more does not fit: counted against what the models were charged
        at their loads, or what the process really holds now above the server's own memory (a model
        that grew while serving), whichever is more."""
        measured = resident_bytes() - self.baseline - (size if measured_with_it else 0)
        others = max(self.used, measured)
        if others + size > self.budget:
            raise LoadRefused(
                507,
                f"not enough memory for {name!r}: it {verb} {size // MIB} MiB and {others // MIB} of the "
                f"{self.budget // MIB} MiB of BYOC_MULTI_MODEL_MEMORY_MB are in use (charged at load: "
                f"{self.used // MIB} MiB; measured now: {max(0, measured) // MIB} MiB); unload a model first",
            )

    async def unload(self, name: str, wait: float) -> None:
        """Stop taking requests for `name`, let those in flight finish (up to `wait` s), free it."""
        entry = self.get(name)
        if entry is None:
            raise LoadRefused(404, self.absent(name))
        entry.unloading = True
        deadline = time.monotonic() + wait
        while entry.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.entries.pop(name, None)
        if entry.server.busy_since is not None:  # a call still holds the one inference thread: /ping watches it
            self.orphans.append(entry.server)
        await self._drop(entry)
        if self.metrics is not None:
            self.metrics.unloads.inc()
            self._observe_models()
        logger.info("model %r unloaded (%d MiB in use, %d model(s))", name, self.used // MIB, len(self.entries))

    def _observe_load(self, outcome: str, seconds: float) -> None:
        if self.metrics is None:
            return
        self.metrics.loads.labels(outcome).inc()
        self.metrics.load_seconds.labels(outcome).observe(seconds)
        self._observe_models()

    def _observe_models(self) -> None:
        """The gauges of what is loaded, after each load and unload."""
        assert self.metrics is not None
        self.metrics.models_loaded.set(len(self.entries))
        self.metrics.memory_budget.set(self.budget)
        self.metrics.memory_used.set(self.used)

    async def _drop(self, entry: Entry) -> None:
        if self.metrics is not None:  # before waiting: a load of the name begun meanwhile makes series of its own
            self.metrics.forget(entry.name)
        await entry.server.stop(shared=True)
        entry.server.forget()
        gc.collect()  # the session and the handlers' module hold cycles: free them now, not later
        release_memory()

    def problem(self) -> str | None:
        """Why no model can be served (/ping 503), or None: a stuck inference call (of a loaded model or
        of one unloaded since), a dead batcher, or MAX_HUNG loads hung at once."""
        for entry in self.entries.values():
            problem = entry.server.problem()
            if problem:
                return f"model {entry.name!r}: {problem}"
        self.orphans = [server for server in self.orphans if server.busy_since is not None]
        for server in self.orphans:
            if stuck := server.stuck():
                return f"model {server.name!r}, unloaded since: {stuck}; every model waits for that thread"
        if len(self.hung) >= MAX_HUNG:
            return (
                f"{len(self.hung)} loads hang ({', '.join(map(repr, sorted(self.hung)))}): their threads and memory "
                "cannot be given back"
            )
        return None

    async def stop(self) -> None:
        for entry in list(self.entries.values()):
            await entry.server.stop(shared=True)
        for pool in (self.executor, self.handler_threads):
            pool.shutdown(wait=False, cancel_futures=True)


def small_int(text: str) -> int | None:
    """`text` as a count (ASCII digits, at most 9 of them), else None: "²" passes str.isdigit and
    int() refuses it, as it refuses 5,000 digits."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def _import_runtime() -> None:
    try:
        import onnxruntime  # noqa: F401  (the default handlers' runtime, imported by the first model otherwise)
    except ImportError:
        pass  # a torch-only host: the first load imports what it needs
