"""The default inference handlers: a text classifier (one label, several labels, or a number per
text) trained by `byoc train`.

SageMaker's handler contract (as in the AWS inference toolkits): `model_fn(model_dir)`,
`input_fn(body, content_type)`, `predict_fn(data, model)`, `output_fn(prediction, accept)`.
`byoc serve` uses these unless the model's `code/inference.py` defines its own; every trained
model carries the template `code/inference.py`, which imports them from here and overrides one.

Request and response follow the Hugging Face inference DLC, so existing clients keep working:
    {"inputs": "text" | ["t1", ...] | [{"text": ..., "text_pair": ...}], "parameters": {"top_k": 2}}
    -> [{"label": "joy", "score": 0.98}]  (one entry per input; a list per input with top_k)
A multi-label model answers, per input, the list of labels scored at or above its threshold (a label's
own where training chose one; sigmoid scores, best first, possibly empty; "threshold" and "top_k"
parameters override); a regression
model {"score": value} (with "label", the target's name, when the model names it); a token classifier
its entities, [{"entity_group", "score", "word", "start", "end"}] ("aggregation_strategy" as the
pipeline's: byoc.tasks.token_classification.head). A parameter the model's task does not use is a 400
(byoc.serving.protocol.task_parameters); bodies are parsed by byoc.serving.protocol.bodies.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import orjson

from byoc import tasks
from byoc.serving import resources
from byoc.serving.backends import backend_choice, passes, runtimes
from byoc.serving.backends.loaded import LoadedModel, in_background
from byoc.serving.protocol import bodies, negotiation, outputs, task_parameters
from byoc.serving.protocol.bodies import CONTENT_TYPES, JSON_LINES, OPENAI, RERANK, valid_unicode
from byoc.serving.protocol.request_errors import (  # noqa: F401  (NON_FINITE: re-exported, as before)
    NON_FINITE,
    InputError,
    InvalidAnswer,
    NotAcceptable,
    UnsupportedMediaType,
)
from byoc.serving.settings import InferenceSettings
from byoc.tasks.kinds import Kind

ACCEPT_TYPES = ("application/json", "text/csv", *JSON_LINES)

logger = logging.getLogger(__name__)

# The server's settings, for the handler calls it makes (`serving_with`): model_fn's signature is the
# handler contract's, and a user's model_fn that calls this one passes nothing either. A context
# variable, not a module global: two servers in one process (tests, multi-model) each load with their own.
_settings: ContextVar[InferenceSettings | None] = ContextVar("byoc_inference_settings", default=None)


@contextmanager
def serving_with(settings: InferenceSettings) -> Iterator[None]:
    """`settings` are what `model_fn` (and `inference_threads`) see for the calls inside the block:
    the server wraps its handlers' import and its `model_fn` call in it."""
    token = _settings.set(settings)
    try:
        yield
    finally:
        _settings.reset(token)


def current_settings() -> InferenceSettings:
    """The calling server's settings; outside `byoc serve` (a notebook, a test), the environment's, read now."""
    settings = _settings.get()
    return settings if settings is not None else InferenceSettings.from_env()


def inference_threads(settings: InferenceSettings | None = None) -> int:
    """Threads one worker's model may use: OMP_NUM_THREADS, else (in the server) the container's CPUs /
    workers, else the container's CPUs (byoc.serving.resources). Users' model_fn size their own sessions
    with it (byoc.handlers re-exports it)."""
    return (settings or current_settings()).threads or resources.cpu_count()[0]


