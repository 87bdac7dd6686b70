"""`byoc serve` under fire, round two: no request, connection or handler can hold the server. Each
case is one the second hostile review found on the real server; each fails on the code before it."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import serve_helpers
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

pytestmark = pytest.mark.integration  # servers in processes: not in make test-fast


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.trained_classifier(tmp_path_factory, tiny_model_dir)


def raw(s: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", s.port), timeout=HANG_GUARD_S)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """(status, whole response) of a server that closes the connection after answering."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


# The default predict_fn, which notes when it starts on a long text.
NOTES_LONG = (
    GATE_CODE
    + """
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    if any(isinstance(text, str) and len(text) > 1_000_000 for text in data["inputs"]):
        note("long")
    return default(data, model)


predict_fn.batchable = True
"""
)


def test_one_long_text_holds_nobody_else(trained_model, tmp_path):
    """A 5.8 MB text was tokenized whole before being truncated: 22 s of the inference thread, and an
    ordinary request sent just after it waited as long (504 with a 20 s timeout)."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, NOTES_LONG, SAGEMAKER_MODEL_SERVER_TIMEOUT="3", **gates.env())
    long_text = ("what a wonderful day it was, " * 200_000)[:5_800_000]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            long = pool.submit(s.invoke, {"inputs": long_text})
            gates.wait("long")  # the long text is in predict_fn: the ordinary request comes after it
            ordinary = s.invoke({"inputs": TEXTS[0]})
            long_answer = long.result()
        short_answer = s.invoke({"inputs": long_text[:20_000]})
    finally:
        s.stop()
    assert ordinary.status_code == 200, ordinary.text
    assert long_answer.status_code == 200, long_answer.text
    assert long_answer.json() == short_answer.json()  # the cut text has the model's answer


# A body that starts with "hold" holds its input_fn at a gate: a slow or hung input_fn, for as long
# as the test keeps the gate shut.
SLOW_INPUT = (
    GATE_CODE
    + """
from byoc.inference import input_fn as default


def input_fn(body, content_type):
    if body.startswith(b"hold"):
        gate("input_fn")
        body = b'{"inputs": "fine"}'
    return default(body, content_type)
"""
)


def test_a_slow_user_input_fn_holds_neither_ping_nor_other_requests(trained_model, tmp_path):
    """A user's input_fn ran on the event loop: a 10 s sleep in it blocked /ping and every other
    request for 10 s, and the request timeout did not apply."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, SLOW_INPUT, SAGEMAKER_MODEL_SERVER_TIMEOUT="3", **gates.env())
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(s.invoke, b"hold")
            gates.entered("input_fn")  # the slow input_fn runs, and stays until the gate opens
            ping = s.client.get("/ping", timeout=PING_S)  # SageMaker's limit for /ping
            ordinary = s.client.post("/invocations", json={"inputs": TEXTS[0]})  # answered while it stays
            slow_answer = slow.result()  # the request timeout applies to it
            gates.open("input_fn")
    finally:
        s.stop()
    assert ping.status_code == 200 and ping.json() == {"status": "healthy"}
    assert ordinary.status_code == 200
    assert slow_answer.status_code == 504 and "SAGEMAKER_MODEL_SERVER_TIMEOUT" in slow_answer.json()["error"]


