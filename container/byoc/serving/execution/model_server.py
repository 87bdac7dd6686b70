"""The model behind `byoc serve`: its handlers, its one inference thread, its health, and the path
of one request through the handlers (negotiate, parse, admit, predict, answer).

Health is what `/ping` answers: the model loaded, the batching task running, and no inference call
running for longer than the request timeout (a stuck call: every request would wait for it and time
out, so the endpoint says so and SageMaker can replace the host).

The model's calls (`model_fn`, `predict_fn`, `transform_fn`) run on one inference thread. A user's
`input_fn` and `output_fn` run on threads of their own (byoc.serving.execution.threads: daemons, started while every
one is busy), never on the event loop: a slow or hung one costs its own request a 504 and nothing
else. byoc's own `input_fn`/`output_fn` parse and write small bodies on the event loop (bounded
work, and a thread hop per request would fight the inference thread for the GIL), large ones on
those threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from byoc.errors import UserError
from byoc.serving import default_pipeline
from byoc.serving.backends.loaded import LoadedModel
from byoc.serving.execution import long_texts
from byoc.serving.execution.batching import Batcher, guarded, timed
from byoc.serving.execution.memory import release_memory
from byoc.serving.execution.threads import DaemonThreads
from byoc.serving.prometheus import NO_METRICS, ModelMetrics
from byoc.serving.protocol import bodies, negotiation, outputs
from byoc.serving.protocol.request_errors import InputError, InvalidAnswer, NotAcceptable, PayloadTooLarge
from byoc.serving.settings import JSON, ServeSettings
from byoc.serving.user_code.handler_loader import HandlerError, Handlers, call, forget_isolated, load_handlers

logger = logging.getLogger(__name__)

SWITCH_INTERVAL = 0.0005
INLINE_LIMIT = 256 * 1024  # bodies below this are parsed (and their answers written) on the event loop
# Answers of more values than this (inputs x each one's width: 16 vectors of 384 are 6,144) are written on
# a handler thread: as CSV a value takes about 1 us to format, so the event loop holds at most ~10 ms.
INLINE_CELLS = 8192
INLINE_ANSWERS = 1024  # answers counted on the event loop (a step each); more are counted and written off it


class ModelServer:
    """The loaded model, its handlers and the inference thread; shared by the routes.

    One model of many (multi-model endpoints: byoc.serving.multi_model) shares its inference thread and
    its handler threads with the others (`executor`, `handler_threads`), and has a `name`: its code is
    imported under a module name of its own."""

    def __init__(
        self,
        settings: ServeSettings,
        executor: DaemonThreads | None = None,
        handler_threads: DaemonThreads | None = None,
        name: str | None = None,
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.metrics = metrics or NO_METRICS  # this model's series (byoc.serving.prometheus)
        self.handlers: Handlers | None = None
        self.model: Any = None
        self.error: str | None = None  # why the model could not load
        self.fatal: str | None = None  # why this worker gave up serving (it is being replaced)
        self.ready = threading.Event()
        self.executor = executor or DaemonThreads(1, "byoc-inference")
        # A user's input_fn/output_fn: as many at once as invocations may be in flight.
        self.handler_threads = handler_threads or DaemonThreads(settings.max_concurrency, "byoc-handler")
        self.batcher: Batcher | None = None
        self.busy_since: float | None = None  # when the inference call now running began
        self.code_name = f"byoc_model_{id(self):x}"  # one model of many: its code's private module name

    def start(self, on_death: Callable[[str], None], loader: DaemonThreads | None = None) -> asyncio.Future:
        """Load the model (in the inference thread, or on `loader`'s while other models infer) and
        start batching (on the running event loop); returns the load's future. `on_death(reason)` is
        called if the batching task dies: this server then reports itself unable to serve for good."""
        loading = asyncio.get_running_loop().run_in_executor(loader or self.executor, self.load)
        self.batcher = Batcher(
            self.predict_batch,
            self.executor,
            self.settings.max_batch,
            None if self.settings.max_delay_ms is None else self.settings.max_delay_ms / 1000,
            self.settings.max_queued_inputs,
            on_death=lambda reason: self._died(reason, on_death),
            observer=self.metrics,
        )
        self.batcher.start()
        return loading

    def _died(self, reason: str, on_death: Callable[[str], None]) -> None:
        self.fatal = f"this worker is restarting: {reason}"
        on_death(reason)

    async def stop(self, shared: bool = False) -> None:
        """Stop batching and let the threads go (a hung handler's thread is a daemon: never waited for);
        `shared`: the threads are other models' too, and stay."""
        if self.batcher is not None:
            await self.batcher.stop()
        if not shared:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.handler_threads.shutdown(wait=False, cancel_futures=True)

    def forget(self) -> None:
        """Drop the model and its handlers (an unloaded model of many: its memory goes back)."""
        self.model = self.handlers = self.batcher = None
        self.ready.clear()
        self.fatal = "the model was unloaded"
        forget_isolated(self.settings.model_dir, self.code_name)

    def load(self) -> None:
        """Runs in the inference thread at start-up (torch state stays on the thread that uses it)."""
        started = time.monotonic()
        # The inference thread gives up the GIL inside every torch op and must win it back after;
        # with the default 5 ms switch interval a busy event loop makes it wait that long each time.
        sys.setswitchinterval(SWITCH_INTERVAL)
        # Progress bars are carriage-return noise in CloudWatch (transformers reads this at import).
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            threads = _split_cores(self.settings)
            isolated = self.code_name if self.name is not None else None
            # The default handlers load with this server's settings (its share of the cores among them).
            with default_pipeline.serving_with(replace(self.settings.inference, threads=threads)):
                self.handlers = load_handlers(self.settings.model_dir, self.settings.program, isolated)
                accept_types = self.handlers.accept_types
                if accept_types and self.settings.default_accept not in accept_types:
                    raise HandlerError(
                        f"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT={self.settings.default_accept}: the default "
                        f"output_fn writes {', '.join(accept_types)}"
                    )
                self.model = call(self.handlers.model_fn, "model_fn", str(self.settings.model_dir))
        except BaseException as err:  # SystemExit too (argparse in a model_fn): a failed start, never a hang
            self.error = f"{type(err).__name__}: {err}"
            if isinstance(err, UserError):  # its message says what to change: the traceback would bury it
                logger.error("loading the model from %s failed: %s", self.settings.model_dir, err)
            else:
                logger.exception("loading the model from %s failed", self.settings.model_dir)
            return
        self.ready.set()
        logger.info("model loaded from %s in %.1f s; ready", self.settings.model_dir, time.monotonic() - started)

    def problem(self) -> str | None:
        """Why this worker cannot serve now (/ping answers 503 with it), or None when it can."""
        if self.fatal:
            return self.fatal
        if not self.ready.is_set():
            return f"the model failed to load: {self.error}" if self.error else "the model is still loading"
        if self.batcher is not None and not self.batcher.alive:
            return self.batcher.death or "the batching task is not running"
        return self.stuck()

    def stuck(self) -> str | None:
        began = self.busy_since
        if began is not None and time.monotonic() - began > self.settings.timeout:
            return (
                f"an inference call has been running for {time.monotonic() - began:.0f} s, over the "
                f"{self.settings.timeout:g} s of SAGEMAKER_MODEL_SERVER_TIMEOUT"
            )
        return None

    def predict_batch(self, inputs: list[Any], parameters: dict[str, Any], shape: str | None = None) -> list[Any]:
        """The batcher's predict, in the inference thread."""
        assert self.handlers is not None and self.handlers.predict_fn is not None  # batching implies both
        self.busy_since = time.monotonic()
        self._settle()
        try:
            data = {"inputs": inputs, "parameters": parameters, **({"shape": shape} if shape is not None else {})}
            return call(self.handlers.predict_fn, "predict_fn", data, self.model)
        finally:
            self.busy_since = None
            if self.batcher is not None and self.batcher.idle:
                release_memory()

    def _settle(self) -> None:
        """On the inference thread, between calls: the model loaded in the background takes over once it has
        (torch on CUDA after ONNX Runtime on the CPU answered meanwhile: LoadedModel.settle), whichever
        predict_fn runs, a user's included."""
        if isinstance(self.model, LoadedModel):
            self.model.settle()

    async def in_thread(self, fn: Any, *args: Any) -> Any:
        """One unbatched handler call in the inference thread, timed like the batched ones."""
        called = time.perf_counter()
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._timed, fn, args, called)

    def _timed(self, fn: Any, args: tuple, called: float) -> Any:
        self.busy_since = time.monotonic()
        self.metrics.waited(time.perf_counter() - called)  # for the inference thread: the queue of unbatched calls
        self._settle()
        try:
            return timed(self.metrics, 1, fn, *args)
        finally:
            self.busy_since = None

    def negotiate(self, header: str | None) -> str:
        """The answer's type, chosen once, before the model runs (406 here, never after it)."""
        assert self.handlers is not None
        default, offered = self.settings.default_accept, self.handlers.accept_types
        if not offered:  # the user's output_fn or transform_fn: the header, as the AWS toolkits pass it
            return negotiation.passthrough(header, default)
        chosen = negotiation.choose(header, offered, default)
        if chosen is None:
            raise NotAcceptable(f"unsupported accept type {_quote(header)}: ask for one of {', '.join(offered)}")
        return chosen

    async def invoke(self, body: bytes, content_type: str, accept_header: str | None) -> Answer | Any:
        """The handlers' answer to one request: an `Answer`, or a response object a handler made itself
        (an output_fn returning a Starlette Response), which the HTTP side sends as it is.

        What protects the server holds whatever the model's own code overrides: the limits on inputs and
        text, and the answer's shape (rerank, OpenAI) from the body's form, apply around any predict_fn;
        only the long texts' steps need the default predict_fn (they run its work in parts)."""
        handlers, batcher = self.handlers, self.batcher
        assert handlers is not None and batcher is not None  # the routes call this only once the model is ready
        accept = self.negotiate(accept_header)
        batcher.check_room()  # a full queue refuses before the body is parsed, not after
        if handlers.transform_fn is not None:
            result = await self.in_thread(
                call, handlers.transform_fn, "transform_fn", self.model, body, content_type, accept
            )
            return self._response(result, accept)
        assert handlers.input_fn is not None and handlers.predict_fn is not None  # set wherever transform_fn is None
        try:
            data = await self._parse(handlers, body, content_type)
        except InputError:
            raise
        except (ValueError, TypeError, KeyError, UnicodeError, RecursionError) as err:  # a user input_fn refusing it
            raise InputError(f"malformed input: {err}") from None
        finally:
            if len(body) >= INLINE_LIMIT:
                release_memory()  # a large body parsed (or refused): its memory goes back to the system
        self._check_text(long_texts.whole_text_chars(self.model, data))
        stepwise = long_texts.stepwise(self.model, data) if handlers.is_default("predict_fn") else None
        if stepwise is not None:
            self._check_count(len(stepwise.texts))
            prediction = await self._in_steps(stepwise)
        elif handlers.batchable and _batch_shaped(data):
            inputs = data["inputs"]
            self._check_count(len(inputs))
            prediction = await batcher.submit(inputs, data.get("parameters") or {}, data.get("shape"))
        else:
            prediction = await self.in_thread(call, handlers.predict_fn, "predict_fn", data, self.model)
        builtin = handlers.is_default("output_fn")
        # Written on the event loop only when both the request and its answer are small: an embedding
        # answer is about 2,000x its request (4,096 one-letter texts to a 1,024-wide model: 4 M floats), a
        # multi-vector one a vector a token. (Past INLINE_ANSWERS answers, even counting them waits.)
        count = len(prediction) if isinstance(prediction, list) else 1
        small = len(body) < INLINE_LIMIT and count <= INLINE_ANSWERS and outputs.cells(prediction) <= INLINE_CELLS
        result = await self._handler(self._write, builtin and small, data, prediction, accept)
        return self._response(result, accept)

    def _write(self, data: Any, prediction: Any, accept: str) -> Any:
        """The request's answer in the shape its body's form asked for (any predict_fn's answers: rerank,
        OpenAI; byoc.serving.protocol.outputs), written by the output_fn; a 413 for an answer of more
        numbers than the server answers, whoever's predict_fn made it, before it is written."""
        assert self.handlers is not None and self.handlers.output_fn is not None
        limit = self.settings.inference.max_answer_values
        values = outputs.cells(prediction)
        if limit and values > limit:
            raise PayloadTooLarge(
                f"the answer holds {values:,} numbers, over the {limit:,} one answer may hold "
                "(BYOC_MAX_ANSWER_VALUES; by default what SAGEMAKER_MAX_PAYLOAD_IN_MB holds, SageMaker's response "
                'limit): send fewer texts a request, or ask for less of each ("dimensions", "top_k")'
            )
        if isinstance(data, dict) and data.get("shape") is not None:
            prediction = outputs.shaped(data, prediction)
        return call(self.handlers.output_fn, "output_fn", prediction, accept)

    async def _in_steps(self, work: long_texts.Stepwise) -> list[Any]:
        """Long texts a few windows at a time in the inference thread: the batches of other requests, queued
        on the same thread meanwhile, run between the steps instead of waiting for the whole request."""
        for step in work.steps():
            await self.in_thread(step)
        return await self.in_thread(work.answers)

    async def _parse(self, handlers: Handlers, body: bytes, content_type: str) -> Any:
        if not handlers.is_default("input_fn"):
            return await self._handler(call, False, handlers.input_fn, "input_fn", body, content_type)
        return await self._handler(self._default_input, len(body) < INLINE_LIMIT, body, content_type)

    def _default_input(self, body: bytes, content_type: str) -> Any:
        """byoc's input_fn, after counting the inputs without building them: a body of a million tiny
        inputs is refused as soon as the count passes the limit, not after a full parse."""
        if bodies.too_many_inputs(body, content_type, self.settings.max_inputs):
            self._check_count(self.settings.max_inputs + 1, counted=False)
        return default_pipeline.input_fn(body, content_type, one_text=long_texts.reads_whole(self.model))

    def _check_count(self, count: int, counted: bool = True) -> None:
        """413 past BYOC_MAX_INPUTS_PER_REQUEST (`counted`: the exact count is known, not just that it is over)."""
        if count > self.settings.max_inputs:
            how_many = str(count) if counted else f"more than {self.settings.max_inputs}"
            raise PayloadTooLarge(
                f"the request has {how_many} inputs, over the limit of {self.settings.max_inputs} "
                "(BYOC_MAX_INPUTS_PER_REQUEST): send them in several requests"
            )

    def _check_text(self, chars: int) -> None:
        """413 past BYOC_MAX_TEXT_CHARS_PER_REQUEST: the work of a model that reads each text whole grows with it."""
        if chars > self.settings.max_text_chars:
            raise PayloadTooLarge(
                f"the request's texts hold {chars} characters, over the limit of {self.settings.max_text_chars} "
                "a token classifier reads in one request (BYOC_MAX_TEXT_CHARS_PER_REQUEST, sized to answer "
                "within the invocation timeout): send the text in parts, or raise the limit together with "
                "SAGEMAKER_MODEL_SERVER_TIMEOUT (an asynchronous endpoint: BYOC_PROFILE=async)"
            )

    async def _handler(self, fn: Any, inline: bool, *args: Any) -> Any:
        """A request handler: byoc's own on the event loop where its work is bounded and small (`inline`),
        anything else on a thread."""
        if inline:
            return guarded(fn, *args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.handler_threads, guarded, fn, *args)

    def _response(self, result: Any, accept: str) -> Answer | Any:
        """Handlers return (body, content_type) or just a body (or their own response object)."""
        if _is_response(result):
            return result
        if isinstance(result, tuple) and len(result) == 2:
            body, content_type = result
        else:
            body = result
            content_type = accept if negotiation.is_concrete(accept) else self.settings.default_accept
        if not isinstance(body, (str, bytes)):
            body, content_type = to_json(body), JSON
        return Answer(body, content_type)


@dataclass(frozen=True)
class Answer:
    """One request's answer, as the handlers made it: the HTTP side sends it with status 200."""

    body: str | bytes
    content_type: str


def _is_response(result: Any) -> bool:
    """A response object an output_fn built itself (Starlette's, or one shaped like it): passed through."""
    return all(hasattr(result, name) for name in ("body", "status_code", "media_type", "headers"))


def to_json(value: Any) -> str:
    """JSON, never with NaN or Infinity (which JSON does not have, and clients fail to parse)."""
    try:
        return default_pipeline.json_text(value)
    except ValueError as err:
        raise InvalidAnswer(default_pipeline.NON_FINITE) from err


def _quote(header: str | None, limit: int = 100) -> str:
    """A client's header in an error message, cut short: never echo a huge header back."""
    text = repr(header)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(header or '')} characters)"


def _batch_shaped(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("inputs"), list)
        and isinstance(data.get("parameters") or {}, dict)
    )


def _split_cores(settings: ServeSettings) -> int:
    """Several workers share the cores instead of each taking them all (oversubscribed threads slow
    everything several-fold): OMP_NUM_THREADS where set, else cores / workers; returns the number,
    which the default handlers get with the rest of their settings (ONNX Runtime's threads).
    OMP_NUM_THREADS is written before the handlers load: torch reads it at import."""
    threads = settings.threads
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")  # imported already (a user's code): set it directly too
    if torch is not None:
        torch.set_num_threads(threads)
    logger.info("worker %d: %d inference threads", os.getpid(), threads)
    return threads
