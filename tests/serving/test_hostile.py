"""`byoc serve` against hostile clients, each case as the serving issue found it: a request can cost its
sender a 4xx, never another client its answer, and never the server its health."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import serve_helpers
from accept_cases import ACCEPT_CASES
from hypothesis import HealthCheck, given, settings
from request_strategies import SERVER_BODIES, requests
from serve_helpers import (
    GATE_CODE,
    HANG_GUARD_S,
    INVOCATION_S,
    PING_S,
    STOP_GRACE_S,
    TEXTS,
    Gates,
    Server,
    serve,
    wait_for,
)

from byoc.serving import default_pipeline
from byoc.serving.protocol import negotiation

pytestmark = pytest.mark.integration  # servers in processes: not in make test-fast


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.trained_classifier(tmp_path_factory, tiny_model_dir)


def concurrently(s: Server, requests: list[tuple[bytes, dict]]) -> list[httpx.Response]:
    def send(request):
        body, headers = request
        with httpx.Client(base_url=s.url, timeout=INVOCATION_S) as client:
            return client.post("/invocations", content=body, headers=headers)

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(send, requests))


JSON = {"content-type": "application/json"}
ORDINARY = [(json.dumps({"inputs": [f"{TEXTS[i % 4]} {i}"] * 3}).encode(), JSON) for i in range(12)]
POISONED = (b'{"inputs": ["fine", "\\ud800 cannot be encoded"]}', JSON)


def test_a_poisoned_request_costs_its_sender_a_400_and_nobody_else_anything(trained_model):
    """Valid JSON the tokenizer rejects, batched with 12 ordinary requests: it used to be a 500 for
    it and for most of them."""
    s = serve(trained_model, BYOC_MAX_BATCH_DELAY_MS="300")  # all 13 share a batch
    try:
        answers = concurrently(s, ORDINARY[:6] + [POISONED] + ORDINARY[6:])
    finally:
        s.stop()
    poisoned = answers.pop(6)
    assert poisoned.status_code == 400 and "input 1" in poisoned.json()["error"]
    assert [a.status_code for a in answers] == [200] * 12
    assert all(len(a.json()) == 3 for a in answers)


ISOLATING = """
from byoc.handlers import InputError
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    if "poison" in data["inputs"]:
        raise InputError("poison is not welcome")
    if "boom" in data["inputs"]:
        raise RuntimeError("the model broke")
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_failed_batch_runs_again_one_request_at_a_time(trained_model, tmp_path):
    """A predict_fn that rejects one input fails the merged batch: its requests run again alone, so
    that only the faulty one fails, with the status its fault deserves."""
    s = serve(trained_model, tmp_path, ISOLATING, BYOC_MAX_BATCH_DELAY_MS="300")
    try:
        poison = (json.dumps({"inputs": ["poison"]}).encode(), JSON)
        boom = (json.dumps({"inputs": ["boom"]}).encode(), JSON)
        answers = concurrently(s, ORDINARY[:5] + [poison] + ORDINARY[5:10] + [boom])
    finally:
        log = s.stop()
    assert answers[5].status_code == 400 and "poison is not welcome" in answers[5].json()["error"]
    assert answers[11].status_code == 500 and "the model broke" not in answers[11].text
    assert [a.status_code for a in answers[:5] + answers[6:11]] == [200] * 10
    assert "running them one at a time" in log


# A header of spaces alone cannot be sent (httpx refuses it): the parsers' tests take it.
@pytest.mark.parametrize("accept,kind", [(a, k) for a, k in ACCEPT_CASES if a is None or a == a.strip()])
def test_accept_headers_that_clients_send(shared_server, accept, kind):
    """All of them used to be a 406, some after the model had run."""
    answer = shared_server.invoke({"inputs": TEXTS[:2]}, accept=accept)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(kind)
    assert len(answer.text.strip().splitlines()) == (1 if kind == "application/json" else 2)


@pytest.fixture(scope="module")
def shared_server(trained_model):
    s = serve(trained_model)
    yield s
    s.stop()


SERVER_EXAMPLES = 1000  # generated requests against the real server (about 10 s here)