def test_hung_input_fns_on_large_bodies_do_not_exhaust_the_threads(trained_model, tmp_path):
    """Six hung input_fn calls on bodies over 256 KB filled asyncio's default pool (6 threads on 2
    cores): every later request then timed out (504) while /ping answered 200."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, SLOW_INPUT, SAGEMAKER_MODEL_SERVER_TIMEOUT="20", **gates.env())
    hung = b"hold" + b" " * 300_000
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for _ in range(8):
                pool.submit(_post_ignoring_errors, s.url, hung)
            gates.entered("input_fn", 8)  # eight input_fns hang at once (the gate never opens)
            # Each would be a 504 after the 20 s timeout if no thread were left for it.
            ordinary = s.client.post("/invocations", json={"inputs": TEXTS[:2]})
            large = s.client.post("/invocations", content=json.dumps({"inputs": ["ok " * 100_000]}))
            s.proc.send_signal(signal.SIGKILL)  # the hung requests end with the server
    finally:
        s.stop()
    assert ordinary.status_code == 200 and len(ordinary.json()) == 2
    assert large.status_code == 200


def _post_ignoring_errors(url: str, body: bytes) -> None:
    try:
        httpx.post(f"{url}/invocations", content=body, timeout=HANG_GUARD_S)
    except httpx.HTTPError:
        pass


def test_sigterm_ends_the_server_within_the_graceful_limit_whatever_a_handler_does(trained_model, tmp_path):
    """With a 40 s hang in input_fn and a 3 s graceful limit, SIGTERM took 40 s; and a request cut at
    the graceful limit got a plain-text 500. Here the hang lasts for good (its gate never opens)."""
    gates = Gates(tmp_path / "gates")
    s = serve(trained_model, tmp_path, SLOW_INPUT, BYOC_GRACEFUL_TIMEOUT="2", **gates.env())
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            hung = pool.submit(s.invoke, b"hold")
            gates.entered("input_fn")
            signalled = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)
            answer = hung.result()
            s.proc.wait(HANG_GUARD_S)  # it exits with the input_fn still hung
            took = time.monotonic() - signalled
    finally:
        log = s.stop()
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
    assert "BYOC_GRACEFUL_TIMEOUT" in answer.json()["error"]
    assert took < STOP_GRACE_S, log[-2000:]  # SageMaker's SIGKILL comes 30 s after its SIGTERM


def test_stalled_bodies_take_no_inference_slot_and_time_out(trained_model):
    """Connections that send headers and part of a body, then stall, held a BYOC_MAX_CONCURRENCY slot
    each: with as many as the limit, every invocation was a 503 for as long as they stayed."""
    s = serve(trained_model, BYOC_MAX_CONCURRENCY="4", BYOC_BODY_TIMEOUT="3")
    stalled = []
    try:
        for _ in range(6):
            sock = raw(s)
            sock.sendall(b"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n")
            sock.sendall(b"content-length: 1000\r\n\r\n" + b'{"inputs": "')
            stalled.append(sock)
        # Answered on the event loop that read the stalled requests' bytes first (they were sent before
        # it): once /ping answers, those requests are being read.
        ping = s.client.get("/ping")
        ordinary = s.invoke({"inputs": TEXTS})
        answers = [read_response(sock) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
        s.stop()
    assert ordinary.status_code == 200 and ping.status_code == 200
    for status, response in answers:
        assert status == 408 and b"BYOC_BODY_TIMEOUT" in response


def test_idle_connections_are_closed_and_cannot_lock_ping_out(trained_model):
    """1,030 connections that never send a byte were never closed, and at uvicorn's connection limit
    /ping answered a plain-text 503 while they stayed."""
    s = serve(trained_model, BYOC_MAX_CONCURRENCY="4", BYOC_MAX_CONNECTIONS="16", BYOC_KEEP_ALIVE_TIMEOUT="4")
    idle = [raw(s) for _ in range(40)]
    try:
        # The server has taken all 40 once it has closed the 24 over its limit of 16 (the longest idle).
        wait_for(lambda: sum(map(closed_by_server, idle)) >= 24, "24 idle connections closed at the limit")
        ping = httpx.get(f"{s.url}/ping", timeout=PING_S)  # SageMaker's limit for /ping
        ordinary = httpx.post(f"{s.url}/invocations", json={"inputs": TEXTS[:1]}, timeout=INVOCATION_S)
        # The rest are closed after the keep-alive timeout: connections idle for good are never kept.
        wait_for(lambda: all(map(closed_by_server, idle)), "every idle connection closed (BYOC_KEEP_ALIVE_TIMEOUT)")
    finally:
        for sock in idle:
            sock.close()
        s.stop()
    assert ping.status_code == 200 and ping.json() == {"status": "healthy"}
    assert ordinary.status_code == 200


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed the connection (the data it sent, if any, stays to be read)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(timeout)


def test_huge_headers_are_a_431_that_echoes_nothing(trained_model):
    """An 8 MB Accept header was parsed on the event loop (/ping took 5.5 s) and the 406 body echoed
    the whole header back."""
    s = serve(trained_model)
    try:
        sock = raw(s)
        header = b"accept: " + b"x/y, " * 400_000 + b"\r\n"
        head = b"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        try:
            sock.sendall(head + header + b'content-length: 12\r\n\r\n{"inputs":1}')
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection once the limit passed
        status, response = read_response(sock)
        sock.close()
        ping = s.client.get("/ping", timeout=PING_S)  # SageMaker's limit for /ping
        long_accept = s.invoke({"inputs": "hi"}, accept="x/" + "y" * 5000)
    finally:
        s.stop()
    assert status == 431 and b"BYOC_MAX_HEADER_BYTES" in response and len(response) < 1000
    assert ping.status_code == 200
    assert long_accept.status_code == 406 and len(long_accept.text) < 1000


def test_a_client_that_leaves_mid_body_is_one_log_line(trained_model):
    s = serve(trained_model)
    try:
        for left in range(1, 4):
            sock = raw(s)
            sock.sendall(b"POST /invocations HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n" + b"x" * 10)
            s.client.get("/ping")  # answered by the event loop that read those bytes first: the body is being read
            sock.close()
            s.wait_for_log("disconnected before its request's body was complete", left)
        after = s.invoke({"inputs": TEXTS[0]})
    finally:
        log = s.stop()
    assert after.status_code == 200
    assert log.count("disconnected before its request's body was complete") == 3
    assert "Traceback" not in log


NAN = """
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    answers = default(data, model)
    if data["inputs"][0] == "broken":
        answers[0]["score"] = float("nan")
    return answers


