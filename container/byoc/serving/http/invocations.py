"""One invocation's path through the server, whichever model answers it (`/invocations`, or
`/models/{name}/invoke` on a multi-model endpoint): read the body (bounded in size and time), take
one of `BYOC_MAX_CONCURRENCY` slots once the body is complete, run the handlers under the request
timeout, and turn every outcome into an honest status with a JSON body.

A slot is taken only once the body is complete, so slow or stalled senders never turn ordinary
requests into 503s. A request uvicorn cuts at the graceful limit of SIGTERM gets a JSON 503, not
uvicorn's plain-text 500; a client that leaves mid-body is one log line. A client that leaves while its
request is answered gives its place back: the request is cancelled, and its chunks not yet run never run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from byoc.serving.execution.batching import BatcherStopped, QueueFull
from byoc.serving.execution.model_server import Answer, ModelServer
from byoc.serving.prometheus import NO_METRICS, SCOPE_MODEL, ModelMetrics
from byoc.serving.protocol.request_errors import InputError, InvalidAnswer
from byoc.serving.settings import ServeSettings

logger = logging.getLogger(__name__)

RETRY_AFTER = "1"  # seconds, on every 503: SageMaker and its SDKs retry such answers
CLIENT_GONE = 499  # the status logged for a request whose client left before its answer (nginx's)


async def _until_gone(request: Request) -> None:
    """Returns once the client has closed its connection. Its body is read whole by then, so the next ASGI
    message is the disconnect (uvicorn also sends it once the response is complete, which cannot happen
    while the request is being answered)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


def unavailable(message: str) -> JSONResponse:
    return error(503, message, {"Retry-After": RETRY_AFTER})


