"""Property-based tests (hypothesis), in process: generated hostile requests against the default
handlers, and generated mixes of requests against the batcher. Never an error other than a 4xx for
the request's own fault; never another client's failure. Deterministic (derandomize) for CI.
The same requests go to a real server in test_serve_hostile.py."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import serve_helpers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from request_strategies import requests

from byoc.serving import default_pipeline
from byoc.serving.execution.batching import Batcher
from byoc.serving.protocol import negotiation
from byoc.serving.protocol.request_errors import InputError, NotAcceptable

HANDLER_EXAMPLES = 1200  # generated requests through the default handlers


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir):
    return default_pipeline.model_fn(str(serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)))


@settings(
    max_examples=HANDLER_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(request=requests())
def test_the_default_handlers_answer_or_refuse_with_a_4xx(model, request):
    """input_fn -> predict_fn -> output_fn on a generated request: an answer per input, of the type
    negotiation chose, or an InputError (a 4xx). Anything else would be a 500 for a malformed request."""
    body, content_type, accept = request
    chosen = negotiation.choose(accept, default_pipeline.ACCEPT_TYPES, "application/json")
    try:
        data = default_pipeline.input_fn(body, content_type)
        prediction = default_pipeline.predict_fn(data, model)
        text, kind = default_pipeline.output_fn(prediction, accept or "application/json")
    except NotAcceptable:
        assert chosen is None  # output_fn refuses exactly what the server's check before the model refuses
        return
    except InputError as err:
        assert 400 <= err.status < 500
        return
    assert kind == chosen  # the type chosen before the model ran is the type written after it
    assert len(prediction) == len(data["inputs"]) and text


class Model:
    """Upper-cases inputs; any input starting with "poison" is an input fault, "wrong" makes it
    return one answer too few: a fault of the handler code."""

    def __call__(self, inputs, parameters, shape=None):
        if any(x.startswith("poison") for x in inputs):
            raise InputError("poisoned")
        answers = [x.upper() + str(parameters.get("p", "")) for x in inputs]
        return answers[1:] if any(x.startswith("wrong") for x in inputs) else answers


REQUEST_MIX = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["ok", "ok", "ok", "ok", "poison", "wrong"]), min_size=1, max_size=30),
        st.sampled_from([{}, {}, {"p": 1}, {"p": [1, {"deep": 2}]}]),
        st.booleans(),  # leaves (times out) before its answer
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(mix=REQUEST_MIX, max_batch=st.integers(1, 16), max_queued=st.integers(30, 200))
def test_batched_clients_get_exactly_their_own_answers(mix, max_batch, max_queued):
    """Any mix of requests, poisoned ones, faulty ones and ones that leave, through any batch size:
    each remaining request gets its own answers, or its own error; the batcher lives on."""

    async def main():
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(Model(), executor, max_batch=max_batch, max_delay=0, max_queued=max_queued)
            batcher.start()
            tasks = []
            for n, (kinds, parameters, leaves) in enumerate(mix):
                inputs = [f"{kind}-{n}-{i}" for i, kind in enumerate(kinds)]
                task = asyncio.ensure_future(batcher.submit(inputs, parameters))
                tasks.append((inputs, parameters, task))
                if leaves:
                    asyncio.get_running_loop().call_soon(task.cancel)
            outcomes = await asyncio.wait_for(asyncio.gather(*(t for *_, t in tasks), return_exceptions=True), 30)
            alive, queued = batcher.alive, batcher.queued
            await batcher.stop()
            return [(inputs, parameters, outcome) for (inputs, parameters, _), outcome in zip(tasks, outcomes)], (
                alive,
                queued,
            )

    results, (alive, queued) = asyncio.run(main())
    assert alive and queued == 0
    for inputs, parameters, outcome in results:
        if isinstance(outcome, asyncio.CancelledError):
            continue
        if type(outcome).__name__ == "QueueFull":
            continue  # refused at once: more inputs were waiting than the queue holds
        if any(x.startswith("poison") for x in inputs):
            assert isinstance(outcome, (InputError, RuntimeError))  # its own fault (a chunk may meet "wrong" first)
        elif any(x.startswith("wrong") for x in inputs):
            assert isinstance(outcome, RuntimeError) and "one answer per input" in str(outcome)
        else:
            assert outcome == [x.upper() + str(parameters.get("p", "")) for x in inputs]
