"""`byoc serve`: the SageMaker hosting contract on an ASGI server (Starlette on uvicorn).

- `GET /ping`: 200 once the model is loaded (it loads eagerly at start, in the background, so
  /ping answers 503 at once while loading instead of hanging), always answered from the event
  loop, never behind inference.
- `POST /invocations`: handlers from `byoc.handlers`; requests batched by `byoc.batching`.
- `GET /execution-parameters`: batch transform settings.
Errors are JSON `{"error": ...}` with honest codes: 400 bad input, 406 bad accept, 413 too large,
415 bad content type, 503 not ready, 504 over the timeout, 500 only for real server faults.
SIGTERM: uvicorn stops accepting, finishes in-flight requests (up to `BYOC_GRACEFUL_TIMEOUT`,
default 25 s, inside SageMaker's 30 s) and exits.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from byoc.batching import Batcher
from byoc.contract import Paths, base_dir
from byoc.handlers import Handlers, InputError, NotAcceptable, call, load_handlers
from byoc.logs import configure_logging

logger = logging.getLogger("byoc.serve")

JSON = "application/json"
SWITCH_INTERVAL = 0.0005


@dataclass(frozen=True)
class ServeSettings:
    """Everything the server reads from the environment (SageMaker's variables and byoc's own)."""

    model_dir: Path
    port: int = 8080
    workers: int = 1
    timeout: float = 60.0
    max_payload_mb: float = 6.0
    default_accept: str = JSON
    batch_strategy: str = "MULTI_RECORD"
    max_concurrent_transforms: int = 0
    max_batch: int = 128
    max_delay_ms: float = 0.0
    graceful_timeout: int = 25

    @classmethod
    def from_env(cls) -> ServeSettings:
        env = os.environ
        workers = int(env.get("SAGEMAKER_MODEL_SERVER_WORKERS") or 1)
        return cls(
            model_dir=Paths(base_dir()).model_dir,  # the training contract's rule: an empty variable is unset
            port=int(env.get("SAGEMAKER_BIND_TO_PORT") or 8080),
            workers=max(1, workers),
            timeout=float(
                env.get("SAGEMAKER_MODEL_SERVER_TIMEOUT") or env.get("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS") or 60
            ),
            max_payload_mb=float(env.get("SAGEMAKER_MAX_PAYLOAD_IN_MB") or 6),
            default_accept=env.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or JSON,
            batch_strategy=env.get("SAGEMAKER_BATCH_STRATEGY") or "MULTI_RECORD",
            max_concurrent_transforms=int(env.get("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS") or 0),
            max_batch=int(env.get("BYOC_MAX_BATCH_SIZE") or 128),
            max_delay_ms=float(env.get("BYOC_MAX_BATCH_DELAY_MS") or 0),
            graceful_timeout=int(env.get("BYOC_GRACEFUL_TIMEOUT") or 25),
        )

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 1024 * 1024)


class ModelServer:
    """The loaded model, its handlers and the inference thread; shared by the routes."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.handlers: Handlers | None = None
        self.model: Any = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="byoc-inference")
        self.batcher: Batcher | None = None

    def load(self) -> None:
        """Runs in the inference thread at start-up (torch state stays on the thread that uses it)."""
        started = time.monotonic()
        # The inference thread gives up the GIL inside every torch op and must win it back after;
        # with the default 5 ms switch interval a busy event loop makes it wait that long each time.
        sys.setswitchinterval(SWITCH_INTERVAL)
        # Progress bars are carriage-return noise in CloudWatch (transformers reads this at import).
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            _split_cores(self.settings.workers)
            self.handlers = load_handlers(self.settings.model_dir)
            self.model = call(self.handlers.model_fn, "model_fn", str(self.settings.model_dir))
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"
            logger.exception("loading the model from %s failed", self.settings.model_dir)
            return
        self.ready.set()
        logger.info("model loaded from %s in %.1f s; ready", self.settings.model_dir, time.monotonic() - started)

    def predict_batch(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        assert self.handlers is not None and self.handlers.predict_fn is not None  # batching implies both
        try:
            data = {"inputs": inputs, "parameters": parameters}
            return call(self.handlers.predict_fn, "predict_fn", data, self.model)
        finally:
            if self.batcher is not None and self.batcher.queue.empty():
                release_memory()


def _split_cores(workers: int) -> None:
    """Several workers share the cores instead of each taking them all (oversubscribed threads slow
    everything several-fold). OMP_NUM_THREADS is set before the handlers load: torch reads it at
    import, and the default model_fn gives ONNX Runtime the same number."""
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    torch = sys.modules.get("torch")  # imported already (a user's code): set it directly too
    if torch is not None:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    logger.info("worker %d: %s inference threads", os.getpid(), os.environ["OMP_NUM_THREADS"])


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def create_app(settings: ServeSettings | None = None) -> Starlette:
    if not logging.getLogger().handlers:  # a uvicorn worker process (workers > 1) starts unconfigured
        configure_logging()
    settings = settings or ServeSettings.from_env()
    server = ModelServer(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        loop = asyncio.get_running_loop()
        loading = loop.run_in_executor(server.executor, server.load)
        server.batcher = Batcher(
            server.predict_batch, server.executor, settings.max_batch, settings.max_delay_ms / 1000
        )
        server.batcher.start()

        def failed(_: asyncio.Future) -> None:
            if server.error:
                _fail_start(server.error, settings.workers)

        loading.add_done_callback(failed)
        yield
        await server.batcher.stop()
        server.executor.shutdown(wait=False, cancel_futures=True)

    async def ping(request: Request) -> Response:
        if server.ready.is_set():
            return Response(status_code=200)
        reason = f"the model failed to load: {server.error}" if server.error else "the model is still loading"
        return _error(503, reason)

    async def execution_parameters(request: Request) -> Response:
        return JSONResponse(
            {
                "MaxConcurrentTransforms": settings.max_concurrent_transforms or settings.workers * 4,
                "BatchStrategy": settings.batch_strategy,
                "MaxPayloadInMB": int(settings.max_payload_mb),
            }
        )

    async def invocations(request: Request) -> Response:
        if not server.ready.is_set():
            return _error(503, "the model is still loading; retry when /ping answers 200")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_payload_bytes:
            return _error(
                413,
                f"the request body ({int(declared)} bytes) is over the limit of "
                f"{settings.max_payload_mb:g} MB (SAGEMAKER_MAX_PAYLOAD_IN_MB)",
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_payload_bytes:
                return _error(
                    413,
                    f"the request body is over the limit of {settings.max_payload_mb:g} MB "
                    "(SAGEMAKER_MAX_PAYLOAD_IN_MB)",
                )
        content_type = request.headers.get("content-type") or JSON
        accept = request.headers.get("accept") or settings.default_accept
        if accept.strip() in ("*/*", ""):
            accept = settings.default_accept
        try:
            return await asyncio.wait_for(_invoke(server, bytes(body), content_type, accept), settings.timeout)
        except asyncio.TimeoutError:
            return _error(
                504, f"the prediction took longer than {settings.timeout:g} s (SAGEMAKER_MODEL_SERVER_TIMEOUT)"
            )
        except InputError as err:
            return _error(err.status, str(err))
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


async def _invoke(server: ModelServer, body: bytes, content_type: str, accept: str) -> Response:
    handlers, batcher, loop = server.handlers, server.batcher, asyncio.get_running_loop()
    assert handlers is not None and batcher is not None  # the routes call this only once the model is ready
    transform_fn, input_fn, predict_fn = handlers.transform_fn, handlers.input_fn, handlers.predict_fn
    if transform_fn is not None:
        result = await loop.run_in_executor(
            server.executor, lambda: call(transform_fn, "transform_fn", server.model, body, content_type, accept)
        )
        return _response(result, accept)
    assert input_fn is not None and predict_fn is not None  # load_handlers sets them wherever transform_fn is None
    _check_accept(handlers, accept)  # before spending time on the model
    try:
        data = await _off_loop(len(body), call, input_fn, "input_fn", body, content_type)
    except InputError:
        raise
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as err:  # a user input_fn rejecting the body
        raise InputError(f"malformed input: {err}") from None
    if handlers.batchable and _batch_shaped(data):
        prediction = await batcher.submit(data["inputs"], data.get("parameters") or {})
    else:
        prediction = await loop.run_in_executor(
            server.executor, lambda: call(predict_fn, "predict_fn", data, server.model)
        )
    result = await _off_loop(len(body), call, handlers.output_fn, "output_fn", prediction, accept)
    return _response(result, accept)


def _batch_shaped(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("inputs"), list)
        and isinstance(data.get("parameters") or {}, dict)
    )


INLINE_LIMIT = 256 * 1024  # bodies below this are parsed and answered on the event loop


async def _off_loop(size: int, fn, *args):
    """Small requests are handled on the event loop itself: a thread hop per request would fight
    the inference thread for the GIL (each torch op re-acquires it). Large ones go to a thread so
    that /ping never waits behind a 6 MB JSON parse."""
    if size < INLINE_LIMIT:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def _check_accept(handlers: Handlers, accept: str) -> None:
    kinds = [a.split(";")[0].strip().lower() for a in accept.split(",")]
    if handlers.accept_types and not any(k in handlers.accept_types for k in kinds):
        raise NotAcceptable(f"unsupported accept type {accept!r}: ask for one of {', '.join(handlers.accept_types)}")


def _response(result: Any, accept: str) -> Response:
    """Handlers return (body, content_type) or just a body."""
    if isinstance(result, Response):
        return result
    body, content_type = result if isinstance(result, tuple) and len(result) == 2 else (result, accept)
    if not isinstance(body, (str, bytes)):
        body, content_type = json.dumps(body), JSON
    return Response(body, media_type=content_type)


_LIBC = None


def _tune_malloc() -> None:
    """glibc gives each allocating thread its own heap arena; the server needs two (glibc only)."""
    global _LIBC
    try:
        _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        _LIBC = None  # not glibc: nothing to tune


def release_memory() -> None:
    """Give freed activation buffers back to the system once the server is idle (glibc keeps
    them in its heaps otherwise, so resident memory would stay at its busiest)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


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

    _tune_malloc()

    settings = ServeSettings.from_env()
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
        timeout_keep_alive=75,
    )
    if settings.workers > 1:
        failure = _failure_file(os.getpid())
        failure.unlink(missing_ok=True)
        uvicorn.run("byoc.serve:create_app", factory=True, workers=settings.workers, **options)
        if failure.exists():  # a worker could not load the model (its traceback is in the log above)
            message = failure.read_text()
            failure.unlink(missing_ok=True)
            sys.exit(f"cannot serve: {message}")
    else:
        uvicorn.run(create_app(settings), **options)