def model_fn(model_dir: str) -> LoadedModel:
    """Load tokenizer and classifier; weights come from safetensors only (nothing is unpickled).

    byoc.serving.backends.backend_choice picks the runtime from the host and BYOC_INFERENCE_BACKEND /
    BYOC_INFERENCE_PRECISION: ONNX Runtime on the CPU where there is no GPU; ONNX Runtime's CUDA
    execution provider on a GPU where onnxruntime-gpu is installed; else torch (on CUDA in half
    precision). On ONNX Runtime torch and transformers are never imported, which starts several
    times faster. Where ONNX Runtime was picked on its own (not asked for) and cannot load the
    graph (a stale graph, a CUDA provider that did not load), torch serves instead, with a warning.
    Either way the result is a `LoadedModel` (byoc.serving.backends.loaded: a mapping, as handlers read it);
    `logits(feeds)` runs one padded batch of numpy arrays.
    """
    folder = Path(model_dir)
    settings = current_settings()
    backend, precision = settings.backend, settings.precision
    host = runtimes.describe(folder, gpu=nvidia_gpu())
    plan = replace(backend_choice.choose(backend, precision, host), max_length=settings.max_length)
    logger.info("serving with %s", plan)
    bridge = backend_choice.bridge(plan, host, backend) if settings.cpu_while_loading else None
    loaded = _while_torch_loads(folder, bridge, plan, settings) if bridge else None
    if loaded is None and plan.backend == "onnxruntime":
        try:
            loaded = runtimes.load_onnx(folder, plan, inference_threads(settings), settings.task)
        except RuntimeError as err:  # GraphError: a stale graph is never used; a CUDA EP that did not load
            if plan.precision == "int8" or backend == "onnxruntime":
                raise
            plan = backend_choice.fallback(plan, precision, str(err))
            logger.warning("serving with torch instead of ONNX Runtime: %s", err)
    if loaded is None:
        loaded = _load_torch(folder, plan, settings)
    loaded.max_answer_values = settings.max_answer_values
    return loaded


def _load_torch(folder: Path, plan: backend_choice.Plan, settings: InferenceSettings) -> LoadedModel:
    return runtimes.load_torch(
        folder, plan, settings.compile, settings.allow_untrained_head, settings.task, settings.trust_remote_code
    )


def _while_torch_loads(
    folder: Path, bridge: backend_choice.Plan, plan: backend_choice.Plan, settings: InferenceSettings
) -> LoadedModel | None:
    """The model on ONNX Runtime on the CPU (`bridge`), answering while torch loads it on CUDA (`plan`) in the
    background: torch and CUDA take seconds to import and start (15 s on an H200 host), ONNX Runtime about
    one. The server swaps torch in between batches once it has loaded (LoadedModel.settle). None, after a
    warning, where the graph does not load: then torch is waited for, as without a bridge."""
    try:
        loaded = runtimes.load_onnx(folder, bridge, inference_threads(settings), settings.task)
    except RuntimeError as err:
        logger.warning("nothing answers while torch loads: ONNX Runtime could not load the graph (%s)", err)
        return None
    loaded.upgrade = in_background(lambda: _load_torch(folder, plan, settings), "byoc-torch-load")
    logger.info("answering on ONNX Runtime on the CPU %s", bridge.why)
    return loaded


def nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists()  # without importing torch (seconds) to ask


def choose_backend(model_dir: Path, int8: bool = False, gpu: bool | None = None) -> str:
    """onnxruntime or torch for this model, with BYOC_INFERENCE_BACKEND (`gpu`: default, whether an
    NVIDIA GPU is present); byoc.serving.backends.backend_choice.choose has the whole plan."""
    settings = current_settings()
    host = runtimes.describe(Path(model_dir), gpu=nvidia_gpu() if gpu is None else gpu)
    return backend_choice.choose(settings.backend, "int8" if int8 else settings.precision, host).backend


def input_fn(body: bytes | str, content_type: str = "application/json", *, one_text: bool = False) -> dict[str, Any]:
    """Parse a request into {"inputs": [text or (text, text_pair)], "parameters": {...}}, and "shape" where
    the body's form asks for an answer other than one per input (TEI's rerank body: "rerank"; OpenAI's
    embeddings body: "openai"; byoc.serving.protocol.outputs). The shape comes from the body's form alone:
    a client's "parameters" cannot set it.

    Everything a model could choke on is refused here, with a 4xx naming the input, before the
    request can join a batch with other clients' requests. `one_text`: each input is one text (a token
    classifier's; the server says so), so a CSV row of several fields is one text (byoc.serving.protocol.bodies)."""
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind not in CONTENT_TYPES:
        raise UnsupportedMediaType(f"unsupported content type {content_type!r}: send one of {', '.join(CONTENT_TYPES)}")
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    except UnicodeDecodeError as err:
        line = cast(bytes, body)[: err.start].count(b"\n") + 1
        raise InputError(f"the body is not UTF-8 text (byte {err.start}, line {line})") from None
    if not text.strip():
        raise InputError('the body is empty: send {"inputs": "a text"} or a list of texts')
    try:
        parsed = bodies.parse(text, kind, one_text)
    except RecursionError:
        raise InputError("the body is nested too deeply") from None
    parameters = parsed.parameters
    if not isinstance(parameters, dict):
        raise InputError('"parameters" must be a JSON object')
    task_parameters.check_values(parameters)
    inputs = parsed.inputs if parsed.checked else _normalise(parsed.inputs, parsed.key)
    data: dict[str, Any] = {"inputs": inputs, "parameters": parameters}
    if parsed.shape is not None:
        data["shape"] = parsed.shape
    return data


