"""`byoc serve`: the SageMaker hosting contract on an ASGI server (Starlette on uvicorn).

- `GET /ping`: 200 while this worker can serve: the model loaded (it loads eagerly at start, in the
  background, so /ping answers 503 at once while loading instead of hanging), the batching task
  running, and no inference call running past the request timeout; 503 with the reason otherwise.
  Always answered from the event loop, never behind inference.
- `POST /invocations`: handlers from `byoc.serving.user_code.handler_loader`, run by
  `byoc.serving.execution.model_server`; requests batched by `byoc.serving.execution.batching`.
- `GET /execution-parameters`: batch transform settings.
- `GET /metrics`: Prometheus metrics of the whole container (byoc.serving.prometheus), rendered on a
  thread beside the event loop, never behind inference; BYOC_METRICS=false turns them off.
- A multi-model endpoint (byoc.serving.http.multi_model_routes) has the /models routes instead of
  /invocations; both are `Endpoint`s of the one app `create_app` builds. A single model also answers the
  routes of clients off SageMaker (TEI's, OpenAI's, Cohere's: byoc.serving.http.client_routes).
- A route the app does not have: a JSON 404 (405 for a method), naming the routes there are.
Errors are JSON `{"error": ...}` with honest codes: 400 bad input, 406 bad accept, 408 a body
too slow, 413 too large, 415 bad content type, 431 headers too large, 503 not ready or at capacity
(with Retry-After), 504 over the timeout, 500 only for faults of the server or the handler code.
Connections are guarded by byoc.serving.http.connections (idle ones closed, headers bounded in size and time).
An invocation takes one of `BYOC_MAX_CONCURRENCY` slots only once its body is complete, so slow
or stalled senders never turn ordinary requests into 503s.
SIGTERM: uvicorn stops accepting, finishes in-flight requests (up to `BYOC_GRACEFUL_TIMEOUT`,
default 25 s, inside SageMaker's 30 s), answers those still running then with a JSON 503, and
exits; no handler thread can hold the process (byoc.serving.execution.threads). A worker whose batching task died
gives up the same way, and exits non-zero, so that the platform (or uvicorn's supervisor) replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import urllib.request
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from byoc import model_folder
from byoc.logs import configure_logging
from byoc.serving import prometheus
from byoc.serving.execution.memory import tune_malloc
from byoc.serving.execution.model_server import ModelServer
from byoc.serving.http import client_routes, connections
from byoc.serving.http.invocations import Invocations, error
from byoc.serving.http.multi_model_routes import MultiModel
from byoc.serving.settings import ServeSettings, ServeSettingsError

logger = logging.getLogger(__name__)


def connection_guard(settings: ServeSettings) -> connections.ConnectionGuard:
    """The limits of the server's connections (byoc.serving.http.connections), from its settings."""
    return connections.ConnectionGuard(
        connections.ConnectionLimits(
            max_connections=settings.max_connections,
            max_header_bytes=settings.max_header_bytes,
            header_timeout=settings.header_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
        )
    )


class Endpoint(Protocol):
    """What the app serves: one model (`OneModel`) or many (byoc.serving.http.multi_model_routes.MultiModel)."""

    async def start(self) -> None: ...  # begins loading in the background; /ping answers meanwhile

    async def stop(self) -> None: ...  # after the in-flight invocations drained

    def problem(self) -> str | None: ...  # why this worker cannot serve now (503 on /ping), or None

    def routes(self) -> list[Route]: ...  # its own routes beside /ping, /execution-parameters, /metrics


