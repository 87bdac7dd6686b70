"""The serving settings: read once at start, and a value the server cannot run with stops it there,
naming the variable (BYOC_MAX_BATCH_SIZE=0 used to fail every request, a negative one to hang them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from byoc.contract import Paths
from byoc.errors import UserError
from byoc.serving.resources import read_resources
from byoc.serving.server import ServeSettings


def test_the_model_folder_is_the_contracts_and_an_empty_variable_is_unset(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", "")
    monkeypatch.setenv("SM_MODEL_DIR", "")
    assert ServeSettings.from_env().model_dir == Path("/opt/ml/model")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    assert ServeSettings.from_env().model_dir == tmp_path / "model" == Paths(tmp_path).model_dir
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "elsewhere"))
    assert ServeSettings.from_env().model_dir == tmp_path / "elsewhere"


@pytest.fixture
def env(monkeypatch):
    """Sets serving variables for ServeSettings.from_env(), none set to begin with."""
    other = ("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT")
    for name in [*VARIABLES, *ELSEWHERE, *other]:
        monkeypatch.delenv(name, raising=False)

    def set_env(values: dict[str, str]) -> ServeSettings:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        return ServeSettings.from_env()

    return set_env


def test_unset_and_empty_variables_give_the_defaults(env):
    # model_dir and resources come from the host (the /opt/ml contract, the cgroup), not a constant default.
    host = ("model_dir", "resources")
    defaults = {f.name: f.default for f in dataclasses.fields(ServeSettings) if f.name not in host}
    for values in ({}, {name: "" for name in [*VARIABLES, *ELSEWHERE]}):
        settings = env(values)
        assert {name: getattr(settings, name) for name in defaults} == defaults
        assert settings.resources == read_resources()


VARIABLES = {
    "SAGEMAKER_BIND_TO_PORT": "port",
    "SAGEMAKER_MODEL_SERVER_WORKERS": "workers",
    "SAGEMAKER_MODEL_SERVER_TIMEOUT": "timeout",
    "SAGEMAKER_MAX_PAYLOAD_IN_MB": "max_payload_mb",
    "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "max_concurrent_transforms",
    "BYOC_MAX_BATCH_SIZE": "max_batch",
    "BYOC_MAX_BATCH_DELAY_MS": "max_delay_ms",
    "BYOC_GRACEFUL_TIMEOUT": "graceful_timeout",
    "BYOC_MAX_INPUTS_PER_REQUEST": "max_inputs",
    "BYOC_MAX_QUEUED_INPUTS": "max_queued_inputs",
    "BYOC_MAX_TEXT_CHARS_PER_REQUEST": "max_text_chars",
    "BYOC_MAX_CONCURRENCY": "max_concurrency",
    "BYOC_MAX_CONNECTIONS": "max_connections",
    "BYOC_KEEP_ALIVE_TIMEOUT": "keep_alive_timeout",
    "BYOC_HEADER_TIMEOUT": "header_timeout",
    "BYOC_BODY_TIMEOUT": "body_timeout",
    "BYOC_MAX_HEADER_BYTES": "max_header_bytes",
}


# Read by serving modules on their own before they were read here, at start, with the others.
ELSEWHERE = (
    "BYOC_INFERENCE_BACKEND",
    "BYOC_INFERENCE_PRECISION",
    "BYOC_INFERENCE_COMPILE",
    "OMP_NUM_THREADS",
    "SAGEMAKER_PROGRAM",
    "BYOC_LOG_LEVEL",
)


@pytest.mark.parametrize(
    "variable,value",
    [
        ("BYOC_INFERENCE_BACKEND", "tensorrt"),
        ("BYOC_INFERENCE_PRECISION", "fp8"),
        ("BYOC_INFERENCE_COMPILE", "maybe"),
        ("OMP_NUM_THREADS", "0"),
        ("OMP_NUM_THREADS", "all"),
        ("BYOC_LOG_LEVEL", "loud"),
        ("BYOC_MAX_BATCH_SIZE", "0"),
        ("BYOC_MAX_BATCH_SIZE", "-4"),
        ("BYOC_MAX_BATCH_SIZE", "12.5"),
        ("BYOC_MAX_BATCH_SIZE", "many"),
        ("BYOC_MAX_BATCH_DELAY_MS", "-1"),
        ("BYOC_MAX_BATCH_DELAY_MS", "nan"),
        ("BYOC_MAX_BATCH_DELAY_MS", "soon"),
        ("BYOC_GRACEFUL_TIMEOUT", "-1"),
        ("BYOC_MAX_INPUTS_PER_REQUEST", "0"),
        ("BYOC_MAX_QUEUED_INPUTS", "-10"),
        ("BYOC_MAX_CONCURRENCY", "0"),
        ("BYOC_MAX_CONNECTIONS", "0"),
        ("BYOC_KEEP_ALIVE_TIMEOUT", "0"),
        ("BYOC_HEADER_TIMEOUT", "-1"),
        ("BYOC_BODY_TIMEOUT", "soon"),
        ("BYOC_MAX_HEADER_BYTES", "100"),
        ("SAGEMAKER_BIND_TO_PORT", "0"),
        ("SAGEMAKER_BIND_TO_PORT", "70000"),
        ("SAGEMAKER_MODEL_SERVER_WORKERS", "0"),
        ("SAGEMAKER_MODEL_SERVER_WORKERS", "two"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "0"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "inf"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "-3"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "0"),
        ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "0"),
        ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "six"),
        ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", "-1"),
        ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "*/*"),
        ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "application/json, text/csv"),
        ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "json"),
    ],
)
def test_a_value_out_of_range_stops_the_server_naming_the_variable(env, variable, value):
    with pytest.raises(ValueError) as caught:
        env({variable: value})
    assert f"{variable}={value!r}" in str(caught.value)
    assert isinstance(caught.value, UserError)  # a message for the user, not a traceback


def test_values_in_range_are_read(env):
    settings = env(
        {
            "BYOC_MAX_BATCH_SIZE": " 1 ",
            "BYOC_MAX_BATCH_DELAY_MS": "2.5",
            "BYOC_MAX_INPUTS_PER_REQUEST": "10",
            "BYOC_MAX_QUEUED_INPUTS": "10",
            "BYOC_MAX_CONCURRENCY": "3",
            "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "7",
            "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "Text/CSV",
        }
    )
    assert (settings.max_batch, settings.max_delay_ms, settings.max_inputs, settings.max_queued_inputs) == (
        1,
        2.5,
        10,
        10,
    )
    assert (settings.max_concurrency, settings.timeout, settings.default_accept) == (3, 7.0, "text/csv")


def test_the_batch_delay_is_adaptive_unless_set_and_zero_never_waits(env):
    assert env({}).max_delay_ms is None  # byoc.serving.execution.batching.adaptive_delay
    assert env({"BYOC_MAX_BATCH_DELAY_MS": " Auto "}).max_delay_ms is None
    assert env({"BYOC_MAX_BATCH_DELAY_MS": "0"}).max_delay_ms == 0.0
    with pytest.raises(ValueError, match="or auto"):
        env({"BYOC_MAX_BATCH_DELAY_MS": "adaptive"})


def test_connections_default_to_four_per_request_slot_and_never_fewer_than_the_slots(env):
    assert env({"BYOC_MAX_CONCURRENCY": "10"}).max_connections == 40
    assert env({"BYOC_MAX_CONCURRENCY": "10", "BYOC_MAX_CONNECTIONS": "12"}).max_connections == 12
    with pytest.raises(ValueError, match="BYOC_MAX_CONNECTIONS=5 is under BYOC_MAX_CONCURRENCY=10"):
        env({"BYOC_MAX_CONCURRENCY": "10", "BYOC_MAX_CONNECTIONS": "5"})


def test_a_request_limit_over_the_queue_is_refused(env):
    with pytest.raises(ValueError, match="BYOC_MAX_QUEUED_INPUTS"):
        env({"BYOC_MAX_INPUTS_PER_REQUEST": "100", "BYOC_MAX_QUEUED_INPUTS": "99"})


def test_the_new_limits_are_documented_with_their_defaults():
    serving = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    defaults = {f.name: f.default for f in dataclasses.fields(ServeSettings)}
    for variable in (
        "BYOC_MAX_INPUTS_PER_REQUEST",
        "BYOC_MAX_QUEUED_INPUTS",
        "BYOC_MAX_TEXT_CHARS_PER_REQUEST",
        "BYOC_MAX_CONCURRENCY",
        "BYOC_MAX_CONNECTIONS",
        "BYOC_KEEP_ALIVE_TIMEOUT",
        "BYOC_HEADER_TIMEOUT",
        "BYOC_BODY_TIMEOUT",
        "BYOC_MAX_HEADER_BYTES",
    ):
        row = next(line for line in serving.splitlines() if line.startswith(f"| `{variable}` |"))
        assert float(row.split("|")[2].split()[0]) == defaults[VARIABLES[variable]], row


def test_byoc_task_is_read_as_a_task_name_and_a_wrong_one_stops_the_server():
    from byoc.serving.settings import InferenceSettings, ServeSettingsError

    assert InferenceSettings.from_env({}).task is None
    assert InferenceSettings.from_env({"BYOC_TASK": "Feature-Extraction"}).task == "embedding"
    assert InferenceSettings.from_env({"BYOC_TASK": "rerank"}).task == "reranker"
    with pytest.raises(ServeSettingsError, match="BYOC_TASK='ranking' names no task: set one of .*embedding"):
        InferenceSettings.from_env({"BYOC_TASK": "ranking"})


def test_an_answer_holds_what_the_response_limit_holds_unless_set(tmp_path):
    """BYOC_MAX_ANSWER_VALUES: by default the numbers SAGEMAKER_MAX_PAYLOAD_IN_MB holds at 4 bytes each (6 MB: 4,096
    texts x 384 dimensions; an asynchronous endpoint's 1 GB), else as set; refused out of range, naming it."""
    from byoc.serving.settings import InferenceSettings, answer_values_of

    base = {"SAGEMAKER_BASE_DIR": str(tmp_path)}
    assert ServeSettings.from_env(base).inference.max_answer_values == 4096 * 384 == answer_values_of(6)
    assert InferenceSettings().max_answer_values == answer_values_of(6)
    asynchronous = ServeSettings.from_env({**base, "BYOC_PROFILE": "async"})
    assert asynchronous.inference.max_answer_values == 1024 * 2**20 // 4
    assert ServeSettings.from_env({**base, "SAGEMAKER_MAX_PAYLOAD_IN_MB": "100"}).inference.max_answer_values == (
        100 * 2**20 // 4
    )
    assert ServeSettings.from_env({**base, "BYOC_MAX_ANSWER_VALUES": "5000"}).inference.max_answer_values == 5000
    with pytest.raises(ValueError, match="BYOC_MAX_ANSWER_VALUES='0'"):
        ServeSettings.from_env({**base, "BYOC_MAX_ANSWER_VALUES": "0"})