def _normalise(inputs: Any, key: str = "inputs") -> list[str | tuple[str, str]]:
    items = inputs if isinstance(inputs, list) else [inputs]
    if not items:
        raise InputError(f'"{key}" is empty: send a text or a list of texts')
    out: list[str | tuple[str, str]] = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            pair = item.get("text_pair")
            out.append((item["text"], pair) if isinstance(pair, str) else item["text"])
        elif isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(t, str) for t in item):
            out.append((item[0], item[1]))
        elif isinstance(item, str):
            out.append(item)
        else:
            raise InputError(
                f'input {index}: each input must be a string, [text, text_pair] or {{"text": ..., "text_pair": ...}}'
            )
        last = out[-1]
        if not (valid_unicode(last) if isinstance(last, str) else valid_unicode(last[0]) and valid_unicode(last[1])):
            raise InputError(f"input {index} is not valid Unicode text (a lone surrogate such as \\ud800)")
    return out


def predict_fn(data: dict[str, Any], model: dict[str, Any]) -> list[Any]:
    """Each input's answer, in the shape of the model's task (byoc.tasks: `Head.answer`): the best
    {"label", "score"} or the top_k of them; a multi-label model's labels at or above the threshold; a
    regression model's {"score": value}; a token classifier's entities. For a rerank body ("shape":
    "rerank") each pair's relevance, a number; for an OpenAI body ("shape": "openai") each text's
    `outputs.Embedded` (its vector and the tokens it ran, prompt included): the server builds the
    request's answer from them (byoc.serving.protocol.outputs)."""
    inputs, parameters, shape = data["inputs"], data.get("parameters", {}), data.get("shape")
    task = tasks.TASKS.get(model.get("task", tasks.DEFAULT))  # (the name config.json gave: runtimes)
    task_parameters.check_values(parameters)
    task_parameters.check_task(task, parameters, shape)  # a 400 for one the task does not use, never ignored
    if task is None:
        raise ValueError(f"the model dict names no task byoc knows: {model.get('task')!r} (byoc.tasks.NAMES)")
    try:
        if shape == RERANK:
            task.head.check_rerank(model)  # before the model runs: a model of single texts, an embedding model...
    except tasks.BadParameter as err:
        raise task_parameters.refused(err) from None
    direction = str(parameters.get("truncation_direction") or "right").lower()
    try:
        windowed = task.head.windows(inputs, parameters, model)  # a task that reads each text whole (NER)
        if direction == "left" and (windowed is not None or not isinstance(model, LoadedModel)):
            raise InputError(
                f'"truncation_direction": "left" does not apply to {task.described}: it cuts its texts its own way'
                if windowed is not None
                else '"truncation_direction": "left" needs the model byoc\'s model_fn loads (its encode cuts on either '
                "side); this one comes from the model's own code"
            )
        if windowed is not None:
            windowed.encode()
            answers = windowed.answers(passes.run(windowed.feeds, model, task.scores))
            if shape == OPENAI:  # (a hybrid model's dense vectors: each text its own feed, prompt none)
                return [outputs.Embedded(vector, len(f["input_ids"])) for vector, f in zip(answers, windowed.feeds)]
            return outputs.Answers(answers, task.head.kind_of(parameters))
        inputs = task.head.prepare(inputs, parameters, model)
    except tasks.BadParameter as err:
        raise task_parameters.refused(err) from None
    try:
        # (a model dict of a user's own model_fn may hold an encode of one argument: only byoc's is asked to cut left)
        encoded = model["encode"](inputs, "left") if direction == "left" else model["encode"](inputs)
    except Exception:  # a user's input_fn let through what the tokenizer cannot take: the input's fault
        _normalise(inputs)  # raises InputError naming it, if that is the cause
        raise
    try:
        encoded = task.head.encoded(encoded, parameters, model)  # (a generative reranker's template tail, where cut)
    except tasks.BadParameter as err:
        raise task_parameters.refused(err) from None
    # Shortest first, cut into batches of a bounded padded size: each batch pads only to its own
    # longest text (tweets of 5 and 60 tokens never share one); answers go back in request order.
    # On a GPU (model["passes"]) the passes are larger and padded to a few length buckets.
    scores = passes.run(encoded, model, task.scores)
    try:
        if shape == RERANK:  # each pair's relevance: the request's list is built once its answers are back
            raw = bool(parameters.get("raw_scores"))
            return outputs.Answers([task.head.relevance(row, raw, model) for row in scores], Kind.RELEVANCE)
        answers = task.head.answer(scores, model["id2label"], parameters, model)
    except tasks.BadParameter as err:
        raise task_parameters.refused(err) from None
    if shape == OPENAI:  # OpenAI's usage: the tokens each text ran, counted where they were made
        return [outputs.Embedded(vector, len(e["input_ids"])) for vector, e in zip(answers, encoded)]
    return outputs.Answers(answers, task.head.kind_of(parameters))  # (output_fn writes them by their kind)


