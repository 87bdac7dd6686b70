"""`byoc serve`'s settings: SageMaker's variables and byoc's own, read and checked once, at start
(byoc.environment), and passed down; docs/settings.md lists them all.

A value that is not a number, or out of its range (`BYOC_MAX_BATCH_SIZE=0` made every request fail,
a negative one hung them), stops the server at start with a message naming the variable, instead of
failing the requests. An empty variable is unset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from byoc import tasks
from byoc.contract import Paths
from byoc.environment import Environment, SettingError
from byoc.logs import log_level
from byoc.serving.backends.backend_choice import (
    ALLOW_UNTRAINED_HEAD_ENV,
    BACKENDS,
    CPU_WHILE_LOADING_ENV,
    INFERENCE_BACKEND_ENV,
    INFERENCE_COMPILE_ENV,
    INFERENCE_PRECISION_ENV,
    PRECISIONS,
)
from byoc.serving.resources import Resources, read_resources

JSON = "application/json"
TASK_ENV = "BYOC_TASK"
TRUST_REMOTE_CODE_ENV = "BYOC_TRUST_REMOTE_CODE"  # run a model folder's own code (auto_map) when torch loads it
PROFILES = ("realtime", "async")
# BYOC_PROFILE=async: the defaults an asynchronous endpoint needs (payloads up to 1 GB from S3, an
# invocation timeout of up to an hour, requests of many inputs); each variable still wins where set.
ASYNC_DEFAULTS: dict[str, int] = {
    "SAGEMAKER_MAX_PAYLOAD_IN_MB": 1024,
    "SAGEMAKER_MODEL_SERVER_TIMEOUT": 3600,
    "BYOC_MAX_INPUTS_PER_REQUEST": 1_000_000,
    "BYOC_MAX_QUEUED_INPUTS": 2_000_000,
    "BYOC_MAX_TEXT_CHARS_PER_REQUEST": 5_000_000,
    "BYOC_BODY_TIMEOUT": 900,
}
SERVER_HEADROOM = 256 << 20  # the server's own memory (Python, ONNX Runtime, uvicorn) and a margin


class ServeSettingsError(SettingError):
    """A serving variable the server cannot run with: the message names it and its allowed range."""


@dataclass(frozen=True)
class InferenceSettings:
    """How the default handlers load the model (byoc.serving.default_pipeline and
    byoc.serving.backends.backend_choice)."""

    backend: str = "auto"  # BYOC_INFERENCE_BACKEND: auto, onnxruntime or torch
    precision: str = "auto"  # BYOC_INFERENCE_PRECISION: auto, fp32, fp16, bf16 or int8
    compile: bool = False  # BYOC_INFERENCE_COMPILE: torch compiles per bucket shape
    # BYOC_CPU_WHILE_LOADING: torch on CUDA picked on its own, ONNX Runtime on the CPU answers until it has loaded
    cpu_while_loading: bool = True
    threads: int | None = None  # OMP_NUM_THREADS: the model's threads; None: the server's share of the cores
    # BYOC_ALLOW_UNTRAINED_HEAD: serve a folder whose classification head is missing (random answers)
    allow_untrained_head: bool = False
    # BYOC_TASK: serve the folder as this task (a byoc.tasks name or alias: `embedding` for an encoder with
    # no head); None: as the folder says (modules.json: an embedding model; else config.json)
    task: str | None = None
    # BYOC_TRUST_REMOTE_CODE: run the code a model folder ships (auto_map) when torch loads it; never fetched.
    # The graph (model.onnx) serves without running it.
    trust_remote_code: bool = False
    # BYOC_MAX_ANSWER_VALUES: the numbers one request's answer may hold (413 above, refused before the answer is
    # built). By default what the response limit holds (ServeSettings: SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB, SageMaker's
    # for a real-time endpoint) at 4 bytes a number, the most compact form byoc writes (base64 float32), so an
    # answer refused is over that limit in every format.
    max_answer_values: int = 1_572_864  # (answer_values_of(6))
    # The tokens an input is cut to, under the model's own limit; None: the model's (byoc encode's max_length)
    max_length: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> InferenceSettings:
        read = Environment(env, error=ServeSettingsError)
        return cls(
            backend=read.choice(INFERENCE_BACKEND_ENV, "auto", BACKENDS),
            precision=read.choice(INFERENCE_PRECISION_ENV, "auto", PRECISIONS),
            compile=read.flag(INFERENCE_COMPILE_ENV),
            cpu_while_loading=read.flag(CPU_WHILE_LOADING_ENV, True),
            threads=read.integer("OMP_NUM_THREADS", None, 1),
            allow_untrained_head=read.flag(ALLOW_UNTRAINED_HEAD_ENV),
            task=_task(read.text(TASK_ENV)),
            trust_remote_code=read.flag(TRUST_REMOTE_CODE_ENV),
        )


def answer_values_of(payload_mb: float) -> int:
    """The numbers an answer of `payload_mb` MB holds at 4 bytes each (base64 float32, byoc's most compact form):
    6 MB, SageMaker's response limit for a real-time endpoint, holds 1,572,864 (4,096 texts x 384 dimensions)."""
    return max(1, int(payload_mb * (1 << 20)) // 4)


def _task(value: str | None) -> str | None:
    """BYOC_TASK's canonical task name; a name byoc does not know stops the server, naming the ones it does."""
    if value is None:
        return None
    name = tasks.name_of(value)
    if name is None:
        raise ServeSettingsError(
            f"{TASK_ENV}={value!r} names no task: set one of {', '.join(tasks.NAMES)}, or unset it"
        )
    return name


@dataclass(frozen=True)
class ServeSettings:
    """Everything the server reads from the environment (SageMaker's variables and byoc's own)."""

    model_dir: Path
    model_dir_named_by: str = ""  # SM_MODEL_DIR or SAGEMAKER_BASE_DIR where one named it; "": the default
    port: int = 8080
    workers: int = 1
    timeout: float = 60.0
    max_payload_mb: float = 6.0
    default_accept: str = JSON
    batch_strategy: str = "MULTI_RECORD"
    max_concurrent_transforms: int = 0
    max_batch: int = 128
    max_delay_ms: float | None = None  # None (unset, `auto`): adaptive (byoc.serving.execution.batching)
    graceful_timeout: int = 25
    max_inputs: int = 4096  # per request (413 above): about 15 s of a MiniLM on 2 cores, inside the 60 s timeout
    # Characters of text one request may give a model that reads every text whole (a token classifier covers
    # a long text in windows; a classifier cuts it at its max_length): 413 above. About 3 s of MiniLM-L6 and
    # 25 s of BERT-base on 2 cores: one request's work stays well inside the 60 s timeout.
    max_text_chars: int = 50_000
    max_queued_inputs: int = 16384  # waiting for the model, all requests together (503 + Retry-After above)
    max_concurrency: int = 256  # invocations one worker answers at once (503 + Retry-After above; /ping never)
    max_connections: int = (
        1024  # open connections; past it the longest-idle one is closed (byoc.serving.http.connections)
    )
    keep_alive_timeout: float = 75.0  # a connection idle this long is closed (SageMaker keeps its own 60 s)
    header_timeout: float = 15.0  # a request's headers complete within this of their first byte (408)
    body_timeout: float = 30.0  # a request's body complete within this of its headers (408)
    max_header_bytes: int = 64 * 1024  # a request's line and headers (431 above)
    program: str = "inference.py"  # the handler file in model/code/
    inference: InferenceSettings = InferenceSettings()
    log_level: str = "INFO"  # BYOC_LOG_LEVEL (byoc.logs sets it up; read here to stop on a bad value)
    multi_model: bool = False  # SAGEMAKER_MULTI_MODEL: models load on POST /models (byoc.serving.multi_model)
    multi_model_memory_mb: int | None = None  # BYOC_MULTI_MODEL_MEMORY_MB; None: the container's memory less headroom
    # BYOC_MULTI_MODEL_LOAD_TIMEOUT: seconds a load may take (multi-model-server's own default, 120 s)
    multi_model_load_timeout: float = 120.0
    resources: Resources = Resources(cpus=1, memory=None)  # the container's CPUs and memory (byoc.serving.resources)
    profile: str = "realtime"  # BYOC_PROFILE: async raises the limits an asynchronous endpoint needs (ASYNC_DEFAULTS)
    metrics: bool = True  # BYOC_METRICS: GET /metrics, Prometheus (byoc.serving.prometheus)
    metrics_dir: str | None = None  # PROMETHEUS_MULTIPROC_DIR: where several workers share their values

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, resources: Resources | None = None) -> ServeSettings:
        """The settings in `env` (os.environ when None), on a host with `resources` (read from this
        process's cgroup when None)."""
        read = Environment(env, error=ServeSettingsError)
        profile = read.choice("BYOC_PROFILE", "realtime", PROFILES)

        def default(name: str, value: int) -> int:
            return ASYNC_DEFAULTS.get(name, value) if profile == "async" else value

        timeout_name = (  # SageMaker's newer name, where only it is set
            "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS"
            if read.is_set("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS")
            and not read.is_set("SAGEMAKER_MODEL_SERVER_TIMEOUT")
            else "SAGEMAKER_MODEL_SERVER_TIMEOUT"
        )
        paths = Paths.from_env(env)
        named_by = "SM_MODEL_DIR" if paths.model_dir_override else ""
        settings = cls(
            model_dir=paths.model_dir,  # the training contract's rule: an empty variable is unset
            model_dir_named_by=named_by or ("SAGEMAKER_BASE_DIR" if read.is_set("SAGEMAKER_BASE_DIR") else ""),
            port=read.integer("SAGEMAKER_BIND_TO_PORT", 8080, 1, 65535),
            workers=read.integer("SAGEMAKER_MODEL_SERVER_WORKERS", 1, 1),
            timeout=read.number(timeout_name, float(default("SAGEMAKER_MODEL_SERVER_TIMEOUT", 60)), positive=True),
            max_payload_mb=read.number(
                "SAGEMAKER_MAX_PAYLOAD_IN_MB", float(default("SAGEMAKER_MAX_PAYLOAD_IN_MB", 6)), positive=True
            ),
            default_accept=_media_type(read.text("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or JSON),
            batch_strategy=read.text("SAGEMAKER_BATCH_STRATEGY") or "MULTI_RECORD",
            max_concurrent_transforms=read.integer("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", 0, 0),
            max_batch=read.integer("BYOC_MAX_BATCH_SIZE", 128, 1),
            max_delay_ms=_batch_delay(read),
            graceful_timeout=read.integer("BYOC_GRACEFUL_TIMEOUT", 25, 0),
            max_inputs=read.integer("BYOC_MAX_INPUTS_PER_REQUEST", default("BYOC_MAX_INPUTS_PER_REQUEST", 4096), 1),
            max_text_chars=read.integer(
                "BYOC_MAX_TEXT_CHARS_PER_REQUEST", default("BYOC_MAX_TEXT_CHARS_PER_REQUEST", 50_000), 1
            ),
            max_queued_inputs=read.integer("BYOC_MAX_QUEUED_INPUTS", default("BYOC_MAX_QUEUED_INPUTS", 16384), 1),
            max_concurrency=read.integer("BYOC_MAX_CONCURRENCY", 256, 1),
            keep_alive_timeout=read.number("BYOC_KEEP_ALIVE_TIMEOUT", 75.0, positive=True),
            header_timeout=read.number("BYOC_HEADER_TIMEOUT", 15.0, positive=True),
            body_timeout=read.number("BYOC_BODY_TIMEOUT", float(default("BYOC_BODY_TIMEOUT", 30)), positive=True),
            max_header_bytes=read.integer("BYOC_MAX_HEADER_BYTES", 64 * 1024, 1024),
            program=read.text("SAGEMAKER_PROGRAM") or "inference.py",
            inference=InferenceSettings.from_env(env),
            log_level=log_level(read),
            multi_model=read.flag("SAGEMAKER_MULTI_MODEL"),
            multi_model_memory_mb=read.integer("BYOC_MULTI_MODEL_MEMORY_MB", None, 64),
            multi_model_load_timeout=read.number("BYOC_MULTI_MODEL_LOAD_TIMEOUT", 120.0, positive=True),
            resources=resources or read_resources(),
            profile=profile,
            metrics=read.flag("BYOC_METRICS", default=True),
            metrics_dir=read.text("PROMETHEUS_MULTIPROC_DIR"),
        )
        answer_values = read.integer("BYOC_MAX_ANSWER_VALUES", answer_values_of(settings.max_payload_mb), 1)
        settings = replace(settings, inference=replace(settings.inference, max_answer_values=answer_values))
        connections = read.integer("BYOC_MAX_CONNECTIONS", 4 * settings.max_concurrency, 1)
        if connections < settings.max_concurrency:
            raise ServeSettingsError(
                f"BYOC_MAX_CONNECTIONS={connections} is under BYOC_MAX_CONCURRENCY={settings.max_concurrency}: "
                "every request in flight needs its connection; raise the first"
            )
        settings = replace(settings, max_connections=connections)
        if settings.multi_model and settings.workers > 1:
            # Each worker process would hold its own registry: a load reaches one of them, about half
            # the invocations would answer 404 and the memory budget would count once per worker.
            raise ServeSettingsError(
                f"SAGEMAKER_MODEL_SERVER_WORKERS={settings.workers} with SAGEMAKER_MULTI_MODEL=true: a multi-model "
                "endpoint runs one worker (its models share one registry, one memory budget and one inference "
                "thread); unset SAGEMAKER_MODEL_SERVER_WORKERS or set it to 1"
            )
        if settings.max_inputs > settings.max_queued_inputs:
            raise ServeSettingsError(
                f"BYOC_MAX_INPUTS_PER_REQUEST={settings.max_inputs} is over BYOC_MAX_QUEUED_INPUTS="
                f"{settings.max_queued_inputs}: a request that large could never be queued; raise the second"
            )
        return settings

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 1024 * 1024)

    @property
    def threads(self) -> int:
        """The model's threads: OMP_NUM_THREADS where set, else this container's CPUs / workers."""
        return self.inference.threads or max(1, self.resources.cpus // self.workers)

    @property
    def multi_model_budget(self) -> int:
        """Bytes the models of a multi-model endpoint may take together: BYOC_MULTI_MODEL_MEMORY_MB, else
        the container's memory (its cgroup limit, else the machine's) less the server's headroom."""
        if self.multi_model_memory_mb is not None:
            return self.multi_model_memory_mb << 20
        usable = self.resources.usable_memory or 4 << 30
        return max(64 << 20, usable - max(SERVER_HEADROOM, usable // 10))


def _batch_delay(read: Environment) -> float | None:
    """BYOC_MAX_BATCH_DELAY_MS: milliseconds, or None for the adaptive wait (unset or `auto`)."""
    raw = read.raw("BYOC_MAX_BATCH_DELAY_MS")
    if raw is None or raw.lower() == "auto":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ServeSettingsError(
            f"BYOC_MAX_BATCH_DELAY_MS={raw!r}: must be a number of milliseconds, 0 or more, or auto (the default: "
            "under concurrent load a batch waits up to 5 ms for the clients it last answered; 0 never waits)"
        )
    return value


def _media_type(value: str) -> str:
    kind, slash, sub = value.strip().lower().partition("/")
    if not (slash and kind and sub) or "*" in value or "," in value or ";" in value:
        raise ServeSettingsError(
            f"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT={value!r}: must be one media type such as application/json"
        )
    return value.strip().lower()