predict_fn.batchable = True
"""


@pytest.mark.parametrize("accept", ["application/json", "application/jsonlines", "text/csv"])
def test_a_nan_score_is_a_clear_500_never_invalid_json(trained_model, tmp_path, accept):
    """A NaN score was written as a bare NaN: a body no JSON parser reads."""
    s = serve(trained_model, tmp_path, NAN)
    try:
        broken = s.invoke({"inputs": ["broken"]}, accept=accept)
        fine = s.invoke({"inputs": ["fine"]}, accept=accept)
    finally:
        s.stop()
    assert broken.status_code == 500 and "NaN or infinity" in broken.json()["error"]
    assert fine.status_code == 200 and "NaN" not in fine.text


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_body_of_a_million_tiny_inputs_is_refused_without_building_them(trained_model):
    """1.2 million tiny inputs in 6 MB were refused (413) only after a full parse: 32 of them in parallel
    raised resident memory from 0.40 to 1.25 GB, where it stayed."""
    s = serve(trained_model)
    body = json.dumps({"inputs": ["x"] * 1_200_000}).encode()
    try:
        s.invoke({"inputs": TEXTS})
        before = rss_mib(s.proc.pid)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda _: s.client.post("/invocations", content=body), range(16)))
        after = rss_mib(s.proc.pid)
        ordinary = s.invoke({"inputs": TEXTS})
    finally:
        s.stop()
    assert all(a.status_code == 413 and "more than 4096 inputs" in a.json()["error"] for a in answers)
    assert ordinary.status_code == 200
    assert after - before < 150, (before, after)  # 16 bodies of 6 MB, never their 1.2 million strings


def test_stopping_while_requests_stream_in_is_clean(trained_model):
    """A server stopped while clients keep sending exits promptly and answers what it took."""
    s = serve(trained_model, BYOC_GRACEFUL_TIMEOUT="5")
    results: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                results.append(httpx.post(f"{s.url}/invocations", json={"inputs": TEXTS}, timeout=10).status_code)
            except httpx.HTTPError:
                return

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(results) >= 8, "the clients' first answers")  # requests stream in
    s.proc.send_signal(signal.SIGTERM)
    code = s.proc.wait(STOP_GRACE_S)  # SageMaker's SIGKILL comes 30 s after its SIGTERM
    stop.set()
    for t in threads:
        t.join(15)
    s.stop()
    assert code in (0, -signal.SIGTERM)
    assert results and set(results) <= {200, 503}
