"""`byoc serve`'s settings: SageMaker's variables and byoc's own, read and checked once, at start.

A value that is not a number, or out of its range (`BYOC_MAX_BATCH_SIZE=0` made every request fail,
a negative one hung them), stops the server at start with a message naming the variable, instead of
failing the requests. An empty variable is unset.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from byoc.contract import Paths, base_dir
from byoc.errors import UserError

JSON = "application/json"


class ServeSettingsError(UserError, ValueError):
    """A serving variable the server cannot run with: the message names it and its allowed range."""


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
    max_inputs: int = 4096  # per request (413 above): about 15 s of a MiniLM on 2 cores, inside the 60 s timeout
    max_queued_inputs: int = 16384  # waiting for the model, all requests together (503 + Retry-After above)
    max_concurrency: int = 256  # invocations one worker answers at once (503 + Retry-After above; /ping never)
    max_connections: int = 1024  # open connections; past it the longest-idle one is closed (byoc.serving.connections)
    keep_alive_timeout: float = 75.0  # a connection idle this long is closed (SageMaker keeps its own 60 s)
    header_timeout: float = 15.0  # a request's headers complete within this of their first byte (408)
    body_timeout: float = 30.0  # a request's body complete within this of its headers (408)
    max_header_bytes: int = 64 * 1024  # a request's line and headers (431 above)

    @classmethod
    def from_env(cls) -> ServeSettings:
        env = os.environ
        read = _Reader(env)
        timeout_name = (
            "SAGEMAKER_MODEL_SERVER_TIMEOUT"
            if env.get("SAGEMAKER_MODEL_SERVER_TIMEOUT") or not env.get("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS")
            else "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS"
        )
        settings = cls(
            model_dir=Paths(base_dir()).model_dir,  # the training contract's rule: an empty variable is unset
            port=read.integer("SAGEMAKER_BIND_TO_PORT", 8080, 1, 65535),
            workers=read.integer("SAGEMAKER_MODEL_SERVER_WORKERS", 1, 1),
            timeout=read.number(timeout_name, 60.0, positive=True),
            max_payload_mb=read.number("SAGEMAKER_MAX_PAYLOAD_IN_MB", 6.0, positive=True),
            default_accept=_media_type(env.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or JSON),
            batch_strategy=env.get("SAGEMAKER_BATCH_STRATEGY") or "MULTI_RECORD",
            max_concurrent_transforms=read.integer("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", 0, 0),
            max_batch=read.integer("BYOC_MAX_BATCH_SIZE", 128, 1),
            max_delay_ms=read.number("BYOC_MAX_BATCH_DELAY_MS", 0.0),
            graceful_timeout=read.integer("BYOC_GRACEFUL_TIMEOUT", 25, 0),
            max_inputs=read.integer("BYOC_MAX_INPUTS_PER_REQUEST", 4096, 1),
            max_queued_inputs=read.integer("BYOC_MAX_QUEUED_INPUTS", 16384, 1),
            max_concurrency=read.integer("BYOC_MAX_CONCURRENCY", 256, 1),
            keep_alive_timeout=read.number("BYOC_KEEP_ALIVE_TIMEOUT", 75.0, positive=True),
            header_timeout=read.number("BYOC_HEADER_TIMEOUT", 15.0, positive=True),
            body_timeout=read.number("BYOC_BODY_TIMEOUT", 30.0, positive=True),
            max_header_bytes=read.integer("BYOC_MAX_HEADER_BYTES", 64 * 1024, 1024),
        )
        connections = read.integer("BYOC_MAX_CONNECTIONS", 4 * settings.max_concurrency, 1)
        if connections < settings.max_concurrency:
            raise ServeSettingsError(
                f"BYOC_MAX_CONNECTIONS={connections} is under BYOC_MAX_CONCURRENCY={settings.max_concurrency}: "
                "every request in flight needs its connection; raise the first"
            )
        settings = replace(settings, max_connections=connections)
        if settings.max_inputs > settings.max_queued_inputs:
            raise ServeSettingsError(
                f"BYOC_MAX_INPUTS_PER_REQUEST={settings.max_inputs} is over BYOC_MAX_QUEUED_INPUTS="
                f"{settings.max_queued_inputs}: a request that large could never be queued; raise the second"
            )
        return settings

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 1024 * 1024)


class _Reader:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def integer(self, name: str, default: int, minimum: int, maximum: int | None = None) -> int:
        raw = (self.env.get(name) or "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
            raise ServeSettingsError(f"{name}={raw!r}: must be a whole number {bound} (default {default})")
        return value

    def number(self, name: str, default: float, positive: bool = False) -> float:
        raw = (self.env.get(name) or "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "greater than 0" if positive else "0 or more"
            raise ServeSettingsError(f"{name}={raw!r}: must be a number {bound} (default {default:g})")
        return value


def _media_type(value: str) -> str:
    kind, slash, sub = value.strip().lower().partition("/")
    if not (slash and kind and sub) or "*" in value or "," in value or ";" in value:
        raise ServeSettingsError(
            f"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT={value!r}: must be one media type such as application/json"
        )
    return value.strip().lower()