@settings(
    max_examples=SERVER_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(request=requests(SERVER_BODIES))
def test_generated_requests_never_get_a_5xx_or_hang(shared_server, request):
    """Random JSON, nesting, wrong types, invalid UTF-8, CSV and JSON Lines variants, odd content types
    and Accept headers, requests over the input limit: a 4xx at worst, within the client's timeout."""
    body, content_type, accept = request
    accept = None if accept is None else accept.strip()  # HTTP has no field value with spaces around it
    headers = {"content-type": content_type.strip(), **({"accept": accept} if accept is not None else {})}
    answer = shared_server.client.post("/invocations", content=body, headers=headers, timeout=INVOCATION_S)
    assert answer.status_code in (200, 400, 406, 413, 415), answer.text
    if answer.status_code == 200:
        chosen = negotiation.choose(accept, default_pipeline.ACCEPT_TYPES, "application/json")
        assert chosen and answer.headers["content-type"].startswith(chosen)
    else:
        assert answer.json()["status"] == answer.status_code and "Traceback" not in answer.text


def test_after_the_generated_requests_the_server_is_healthy(shared_server):
    assert shared_server.client.get("/ping").status_code == 200
    answer = shared_server.invoke({"inputs": TEXTS})
    assert answer.status_code == 200 and len(answer.json()) == 4


PRINTING = """
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    print("predict_fn ran on", data["inputs"], flush=True)
    return default(data, model)


predict_fn.batchable = True
"""


def test_406_only_when_nothing_acceptable_exists_and_before_the_model_runs(trained_model, tmp_path):
    s = serve(trained_model, tmp_path, PRINTING)
    try:
        for accept in ("image/png", "application/json;q=0", "*/*;q=0", "text/html, image/*"):
            answer = s.invoke({"inputs": f"probe for {accept}"}, accept=accept)
            assert answer.status_code == 406 and "application/json" in answer.json()["error"], accept
        assert s.invoke({"inputs": "after"}, accept="application/json").status_code == 200
    finally:
        log = s.stop()
    assert "predict_fn ran on ['after']" in log and "probe for" not in log  # predict_fn said what it ran on


@pytest.mark.parametrize(
    "body,content_type,words",
    [
        (b"[" * 100_000 + b"]" * 100_000, "application/json", "nested too deeply"),
        (b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "application/json", "nested too deeply"),
        (b'"' + b"x" * 200_000 + b'"\n', "text/csv", "not valid CSV"),
        (b"1" * 5000, "application/json", "a number in the body has more than 4300 digits"),  # no Python advice
        (b'"fine"\n' + b"1" * 5000 + b"\n", "application/jsonlines", "a number in a JSON Lines record has more"),
        (b'{"inputs": "x", "parameters": {"top_k": 0}}', "application/json", "top_k"),
    ],
)
def test_malformed_bodies_are_a_400(shared_server, body, content_type, words):
    """Deeply nested JSON was a 500 (a RecursionError), as were a CSV field over csv's limit and an
    integer too long to convert."""
    answer = shared_server.invoke(body, content_type)
    assert answer.status_code == 400 and words in answer.json()["error"]


# input_fn notes each request's first input once parsed (what follows, up to the batcher's queue, is
# on the event loop at once); a request with "block" holds the model at a gate until the test opens it.
SLOW = (
    GATE_CODE
    + """
import time
from byoc.inference import input_fn as default_input, predict_fn as default


def input_fn(body, content_type):
    data = default_input(body, content_type)
    note("parsed", data["inputs"][0])
    return data


def predict_fn(data, model):
    if "block" in data["inputs"]:
        gate("block")
    time.sleep(0.005)  # every call takes a while: a request of many chunks takes seconds
    return default(data, model)


predict_fn.batchable = True
"""
)


def test_a_huge_request_is_refused_at_once(trained_model):
    """150,000 short inputs (under 1 MB) ran until the timeout (504) while everyone waited."""
    s = serve(trained_model, SAGEMAKER_MODEL_SERVER_TIMEOUT="10")
    try:
        huge = s.invoke({"inputs": ["hi"] * 150_000})
        ordinary = s.invoke({"inputs": TEXTS[0]})
    finally:
        s.stop()
    assert huge.status_code == 413
    assert "more than 4096 inputs" in huge.json()["error"] and "BYOC_MAX_INPUTS_PER_REQUEST" in huge.json()["error"]
    assert ordinary.status_code == 200


def test_a_big_request_cannot_hold_small_ones_behind_it(trained_model, tmp_path):
    """Chunks of different requests take turns: a small request sent while a big one runs is answered
    before the big one is, not after all of its chunks."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, SLOW, BYOC_MAX_BATCH_SIZE="8", **gates.env())
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            done: list[str] = []  # in the order the answers came

            def send(name: str, inputs: list[str]) -> int:
                with httpx.Client(base_url=s.url, timeout=HANG_GUARD_S) as client:
                    status = client.post("/invocations", json={"inputs": inputs}).status_code
                done.append(name)
                return status

            big = pool.submit(send, "big", ["block"] + [f"{TEXTS[i % 4]} {i}" for i in range(1999)])  # 250 calls
            gates.entered("block")  # the big request's first chunk holds the model
            small = pool.submit(send, "small", [TEXTS[1]])
            gates.wait("parsed", text=TEXTS[1])  # the small request is queued behind it
            gates.open("block")
            assert (small.result(), big.result()) == (200, 200)
    finally:
        s.stop()
    assert done == ["small", "big"]


def test_a_full_queue_is_a_503_with_retry_after(trained_model, tmp_path):
    gates = Gates(tmp_path / "gates")
    s = serve(
        trained_model, tmp_path, SLOW, BYOC_MAX_QUEUED_INPUTS="10", BYOC_MAX_INPUTS_PER_REQUEST="10", **gates.env()
    )
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            blocking = pool.submit(s.invoke, {"inputs": ["block"]})
            gates.entered("block")  # it holds the model until the gate opens
            waiting = pool.submit(s.invoke, {"inputs": TEXTS * 2})  # 8 of the 10 places
            gates.wait("parsed", text=TEXTS[0])  # queued
            refused = s.invoke({"inputs": TEXTS})  # 8 + 4 > 10
            gates.open("block")
            assert (blocking.result().status_code, waiting.result().status_code) == (200, 200)
        after = s.invoke({"inputs": TEXTS})
    finally:
        s.stop()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "BYOC_MAX_QUEUED_INPUTS" in refused.json()["error"]
    assert after.status_code == 200


def test_invocations_beyond_the_concurrency_limit_are_a_503_and_ping_still_answers(trained_model, tmp_path):
    """BYOC_MAX_CONCURRENCY refuses invocations, never /ping: SageMaker replaces an instance whose
    /ping fails, and under load that would make things worse (uvicorn's own limit refused /ping too)."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, SLOW, BYOC_MAX_CONCURRENCY="2", **gates.env())
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            held = [pool.submit(s.invoke, {"inputs": ["block"]})]
            gates.entered("block")  # in flight, holding the model
            held.append(pool.submit(s.invoke, {"inputs": ["x"]}))
            gates.wait("parsed", text="x")  # in flight (a slot is taken before its body is parsed), queued
            third = s.invoke({"inputs": ["y"]})
            ping = s.client.get("/ping", timeout=PING_S)  # SageMaker's limit for /ping
            gates.open("block")
            assert [f.result().status_code for f in held] == [200, 200]
        after = s.invoke({"inputs": TEXTS})
    finally:
        s.stop()
    assert third.status_code == 503 and third.headers["retry-after"] == "1"
    assert "BYOC_MAX_CONCURRENCY" in third.json()["error"]
    assert ping.status_code == 200
    assert after.status_code == 200


FAULTY = """
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    kind = data["inputs"][0]
    if kind == "none":
        return None
    if kind == "dict":
        return {"label": "one for all"}
    if kind == "exit":
        raise SystemExit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_faulty_batchable_predict_fn_costs_one_request_never_the_batcher(trained_model, tmp_path):
    """predict_fn returning None or a dict, or raising a BaseException, used to end the batching task:
    every later request waited for its timeout (504) while /ping kept answering 200."""
    s = serve(trained_model, tmp_path, FAULTY, SAGEMAKER_MODEL_SERVER_TIMEOUT="5")
    try:
        for fault in ("none", "dict", "exit", "interrupt"):
            bad = s.invoke({"inputs": [fault]})
            assert bad.status_code == 500 and "internal error" in bad.json()["error"], fault
            good = s.invoke({"inputs": TEXTS})
            assert good.status_code == 200 and len(good.json()) == 4, fault
        assert s.client.get("/ping").status_code == 200
    finally:
        s.stop()


KILLER = """
import asyncio
import gc

from byoc.inference import predict_fn as default


def predict_fn(data, model):
    if data["inputs"] == ["kill the batcher"]:  # stands for a bug in byoc: the batching task dies
        task = next(o for o in gc.get_objects() if isinstance(o, asyncio.Task) and o.get_name() == "byoc-batcher")
        task.get_loop().call_soon_threadsafe(task.cancel)
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_dead_batcher_fails_ping_and_the_worker_exits_to_be_replaced(trained_model, tmp_path):
    s = serve(trained_model, tmp_path, KILLER)
    s.invoke({"inputs": ["kill the batcher"]})
    pings = []
    try:
        code = None
        deadline = time.monotonic() + HANG_GUARD_S
        while code is None and time.monotonic() < deadline:
            try:
                pings.append(s.client.get("/ping", timeout=PING_S).status_code)  # SageMaker's limit for /ping
            except httpx.TransportError:
                pings.append("closed")
            code = s.proc.poll()
            time.sleep(0.05)
    finally:
        log = s.stop()
    assert 200 not in pings and code not in (None, 0), (pings, log[-2000:])
    assert "the batching task ended" in log and "replaces this worker" in log


STUCK = """
import time

from byoc.inference import predict_fn as default


def predict_fn(data, model):
    if data["inputs"] == ["stuck"]:
        time.sleep(3600)
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_stuck_inference_call_fails_ping_and_sigterm_still_ends_the_server(trained_model, tmp_path):
    s = serve(trained_model, tmp_path, STUCK, SAGEMAKER_MODEL_SERVER_TIMEOUT="1", BYOC_GRACEFUL_TIMEOUT="3")
    try:
        assert s.invoke({"inputs": "stuck"}).status_code == 504
        # /ping says so once the call has run past the 1 s timeout
        ping = wait_for(lambda: (p := s.client.get("/ping")).status_code != 200 and p, "/ping to fail")
        assert ping.status_code == 503 and "inference call has been running" in ping.json()["error"]
        refused = s.invoke({"inputs": "fine"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        signalled = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(HANG_GUARD_S)  # the stuck thread does not keep the process alive
        assert time.monotonic() - signalled < STOP_GRACE_S  # SageMaker's SIGKILL comes 30 s after its SIGTERM
    finally:
        s.stop()


def test_code_that_exits_while_loading_stops_the_server_with_the_reason(trained_model, tmp_path):
    """argparse at import exits (SystemExit): the server used to stay at 503, saying nothing, until
    SageMaker's start-up timeout."""
    source = "import argparse\nargparse.ArgumentParser().parse_args()  # byoc serve's argv: 'serve' is unknown\n"
    s = Server(serve_helpers.model_with_code(trained_model, tmp_path, source))
    code, log = s.wait_exit()
    assert code != 0 and "cannot serve" in log and "SystemExit: 2" in log


TOOLKIT_LIKE = """
from __future__ import annotations

import pickle
from dataclasses import dataclass

from byoc.inference import predict_fn as default


@dataclass
class Answer:
    label: str
    score: float


def predict_fn(data, model):
    import helper  # a sibling module, imported inside a function

    answers = [Answer(**a) for a in default(data, model)]
    return helper.plain(pickle.loads(pickle.dumps(answers)))


predict_fn.batchable = True
"""


def test_user_code_is_loaded_like_the_toolkits(trained_model, tmp_path):
    """A dataclass with postponed annotations, pickling a class defined there, `import helper` in a
    function: each failed when the module was not in sys.modules and its folder left sys.path."""
    model = serve_helpers.model_with_code(trained_model, tmp_path, TOOLKIT_LIKE)
    (model / "code" / "helper.py").write_text("def plain(answers):\n    return [vars(a) for a in answers]\n")
    s = serve(model)
    try:
        answer = s.invoke({"inputs": TEXTS})
    finally:
        s.stop()
    assert answer.status_code == 200 and [set(a) for a in answer.json()] == [{"label", "score"}] * 4


@pytest.mark.parametrize("value", ["0", "-1"])
def test_an_impossible_batch_size_stops_the_server_at_start(trained_model, value):
    """BYOC_MAX_BATCH_SIZE=0 made every request a 500, a negative one hung them."""
    s = Server(trained_model, env={"BYOC_MAX_BATCH_SIZE": value})
    try:
        code = s.proc.wait(HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        raise AssertionError("the server started") from None
    log = s.rest()
    assert code != 0 and f"BYOC_MAX_BATCH_SIZE='{value}'" in log and "at least 1" in log


COUNTED = (
    GATE_CODE
    + """
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    note("called", str(len(data["inputs"])))
    if "block" in data["inputs"]:
        gate("block")
    return default(data, model)


predict_fn.batchable = True
"""
)


def test_a_client_that_leaves_gives_its_place_back_and_its_chunks_never_run(trained_model, tmp_path):
    """docs/serving.md says a request whose client leaves gives its place back: a client that left after 1 s
    still had 3,968 of its 4,096 inputs run over 25 s. The server now watches for the disconnect and
    cancels the request: its chunks not yet taken never run."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, COUNTED, BYOC_MAX_BATCH_SIZE="8", **gates.env())
    try:
        body = json.dumps({"inputs": ["block"] + [f"{TEXTS[i % 4]} {i}" for i in range(199)]}).encode()  # 25 chunks
        head = f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        with socket.create_connection(("127.0.0.1", s.port)) as client:
            client.sendall(head.encode() + b"\r\n\r\n" + body)
            gates.entered("block")  # its first chunk holds the model
        s.wait_for_log("a client left before its answer")
        gates.open("block")
        assert s.invoke({"inputs": [TEXTS[0]]}).status_code == 200  # runs after whatever the gone request left
        assert gates.notes("called") == ["8", "1"]  # the held chunk, then the small request: none of the other 24
    finally:
        s.stop()