class OneModel:
    """The single-model endpoint: the model in /opt/ml/model, loaded eagerly at start, behind /invocations."""

    def __init__(self, settings: ServeSettings, invocations: Invocations, metrics: Any = None) -> None:
        self.settings, self.invocations = settings, invocations
        self.server = ModelServer(settings, metrics=metrics)

    async def start(self) -> None:
        missing = model_folder.missing_folder(self.settings.model_dir)
        if missing:  # no handler can load it (its code/ would be inside): one line, not a loader's traceback
            self.server.error = f"{missing} ({model_dir_source(self.settings.model_dir_named_by)})"
            _fail_start(self.server.error, self.settings.workers)
            return
        loading = self.server.start(on_death=restart)

        def failed(_: asyncio.Future) -> None:
            if self.server.error:
                _fail_start(self.server.error, self.settings.workers)

        loading.add_done_callback(failed)

    async def stop(self) -> None:
        await self.server.stop()

    def problem(self) -> str | None:
        return self.server.problem()

    def routes(self) -> list[Route]:
        async def invoke(request: Request) -> Response:
            return await self.invocations.handle(request, self.server)

        return [
            Route("/invocations", invoke, methods=["POST"]),
            *client_routes.routes(self.settings, self.invocations, self.server),
        ]


def model_dir_source(named_by: str) -> str:
    """What to check, by the setting that named the model folder (`ServeSettings.model_dir_named_by`:
    SM_MODEL_DIR, else SAGEMAKER_BASE_DIR's model/, else /opt/ml/model)."""
    if named_by == "SM_MODEL_DIR":
        return "SM_MODEL_DIR names it: check its value, or unset it to serve $SAGEMAKER_BASE_DIR/model"
    if named_by == "SAGEMAKER_BASE_DIR":
        return "it is SAGEMAKER_BASE_DIR's model/ folder: check SAGEMAKER_BASE_DIR, or set SM_MODEL_DIR"
    return (
        "SageMaker extracts the endpoint model's model.tar.gz (its ModelDataUrl) there; elsewhere, set "
        "SM_MODEL_DIR (or SAGEMAKER_BASE_DIR, the folder holding model/)"
    )


def create_app(settings: ServeSettings | None = None) -> Starlette:
    """The one app, over one model or many (BYOC_MULTI_MODEL / SAGEMAKER_MULTI_MODEL)."""
    if not logging.getLogger().handlers:  # a uvicorn worker process (workers > 1) starts unconfigured
        configure_logging()
    settings = settings or ServeSettings.from_env()
    metrics = (
        prometheus.ServerMetrics(settings.workers, settings.metrics_dir, settings.multi_model)
        if settings.metrics
        else None
    )
    invocations = Invocations(settings, metrics.model() if metrics else None)
    endpoint: Endpoint = (
        MultiModel(settings, invocations, restart, metrics)
        if settings.multi_model
        else OneModel(settings, invocations, metrics.model() if metrics else None)
    )

    @asynccontextmanager
    async def lifespan(app: Starlette):
        await endpoint.start()
        yield
        await invocations.drain()
        await endpoint.stop()
        if metrics is not None:
            metrics.close()

    async def ping(request: Request) -> Response:
        problem = endpoint.problem()
        return JSONResponse({"status": "healthy"}) if problem is None else error(503, problem)

    routes = [
        Route("/ping", ping, methods=["GET"]),
        *endpoint.routes(),
        Route("/execution-parameters", _execution_parameters(settings), methods=["GET"]),
        *prometheus.routes(metrics),
    ]
    paths = lambda: sorted({route.path for route in routes})  # noqa: E731  (named in a 404's message)
    unknown = client_routes.not_found(paths)
    return Starlette(
        routes=routes,
        middleware=prometheus.middleware(metrics),
        lifespan=lifespan,
        exception_handlers={404: unknown, 405: unknown},
    )


def _execution_parameters(settings: ServeSettings) -> Callable[[Request], Awaitable[Response]]:
    """`GET /execution-parameters`: what batch transform should send this server."""

    async def execution_parameters(request: Request) -> Response:
        return JSONResponse(
            {
                "MaxConcurrentTransforms": settings.max_concurrent_transforms or settings.workers * 4,
                "BatchStrategy": settings.batch_strategy,
                "MaxPayloadInMB": int(settings.max_payload_mb),
            }
        )

    return execution_parameters


