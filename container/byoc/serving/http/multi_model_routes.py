"""The routes of a multi-model endpoint (byoc.serving.multi_model has the models): SageMaker's
custom-container contract for MME, plus /ping and /execution-parameters.

    POST   /models                  {"model_name": ..., "url": ...}   200, or 400/404/409/500/504/507
    GET    /models[?next_page_token=T&limit=N]  {"models": [{"modelName", "modelUrl"}], "nextPageToken"?}
    GET    /models/{name}           {"modelName", "modelUrl"}          200, or 404
    DELETE /models/{name}           200, or 404
    POST   /models/{name}/invoke    everything /invocations takes, for that model; 404 if not loaded

/ping is 200 with no model loaded (SageMaker loads models only once the container is healthy) and
503 only when the server itself cannot serve (a stuck inference call, of a loaded model or of one
unloaded since; a dead batching task; MAX_HUNG loads hung at once).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from byoc.serving.execution.model_server import ModelServer
from byoc.serving.http.invocations import Invocations, error
from byoc.serving.multi_model import PAGE_SIZE, LoadRefused, Registry, small_int
from byoc.serving.prometheus import ServerMetrics
from byoc.serving.settings import ServeSettings

logger = logging.getLogger(__name__)

TARGET_HEADER = "x-amzn-sagemaker-target-model"  # the invoker's TargetModel: for the logs only
MAX_PAGE = 1000


class MultiModel:
    """A multi-model endpoint behind the one app (byoc.serving.server.create_app): models load on
    POST /models within the memory budget; /ping is this endpoint's `problem()`."""

    def __init__(
        self,
        settings: ServeSettings,
        invocations: Invocations,
        on_death: Callable[[str], None],
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.settings, self.invocations = settings, invocations
        self.registry = Registry(settings, settings.multi_model_budget, on_death, metrics)
        self.warming: asyncio.Future | None = None

    async def start(self) -> None:
        self.warming = asyncio.ensure_future(self.registry.warm_up())  # loads wait for it; /ping does not
        logger.info(
            "multi-model endpoint: models load on POST /models, within %d MiB (BYOC_MULTI_MODEL_MEMORY_MB)",
            self.registry.budget >> 20,
        )

    async def stop(self) -> None:
        if self.warming is not None:
            self.warming.cancel()
        await self.registry.stop()

    def problem(self) -> str | None:
        return self.registry.problem()

    def routes(self) -> list[Route]:
        return _routes(self.settings, self.invocations, self.registry)


def _routes(settings: ServeSettings, invocations: Invocations, registry: Registry) -> list[Route]:

    async def load(request: Request) -> Response:
        body = await invocations.read_body(request)
        if isinstance(body, Response):
            return body
        try:
            spec = json.loads(body)
            name, url = spec["model_name"], spec["url"]
            if not (isinstance(name, str) and name and isinstance(url, str) and url):
                raise ValueError
        except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: JSON nested too deep
            return error(400, 'the body must be JSON: {"model_name": "a name", "url": "/opt/ml/models/.../model"}')
        logger.info("loading model %r from %s (target model %s)", name, url, request.headers.get(TARGET_HEADER, "-"))
        try:
            entry = await registry.load(name, url)
        except LoadRefused as refused:
            logger.warning("model %r not loaded (%d): %s", name, refused.status, refused)
            return error(refused.status, str(refused))
        return JSONResponse({**registry.describe(entry), "status": f"model {name!r} loaded"})

    async def listing(request: Request) -> Response:
        size = small_int(request.query_params.get("limit", "")) or PAGE_SIZE
        try:
            return JSONResponse(registry.page(request.query_params.get("next_page_token"), min(size, MAX_PAGE)))
        except LoadRefused as refused:
            return error(refused.status, str(refused))

    async def describe(request: Request) -> Response:
        name = request.path_params["model_name"]
        entry = registry.get(name)
        return JSONResponse(registry.describe(entry)) if entry else error(404, registry.absent(name))

    async def unload(request: Request) -> Response:
        name = request.path_params["model_name"]
        try:
            await registry.unload(name, wait=settings.timeout)
        except LoadRefused as refused:
            return error(refused.status, str(refused))
        return JSONResponse({"status": f"model {name!r} unloaded"})

    async def invoke(request: Request) -> Response:
        name = request.path_params["model_name"]
        target = request.headers.get(TARGET_HEADER)

        async def route(body: bytes, run: Callable[[ModelServer], Awaitable[Response]]) -> Response:
            entry = registry.get(name)  # looked up once the body is read: an unload meanwhile is a 404
            if entry is None:
                return invocations.not_found(error(404, registry.absent(name)))
            logger.debug("invoking model %r (target model %s)", name, target or "-")
            entry.in_flight += 1
            try:
                return await run(entry.server)
            finally:
                entry.in_flight -= 1

        return await invocations.handle_with(request, route)

    async def no_default_model(request: Request) -> Response:
        return error(404, "this is a multi-model endpoint: invoke a model at /models/{model_name}/invoke")

    return [
        Route("/models", load, methods=["POST"]),
        Route("/models", listing, methods=["GET"]),
        Route("/models/{model_name:path}/invoke", invoke, methods=["POST"]),
        Route("/models/{model_name:path}", describe, methods=["GET"]),
        Route("/models/{model_name:path}", unload, methods=["DELETE"]),
        Route("/invocations", no_default_model, methods=["POST"]),
    ]
