"""`byoc serve`: the SageMaker hosting contract on an ASGI server (Starlette on uvicorn).

- `GET /ping`: 200 while this worker can serve: the model loaded (it loads eagerly at start, in the
  background, so /ping answers 503 at once while loading instead of hanging), the batching task
  running, and no inference call running past the request timeout; 503 with the reason otherwise.
  Always answered from the event loop, never behind inference.
- `POST /invocations`: handlers from `byoc.serving.handler_loader`, run by `byoc.serving.model_server`; requests batched
  by `byoc.serving.batching`.
- `GET /execution-parameters`: batch transform settings.
Errors are JSON `{"error": ...}` with honest codes: 400 bad input, 406 bad accept, 408 a body
too slow, 413 too large, 415 bad content type, 431 headers too large, 503 not ready or at capacity
(with Retry-After), 504 over the timeout, 500 only for faults of the server or the handler code.
Connections are guarded by byoc.serving.connections (idle ones closed, headers bounded in size and time).
An invocation takes one of `BYOC_MAX_CONCURRENCY` slots only once its body is complete, so slow
or stalled senders never turn ordinary requests into 503s.
SIGTERM: uvicorn stops accepting, finishes in-flight requests (up to `BYOC_GRACEFUL_TIMEOUT`,
default 25 s, inside SageMaker's 30 s), answers those still running then with a JSON 503, and
exits; no handler thread can hold the process (byoc.serving.threads). A worker whose batching task died
gives up the same way, and exits non-zero, so that the platform (or uvicorn's supervisor) replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tempfile
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from byoc.logs import configure_logging
from byoc.serving import connections
from byoc.serving.batching import BatcherStopped, QueueFull
from byoc.serving.handler_loader import InputError
from byoc.serving.model_server import ModelServer, tune_malloc
from byoc.serving.request_errors import InvalidAnswer
from byoc.serving.settings import ServeSettings, ServeSettingsError

logger = logging.getLogger("byoc.serve")

RETRY_AFTER = "1"  # seconds, on every 503: SageMaker and its SDKs retry such answers


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


def _unavailable(message: str) -> JSONResponse:
    return _error(503, message, {"Retry-After": RETRY_AFTER})


def create_app(settings: ServeSettings | None = None) -> Starlette:
    if not logging.getLogger().handlers:  # a uvicorn worker process (workers > 1) starts unconfigured
        configure_logging()
    settings = settings or ServeSettings.from_env()
    connections.configure(
        connections.ConnectionLimits(
            max_connections=settings.max_connections,
            max_header_bytes=settings.max_header_bytes,
            header_timeout=settings.header_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
        )
    )
    server = ModelServer(settings)
    open_requests: set[asyncio.Task] = set()  # invocations being read or answered

    @asynccontextmanager
    async def lifespan(app: Starlette):
        loading = server.start(on_death=restart)

        def failed(_: asyncio.Future) -> None:
            if server.error:
                _fail_start(server.error, settings.workers)

        loading.add_done_callback(failed)
        yield
        # Requests uvicorn cut at the graceful limit are answering their 503 now: let them finish it.
        if open_requests:
            await asyncio.wait(list(open_requests), timeout=1.0)
        await server.stop()

    async def ping(request: Request) -> Response:
        problem = server.problem()
        return JSONResponse({"status": "healthy"}) if problem is None else _error(503, problem)

    async def execution_parameters(request: Request) -> Response:
        return JSONResponse(
            {
                "MaxConcurrentTransforms": settings.max_concurrent_transforms or settings.workers * 4,
                "BatchStrategy": settings.batch_strategy,
                "MaxPayloadInMB": int(settings.max_payload_mb),
            }
        )

    in_flight = 0  # invocations with their body read, being answered; the event loop is one thread

    async def invocations(request: Request) -> Response:
        task = asyncio.current_task()
        assert task is not None
        open_requests.add(task)
        try:
            body = await _read_body(request)
            if isinstance(body, Response):
                return body
            return await _answer(request, body)
        except ClientDisconnect:
            logger.info("a client disconnected before its request's body was complete")
            return Response(status_code=400)  # nobody is there to read it
        except asyncio.CancelledError:
            # uvicorn cancels what is still running when BYOC_GRACEFUL_TIMEOUT ends: an honest,
            # retryable answer instead of its plain-text 500.
            if hasattr(task, "uncancel"):
                task.uncancel()
            return _unavailable(
                f"the server is shutting down and this request did not finish within the {settings.graceful_timeout} s "
                "of BYOC_GRACEFUL_TIMEOUT; retry (another instance answers)"
            )
        finally:
            open_requests.discard(task)

    async def _read_body(request: Request) -> bytes | Response:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_payload_bytes:
            return _error(
                413,
                f"the request body ({int(declared)} bytes) is over the limit of "
                f"{settings.max_payload_mb:g} MB (SAGEMAKER_MAX_PAYLOAD_IN_MB)",
            )
        body = bytearray()
        try:
            complete = await asyncio.wait_for(_collect(request, body), settings.body_timeout)
        except asyncio.TimeoutError:
            return _error(
                408,
                f"the request body did not arrive within {settings.body_timeout:g} s (BYOC_BODY_TIMEOUT); "
                f"{len(body)} bytes came",
                {"connection": "close"},  # the rest of that body will not be read
            )
        if not complete:
            return _error(
                413,
                f"the request body is over the limit of {settings.max_payload_mb:g} MB (SAGEMAKER_MAX_PAYLOAD_IN_MB)",
            )
        return bytes(body)

    async def _collect(request: Request, body: bytearray) -> bool:
        """Read the body into `body`; False as soon as it is over the payload limit."""
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_payload_bytes:
                return False
        return True

    async def _answer(request: Request, body: bytes) -> Response:
        # BYOC_MAX_CONCURRENCY bounds invocations here, not in uvicorn: uvicorn's limit refuses
        # /ping too, and SageMaker replaces an instance whose /ping fails, the worst answer to load.
        # A slot is taken once the body is complete: stalled senders hold no slot.
        nonlocal in_flight
        if in_flight >= settings.max_concurrency:
            return _unavailable(
                f"the server is at capacity: {in_flight} requests in flight (BYOC_MAX_CONCURRENCY); retry in a moment"
            )
        in_flight += 1
        try:
            return await _invoke(request, body)
        finally:
            in_flight -= 1

    async def _invoke(request: Request, body: bytes) -> Response:
        if not server.ready.is_set():
            return _unavailable("the model is still loading; retry when /ping answers 200")
        problem = server.problem()
        if problem:
            return _unavailable(f"{problem}; retry in a moment")
        content_type = request.headers.get("content-type") or "application/json"
        try:
            return await asyncio.wait_for(
                server.invoke(body, content_type, request.headers.get("accept")), settings.timeout
            )
        except asyncio.TimeoutError:
            return _error(
                504, f"the prediction took longer than {settings.timeout:g} s (SAGEMAKER_MODEL_SERVER_TIMEOUT)"
            )
        except InputError as err:
            return _error(err.status, str(err))
        except InvalidAnswer as err:
            logger.error("cannot send the answer: %s", err)
            return _error(err.status, str(err))
        except QueueFull as err:
            return _unavailable(f"the server is at capacity: {err} (BYOC_MAX_QUEUED_INPUTS); retry in a moment")
        except BatcherStopped as err:
            return _unavailable(f"this worker cannot serve: {err}; retry in a moment")
        except Exception as err:  # a fault in the server or the handler code: logged in full, summarised to the client
            logger.exception("invocation failed")
            return _error(500, f"internal error while predicting ({type(err).__name__}); see the endpoint's logs")

    return Starlette(
        routes=[
            Route("/ping", ping, methods=["GET"]),
            Route("/invocations", invocations, methods=["POST"]),
            Route("/execution-parameters", execution_parameters, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


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
    logger.info("serving %s on port %d with %d worker(s)", settings.model_dir, settings.port, settings.workers)
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
        # Connections are bounded by byoc.serving.connections (the longest-idle one closes at the limit) and
        # invocations in the app: uvicorn's own limit_concurrency would answer /ping with a plain 503.
        http=connections.GuardedProtocol,
    )
    if settings.workers > 1:
        failure = _failure_file(os.getpid())
        failure.unlink(missing_ok=True)
        uvicorn.run("byoc.serving.server:create_app", factory=True, workers=settings.workers, **options)
        if failure.exists():  # a worker could not load the model (its traceback is in the log above)
            message = failure.read_text()
            failure.unlink(missing_ok=True)
            sys.exit(f"cannot serve: {message}")
    else:
        uvicorn.run(create_app(settings), **options)