class Invocations:
    """The invocations of one server process: their slots, and those still open at SIGTERM."""

    def __init__(self, settings: ServeSettings, metrics: ModelMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or NO_METRICS  # errors before a model is chosen (byoc.serving.prometheus)
        self.in_flight = 0  # invocations with their body read, being answered; the event loop is one thread
        self.open: set[asyncio.Task] = set()  # invocations being read or answered

    async def handle(self, request: Request, server: ModelServer) -> Response:
        """Answer `request` with `server`."""
        return await self.handle_with(request, lambda body, run: run(server))

    async def handle_with(
        self,
        request: Request,
        route: Callable[[bytes, Callable[[ModelServer], Awaitable[Response]]], Awaitable[Response]],
    ) -> Response:
        """Read the request, then `route(body, run)`: `run(server)` answers it with a model server
        (slot, timeout, errors); `route` may answer instead (a model that is not loaded: 404)."""
        task = asyncio.current_task()
        assert task is not None
        self.open.add(task)
        try:
            body = await self.read_body(request)
            if isinstance(body, Response):
                self.metrics.error("bad_input")
                return body
            return await route(body, lambda server: self._answer(request, body, server))
        except ClientDisconnect:
            logger.info("a client disconnected before its request's body was complete")
            self.metrics.error("bad_input")
            return Response(status_code=400)  # nobody is there to read it
        except asyncio.CancelledError:
            # uvicorn cancels what is still running when BYOC_GRACEFUL_TIMEOUT ends: an honest,
            # retryable answer instead of its plain-text 500.
            if hasattr(task, "uncancel"):
                task.uncancel()
            self.metrics.error("unavailable")
            return unavailable(
                f"the server is shutting down and this request did not finish within the "
                f"{self.settings.graceful_timeout} s of BYOC_GRACEFUL_TIMEOUT; retry (another instance answers)"
            )
        finally:
            self.open.discard(task)

    async def drain(self, timeout: float = 1.0) -> None:
        """Let requests uvicorn cut at the graceful limit finish answering their 503."""
        if self.open:
            await asyncio.wait(list(self.open), timeout=timeout)

    async def read_body(self, request: Request) -> bytes | Response:
        """The request's body, or the 408/413 that refuses it."""
        settings = self.settings
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_payload_bytes:
            return error(
                413,
                f"the request body ({int(declared)} bytes) is over the limit of "
                f"{settings.max_payload_mb:g} MB (SAGEMAKER_MAX_PAYLOAD_IN_MB)",
            )
        body = bytearray()
        try:
            complete = await asyncio.wait_for(self._collect(request, body), settings.body_timeout)
        except asyncio.TimeoutError:
            return error(
                408,
                f"the request body did not arrive within {settings.body_timeout:g} s (BYOC_BODY_TIMEOUT); "
                f"{len(body)} bytes came",
                {"connection": "close"},  # the rest of that body will not be read
            )
        if not complete:
            return error(
                413,
                f"the request body is over the limit of {settings.max_payload_mb:g} MB (SAGEMAKER_MAX_PAYLOAD_IN_MB)",
            )
        return bytes(body)

    async def _collect(self, request: Request, body: bytearray) -> bool:
        """Read the body into `body`; False as soon as it is over the payload limit."""
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.settings.max_payload_bytes:
                return False
        return True

    def not_found(self, response: Response) -> Response:
        """A route's 404 for a model that is not loaded (multi-model), counted as such."""
        self.metrics.error("not_found")
        return response

    async def answer(self, request: Request, body: bytes, server: ModelServer) -> Response:
        """`body` (read already) answered by `server`: a client route's request, rewritten as /invocations reads
        it (byoc.serving.http.client_routes), goes this way."""
        return await self._answer(request, body, server)

    async def _answer(self, request: Request, body: bytes, server: ModelServer) -> Response:
        metrics = server.metrics
        request.scope[SCOPE_MODEL] = metrics.name  # the request's series are this model's
        # BYOC_MAX_CONCURRENCY bounds invocations here, not in uvicorn: uvicorn's limit refuses
        # /ping too, and SageMaker replaces an instance whose /ping fails, the worst answer to load.
        if self.in_flight >= self.settings.max_concurrency:
            metrics.error("overload")
            return unavailable(
                f"the server is at capacity: {self.in_flight} requests in flight (BYOC_MAX_CONCURRENCY); "
                "retry in a moment"
            )
        self.in_flight += 1
        metrics.entered()
        try:
            response, kind = await self._invoke(request, body, server)
        finally:
            self.in_flight -= 1
            metrics.left()
        if kind is not None:
            metrics.error(kind)
        return response

    async def _invoke(self, request: Request, body: bytes, server: ModelServer) -> tuple[Response, str | None]:
        """The answer, and the kind of error it is (None for a success): byoc.serving.prometheus.ERROR_KINDS."""
        timeout = self.settings.timeout
        if not server.ready.is_set():
            return unavailable("the model is still loading; retry when /ping answers 200"), "unavailable"
        problem = server.problem()
        if problem:
            return unavailable(f"{problem}; retry in a moment"), "unavailable"
        content_type = request.headers.get("content-type") or "application/json"
        try:
            invoking = asyncio.ensure_future(server.invoke(body, content_type, request.headers.get("accept")))
            gone = asyncio.ensure_future(_until_gone(request))
            try:
                await asyncio.wait((invoking, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not invoking.done():  # timed out, the client left, or this request is being cut
                    invoking.cancel()
                    await asyncio.gather(invoking, return_exceptions=True)
            if invoking.cancelled():
                if gone.done() and not gone.cancelled():
                    logger.info("a client left before its answer: the rest of its request's work was dropped")
                    return Response(status_code=CLIENT_GONE), None  # nobody is there to read it
                raise asyncio.TimeoutError
            answer = invoking.result()
            return (
                Response(answer.body, media_type=answer.content_type) if isinstance(answer, Answer) else answer
            ), None
        except asyncio.TimeoutError:
            return error(
                504, f"the prediction took longer than {timeout:g} s (SAGEMAKER_MODEL_SERVER_TIMEOUT)"
            ), "timeout"
        except InputError as err:
            return error(err.status, str(err)), "bad_input"
        except InvalidAnswer as err:
            logger.error("cannot send the answer: %s", err)
            return error(err.status, str(err)), "handler_failure"
        except QueueFull as err:
            message = f"the server is at capacity: {err} (BYOC_MAX_QUEUED_INPUTS); retry in a moment"
            return unavailable(message), "overload"
        except BatcherStopped as err:
            return unavailable(f"this worker cannot serve: {err}; retry in a moment"), "unavailable"
        except Exception as err:  # a fault in the server or the handler code: logged in full, summarised to the client
            logger.exception("invocation failed")
            message = f"internal error while predicting ({type(err).__name__}); see the endpoint's logs"
            return error(500, message), "handler_failure"
