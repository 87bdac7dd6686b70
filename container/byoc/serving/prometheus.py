"""`GET /metrics`: the server's Prometheus metrics, on the serving port (SageMaker's detailed
observability for a bring-your-own-container endpoint scrapes it there, every 60 s by default).

prometheus_client writes them: the text exposition format, or OpenMetrics when the scraper asks for
it (Accept). Every series is prefixed `byoc_`; those of one model carry a `model` label: its name on a
multi-model endpoint, empty on a single-model one. The series of an unloaded model go with it, so the
label is bounded by what is loaded.

    byoc_requests_total{route,code,model}           every request, by route template and status code
    byoc_request_duration_seconds{route,model}      from its first byte read to its answer sent
    byoc_queue_seconds{model}                       waiting for the inference thread (the batcher's queue)
    byoc_inference_seconds{model}                   one model call (a merged batch, or an unbatched request)
    byoc_batch_size{model}                          inputs per model call
    byoc_requests_in_flight{model}                  invocations being answered now
    byoc_queue_depth{model}                         inputs waiting for the model now
    byoc_errors_total{kind,model}                   failed invocations: timeout, overload, bad_input,
                                                    handler_failure, unavailable, not_found
    byoc_model_loads_total{outcome}, byoc_model_load_seconds{outcome}   loaded, failed, timeout, refused, no_memory
    byoc_model_unloads_total,
    byoc_models_loaded, byoc_model_memory_budget_bytes, byoc_model_memory_used_bytes   (multi-model)
    byoc_server_resident_memory_bytes, byoc_server_cpu_seconds_total   every process of the server
    byoc_server_processes                           its supervisor and workers (byoc.serving.server_processes)

With several workers (SAGEMAKER_MODEL_SERVER_WORKERS > 1) each is a process of its own: they write
their values to files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode; `byoc
serve` makes a fresh folder where none is set), and a scrape, answered by any worker, adds them all
up: the whole container, not one worker. A worker that died leaves its counters (they count what it
did) but not its gauges. BYOC_METRICS=false turns it all off: no route, nothing measured.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from byoc.serving.server_processes import ServerProcesses

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
ERROR_KINDS = ("timeout", "overload", "bad_input", "handler_failure", "unavailable", "not_found")
# Few buckets: each is a series per model and route, and a scrape's cost grows with the series (about
# 13 us each in prometheus_client): 100 models' series are what a multi-model scrape writes.
LATENCY_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SCOPE_MODEL = "byoc.model"  # the request scope's key for the model that answered (set by the invocation)


def prepare_workers(workers: int, folder: str | None) -> Path | None:
    """Before uvicorn starts several workers: the folder they share their values in (`folder`, the
    user's PROMETHEUS_MULTIPROC_DIR, emptied as prometheus_client asks of each start; else a fresh
    one), written to PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads as each worker imports
    it. None, and nothing written, for one worker."""
    if workers <= 1:
        return None
    chosen = Path(folder or tempfile.mkdtemp(prefix="byoc-metrics-"))
    chosen.mkdir(parents=True, exist_ok=True)
    for stale in chosen.glob("*.db"):  # values of an earlier run would be added to this one's
        stale.unlink(missing_ok=True)
    os.environ[MULTIPROC_ENV] = str(chosen)
    return chosen


class ModelMetrics:
    """One model's series (its `model` label): what its requests, batcher and inference thread report.
    It keeps the children it made, so that an unloaded model's series can all be removed."""

    def __init__(self, metrics: ServerMetrics, name: str) -> None:
        self.name = name
        self._metrics = metrics
        self.queue = metrics.queue_seconds.labels(name)
        self.inference = metrics.inference_seconds.labels(name)
        self.batch = metrics.batch_size.labels(name)
        self.in_flight = metrics.in_flight.labels(name)
        self.depth = metrics.queue_depth.labels(name)
        self._requests: dict[tuple[str, int], tuple[Any, Any]] = {}  # (route, code) -> (counter, histogram)
        self._errors: dict[str, Any] = {}

    def request(self, route: str, code: int, seconds: float) -> None:
        children = self._requests.get((route, code))
        if children is None:
            metrics = self._metrics
            children = (metrics.requests.labels(route, str(code), self.name), metrics.duration.labels(route, self.name))
            self._requests[(route, code)] = children
        children[0].inc()
        children[1].observe(seconds)

    def waited(self, seconds: float) -> None:
        self.queue.observe(seconds)

    def ran(self, inputs: int, seconds: float) -> None:
        self.inference.observe(seconds)
        self.batch.observe(inputs)

    def queued(self, inputs: int) -> None:
        self.depth.set(inputs)

    def entered(self) -> None:
        self.in_flight.inc()

    def left(self) -> None:
        self.in_flight.dec()

    def error(self, kind: str) -> None:
        if kind not in self._errors:
            self._errors[kind] = self._metrics.errors.labels(kind, self.name)
        self._errors[kind].inc()

    def remove(self) -> None:
        """Every series of this model, out of the registry."""
        metrics, name = self._metrics, self.name
        for route, code in self._requests:
            metrics.requests.remove(route, str(code), name)
        for route in {route for route, _ in self._requests}:
            metrics.duration.remove(route, name)
        for kind in self._errors:
            metrics.errors.remove(kind, name)
        for metric in (metrics.queue_seconds, metrics.inference_seconds, metrics.batch_size):
            metric.remove(name)
        for metric in (metrics.in_flight, metrics.queue_depth):
            metric.remove(name)