# The server may merge concurrent requests into one call: this predict_fn takes
# {"inputs": [...], "parameters": {...}} and returns one result per input, in order
# (byoc.serving.user_code.handler_loader.Handlers.batchable reads this flag).
predict_fn.batchable = True  # type: ignore[attr-defined]


def json_text(value: Any) -> str:
    """`value` as JSON text; ValueError for NaN or Infinity, which JSON does not have, as json's
    allow_nan=False. orjson writes it: 25x json's speed on an embedding's floats (the same numbers,
    shortest round-trip, without json's spaces). It writes NaN and infinity as null: where the text holds
    the word (a None, or a text with "null" in it, such as an OpenAI body's echoed model name), the value
    is searched for a non-finite float, in C a list at a time, rather than written again by json. A type
    orjson refuses and json takes (a float subclass, an int key) is written by json."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, allow_nan=False)
    if b"null" in text and _non_finite(value):
        raise ValueError("Out of range float values are not JSON compliant")
    return text.decode()


def _non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in `value` (lists, tuples and dicts of any depth). A list
    of numbers is summed in C: a finite sum proves every term finite; a non-finite one (or a list of other
    things) is looked at term by term."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        try:
            total = sum(value)
        except TypeError:  # not all numbers: each term in turn
            return any(_non_finite(v) for v in value)
        return isinstance(total, float) and not math.isfinite(total) and any(_non_finite(v) for v in value)
    return False


def output_fn(prediction: list[Any], accept: str = "application/json") -> tuple[str, str]:
    """Serialise as JSON (default), JSON Lines or CSV: one line per input, `label,score` (a list of
    labels: each label and score in turn on the line, an empty list an empty field; a regression
    value alone: `score`; a vector: its components; a rerank entry: `index,score`). A whole-request
    object (OpenAI's embeddings answer) is one JSON value. `accept` is the type the server chose
    (byoc.serving.protocol.negotiation); a full Accept header (lists, weights, wildcards) works too."""
    kind = accept if accept in ACCEPT_TYPES else negotiation.choose(accept, ACCEPT_TYPES, "application/json")
    try:
        if kind == "application/json" or (kind in JSON_LINES and isinstance(prediction, dict)):
            return json_text(prediction), kind
        if kind in JSON_LINES:
            return "\n".join(json_text(p) for p in prediction) + "\n", kind
    except ValueError as err:
        raise InvalidAnswer(NON_FINITE) from err
    if kind == "text/csv":
        if isinstance(prediction, dict):
            raise NotAcceptable("this answer (OpenAI's embeddings object) is one JSON object: ask for application/json")
        return outputs.csv_text(prediction), "text/csv"  # (written by the answers' kind)
    shown = accept if len(accept) <= 100 else accept[:100] + "..."
    raise NotAcceptable(f"unsupported accept type {shown!r}: ask for one of {', '.join(ACCEPT_TYPES)}")