def restart(reason: str) -> None:
    """The batching task died (a fault in byoc: the handlers' faults are contained): this worker can
    no longer serve. /ping answers 503 from now on (the model server says so), and the worker stops
    as on SIGTERM (requests in flight are answered) and exits non-zero: SageMaker replaces a
    container that exits, uvicorn's supervisor a worker. A fresh process is the only state known to
    be sound."""
    logger.error("cannot serve any more (%s); stopping so that the platform replaces this worker", reason)
    os.kill(os.getpid(), signal.SIGTERM)


def _fail_start(message: str, workers: int = 1) -> None:
    """A model that cannot load makes the container exit non-zero, so SageMaker reports the failure.
    With several workers this process is one of uvicorn's, whose supervisor would start another in
    its place forever: it leaves the reason for `main()` and stops the supervisor first."""
    logger.error("cannot serve: %s", message)
    if workers > 1:
        try:
            _failure_file(os.getppid()).write_text(message)
            os.kill(os.getppid(), signal.SIGTERM)
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _failure_file(supervisor_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"byoc-serve-{supervisor_pid}.failed"


HEALTH_FILE = Path(tempfile.gettempdir()) / "byoc-serve.port"


def healthcheck() -> int:
    """0 when this container is healthy: it does not serve (a training container), or /ping says 200."""
    try:
        port = int(HEALTH_FILE.read_text())
    except (OSError, ValueError):
        return 0
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        return 1


def main() -> None:
    """Run the server (`byoc serve`)."""
    import uvicorn  # here, not at the top: `byoc healthcheck` imports this module every 30 s and needs no server

    tune_malloc()
    try:
        settings = ServeSettings.from_env()
    except ServeSettingsError as err:
        logger.error("cannot serve: %s", err)
        sys.exit(f"cannot serve: {err}")
    what = "a multi-model endpoint (models load on POST /models)" if settings.multi_model else str(settings.model_dir)
    memory = settings.resources.memory
    logger.info(
        "serving %s on port %d with %d worker(s), %d thread(s) each (%d CPUs: %s; memory: %s)%s",
        what,
        settings.port,
        settings.workers,
        settings.threads,
        settings.resources.cpus,
        settings.resources.source,
        f"{memory >> 20} MiB, the cgroup's limit" if memory is not None else "no cgroup limit",
        "; profile async" if settings.profile == "async" else "",
    )
    if settings.workers > settings.resources.cpus:
        logger.warning(
            "SAGEMAKER_MODEL_SERVER_WORKERS=%d is over this container's %d CPUs: the workers will contend for them",
            settings.workers,
            settings.resources.cpus,
        )
    try:  # tells `byoc healthcheck` (the image's HEALTHCHECK) that this container serves, and where
        HEALTH_FILE.write_text(str(settings.port))
    except OSError:
        pass
    options: dict[str, Any] = dict(
        host="0.0.0.0",
        port=settings.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=settings.graceful_timeout,
        timeout_keep_alive=settings.keep_alive_timeout,
        # Connections are bounded by byoc.serving.http.connections (the longest-idle one closes at the limit) and
        # invocations in the app: uvicorn's own limit_concurrency would answer /ping with a plain 503.
        http=connection_guard(settings).protocol(),
    )
    if settings.workers > 1:
        # Before the workers start: they read it as they import prometheus_client.
        shared = prometheus.prepare_workers(settings.workers, settings.metrics_dir) if settings.metrics else None
        failure = _failure_file(os.getpid())
        failure.unlink(missing_ok=True)
        try:
            uvicorn.run("byoc.serving.server:create_app", factory=True, workers=settings.workers, **options)
        finally:
            if shared is not None and not settings.metrics_dir:  # a folder made for this run only
                shutil.rmtree(shared, ignore_errors=True)
        if failure.exists():  # a worker could not load the model (its traceback is in the log above)
            message = failure.read_text()
            failure.unlink(missing_ok=True)
            sys.exit(f"cannot serve: {message}")
    else:
        uvicorn.run(create_app(settings), **options)