class NoModelMetrics(ModelMetrics):
    """What a model reports to with BYOC_METRICS=false: nothing, at no cost."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def request(self, route: str, code: int, seconds: float) -> None:
        pass

    def waited(self, seconds: float) -> None:
        pass

    def ran(self, inputs: int, seconds: float) -> None:
        pass

    def queued(self, inputs: int) -> None:
        pass

    def entered(self) -> None:
        pass

    def left(self) -> None:
        pass

    def error(self, kind: str) -> None:
        pass

    def remove(self) -> None:
        pass


NO_METRICS = NoModelMetrics()


class ServerMetrics:
    """The metrics of one server (one app): its own registry, so two servers in one process keep apart."""

    def __init__(self, workers: int = 1, multiprocess_dir: str | None = None, multi_model: bool = False) -> None:
        # Imported here: a server started with BYOC_METRICS=false never loads prometheus_client.
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # No `_created` series beside every counter and histogram: a timestamp per series, which no
        # dashboard reads, would double what each scrape carries (and its cost with many models).
        if hasattr(prometheus_client, "disable_created_metrics"):
            prometheus_client.disable_created_metrics()

        self.folder = multiprocess_dir
        self.multiprocess = multiprocess_dir is not None
        self.registry = CollectorRegistry(auto_describe=True)
        # In multiprocess mode the values live in the shared folder and a MultiProcessCollector reads
        # them back; the metric objects themselves are registered nowhere.
        into = None if self.multiprocess else self.registry

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Gauge(name, doc, labels, registry=into, multiprocess_mode="livesum")

        self.requests = Counter(
            "byoc_requests",
            "Requests answered, by route template and status code",
            ("route", "code", "model"),
            registry=into,
        )
        self.duration = Histogram(
            "byoc_request_duration_seconds",
            "From a request's arrival to its answer sent",
            ("route", "model"),
            buckets=LATENCY_BUCKETS,
            registry=into,
        )
        self.queue_seconds = Histogram(
            "byoc_queue_seconds",
            "Time waiting for the inference thread",
            ("model",),
            buckets=LATENCY_BUCKETS,
            registry=into,
        )
        self.inference_seconds = Histogram(
            "byoc_inference_seconds", "One model call", ("model",), buckets=LATENCY_BUCKETS, registry=into
        )
        self.batch_size = Histogram(
            "byoc_batch_size", "Inputs per model call", ("model",), buckets=BATCH_BUCKETS, registry=into
        )
        self.in_flight = gauge("byoc_requests_in_flight", "Invocations being answered", ("model",))
        self.queue_depth = gauge("byoc_queue_depth", "Inputs waiting for the model", ("model",))
        self.errors = Counter("byoc_errors", "Failed invocations, by kind", ("kind", "model"), registry=into)
        if multi_model:  # a single-model endpoint has no loads: no series of them
            self.loads = Counter("byoc_model_loads", "Model loads, by outcome", ("outcome",), registry=into)
            self.load_seconds = Histogram(
                "byoc_model_load_seconds", "Model loads' durations", ("outcome",), buckets=LOAD_BUCKETS, registry=into
            )
            self.unloads = Counter("byoc_model_unloads", "Models unloaded", registry=into)
            self.models_loaded = gauge("byoc_models_loaded", "Models loaded now")
            self.memory_budget = gauge("byoc_model_memory_budget_bytes", "The models' memory budget")
            self.memory_used = gauge("byoc_model_memory_used_bytes", "Memory the loaded models are charged")
        self._models: dict[str, ModelMetrics] = {}
        if self.multiprocess:
            # Only here, as every prometheus_client import: BYOC_METRICS=false never loads it.
            from prometheus_client import multiprocess

            multiprocess.MultiProcessCollector(self.registry, path=multiprocess_dir)
        supervisor = workers > 1  # this process is one of uvicorn's workers, the supervisor its parent
        self.registry.register(ServerProcesses(os.getppid() if supervisor else os.getpid(), supervisor))

    def close(self) -> None:
        """This worker stops: its live gauges (in flight, queue depth) stop counting (several workers)."""
        if self.folder is not None:
            # Only here, as every prometheus_client import: BYOC_METRICS=false never loads it.
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), self.folder)

    def model(self, name: str = "") -> ModelMetrics:
        if name not in self._models:
            self._models[name] = ModelMetrics(self, name)
        return self._models[name]

    def forget(self, name: str) -> None:
        """An unloaded model: its series go (the `model` label stays bounded by what is loaded)."""
        model = self._models.pop(name, None)
        if model is not None and not self.multiprocess:  # a multi-model endpoint runs one worker
            model.remove()

    def request(self, route: str, code: int, model: str, seconds: float) -> None:
        # Never makes a model's series: a request of a model unloaded meanwhile (its answer sent, the
        # unload done before this line ran) counts as the server's, so the unloaded stay gone.
        series = self._models.get(model) or self.model()
        series.request(route, code, seconds)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The registry as the scraper asked (Accept): OpenMetrics or the text format."""
        # Only here, as every prometheus_client import: BYOC_METRICS=false never loads it.
        from prometheus_client.exposition import choose_encoder

        if self.folder is not None:
            _forget_dead_workers(self.folder)
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def route(self) -> Callable[[Request], Any]:
        """The `/metrics` endpoint: never behind the inference thread (it reads counters, not the model)."""

        async def metrics(request: Request) -> Response:
            # Written in a thread of its own: with 100 models loaded a scrape takes tens of ms, which
            # the event loop (requests, /ping) would otherwise wait for in one piece.
            body, content_type = await asyncio.to_thread(self.exposition, request.headers.get("accept"))
            return Response(body, headers={"Content-Type": content_type})

        return metrics


def routes(metrics: ServerMetrics | None) -> list[Route]:
    """`GET /metrics`, where metrics are on (BYOC_METRICS)."""
    return [Route("/metrics", metrics.route(), methods=["GET"])] if metrics is not None else []


def middleware(metrics: ServerMetrics | None) -> list[Middleware]:
    """Every request counted and timed (`Measured`), where metrics are on."""
    return [Middleware(Measured, metrics=metrics)] if metrics is not None else []


class Measured:
    """ASGI middleware: every HTTP request counted by route template and status, and timed. Pure ASGI
    (a wrapper of `send`), not Starlette's BaseHTTPMiddleware, which would add a task per request."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets if the app raises before answering

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            model = scope.get(SCOPE_MODEL, "")
            self.metrics.request(route_of(scope), status, model, time.perf_counter() - started)


def route_of(scope: dict) -> str:
    """The template of the app's route a request matched (its converters left out: `/models/{model_name}`),
    for the `route` label: a bounded set, never the path itself; "other" where no route matched, so a
    scanner's paths add no series. Starlette's router leaves the route in the scope; where it does not
    (older versions), the app's routes are matched here as the router matches them."""
    route = scope.get("route") or _matching(scope)
    template = getattr(route, "path", None)
    return _CONVERTER.sub("}", template) if isinstance(template, str) else "other"


_CONVERTER = re.compile(r":\w+}")


def _matching(scope: dict) -> Any:
    for route in getattr(scope.get("app"), "routes", ()):
        if route.matches(scope)[0] is not Match.NONE:
            return route
    return None


def _forget_dead_workers(folder: str) -> None:
    """The live gauges of workers that are gone (a crash skips their clean exit): not summed any more."""
    # Only here, as every prometheus_client import: BYOC_METRICS=false never loads it.
    from prometheus_client import multiprocess

    for file in Path(folder).glob("gauge_live*_*.db"):
        pid = file.stem.rpartition("_")[2]
        if pid.isdigit() and not _alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
