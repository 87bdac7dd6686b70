"""`GET /metrics` (byoc.serving.prometheus): the route templates and the registry in process, then real
servers scraped over HTTP: one worker, several workers (a scrape adds them all up), a multi-model
endpoint (per-model series that go with their model, and only with it: never with a refused load of
its name, nor with an unload of an earlier model of that name), a scrape answered while the model is busy,
BYOC_METRICS=false, and a real Prometheus server scraping `byoc serve` and queried back."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
import serve_helpers
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import GATE_CODE, HANG_GUARD_S, PING_S, TEXTS, Gates, Server, free_port, wait_for

from byoc.serving import prometheus
from byoc.serving.prometheus import ServerMetrics, route_of
from byoc.serving.server_processes import ServerProcesses


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """A scrape's samples: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scrape: dict, name: str, **labels: str) -> float:
    return scrape.get((name, frozenset(labels.items())), 0.0)


def scrape(s: Server) -> dict:
    response = s.client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


# ---------------------------------------------------------------------------------------------
# In process


def test_routes_are_the_apps_templates_never_paths():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    ok = PlainTextResponse("ok")
    invoke = Route("/models/{model_name:path}/invoke", ok, methods=["POST"])
    app = Starlette(
        routes=[Route("/invocations", ok, methods=["POST"]), invoke, Route("/models/{model_name:path}", ok)]
    )

    def scope(path: str, method: str = "POST") -> dict:
        return {"type": "http", "path": path, "method": method, "root_path": "", "app": app}

    # As older Starlette leaves it (no "route" in the scope): matched against the app's routes.
    assert route_of(scope("/invocations")) == "/invocations"
    assert route_of(scope("/invocations", "GET")) == "/invocations"  # a 405 is still the route's
    assert route_of(scope("/models/a/b/invoke")) == "/models/{model_name}/invoke"
    assert route_of(scope("/models/anything", "GET")) == "/models/{model_name}"
    assert {route_of(scope(f"/scan/{n}")) for n in range(50)} == {"other"}  # a scanner adds no series
    # As Starlette's router leaves it: the route it chose.
    assert route_of({**scope("/models/x/invoke"), "route": invoke}) == "/models/{model_name}/invoke"


def test_a_registry_counts_and_forgets_a_model():
    metrics = ServerMetrics(multi_model=True)
    one = metrics.model("one")
    one.request("/models/{model_name}/invoke", 200, 0.01)
    one.request("/models/{model_name}/invoke", 400, 0.002)
    one.error("bad_input")
    one.ran(8, 0.02)
    one.waited(0.001)
    metrics.model("two").request("/models/{model_name}/invoke", 200, 0.01)
    text, content_type = metrics.exposition(None)
    got = samples(text.decode())
    assert content_type.startswith("text/plain")
    assert value(got, "byoc_requests_total", route="/models/{model_name}/invoke", code="400", model="one") == 1
    assert value(got, "byoc_errors_total", kind="bad_input", model="one") == 1
    assert value(got, "byoc_batch_size_sum", model="one") == 8
    assert value(got, "byoc_server_processes") >= 1 and value(got, "byoc_server_resident_memory_bytes") > 0
    metrics.forget("one")
    after = samples(metrics.exposition(None)[0].decode())
    assert not [key for key in after if ("model", "one") in key[1]]  # every series of the unloaded model went
    assert value(after, "byoc_requests_total", route="/models/{model_name}/invoke", code="200", model="two") == 1
    openmetrics, kind = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert kind.startswith("application/openmetrics-text") and openmetrics.endswith(b"# EOF\n")


def test_the_process_count_is_the_supervisor_and_its_workers_never_a_helper():
    """Multiprocessing's resource tracker, beside uvicorn's workers, was counted: 4 processes for 2
    workers. Helpers (it, a handler's subprocesses) count in memory and CPU, not as processes."""
    child = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    helper = subprocess.Popen(child, stdin=subprocess.PIPE)
    worker = subprocess.Popen([*child, "--multiprocessing-fork"], stdin=subprocess.PIPE)  # as spawn starts one
    try:
        # A child shows its parent's command line until it has exec'd its own (CI once counted the worker
        # before then): wait for both command lines, not a guessed time.
        for process, marker in ((helper, b"sys.stdin.read()"), (worker, b"--multiprocessing-fork")):
            cmdline = Path(f"/proc/{process.pid}/cmdline")
            deadline = time.monotonic() + 60
            while marker not in cmdline.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
        alone = samples_of(ServerProcesses(os.getpid()))
        supervisor = samples_of(ServerProcesses(os.getpid(), supervisor=True))
    finally:
        for process in (helper, worker):
            process.communicate(b"")
    assert value(alone, "byoc_server_processes") == 1  # one worker: the process itself
    assert value(supervisor, "byoc_server_processes") == 2  # the supervisor and its worker, not the helper


def samples_of(collector: ServerProcesses) -> dict:
    registry = CollectorRegistry()
    registry.register(collector)
    return samples(generate_latest(registry).decode())


def test_two_servers_keep_their_own_counts():
    first, second = ServerMetrics(), ServerMetrics()
    first.model().request("/invocations", 200, 0.01)
    assert (
        value(
            samples(second.exposition(None)[0].decode()),
            "byoc_requests_total",
            route="/invocations",
            code="200",
            model="",
        )
        == 0
    )


def test_several_workers_share_a_fresh_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(prometheus.MULTIPROC_ENV, "")  # recorded, so that what prepare_workers writes is undone
    monkeypatch.delenv(prometheus.MULTIPROC_ENV)
    assert prometheus.prepare_workers(1, None) is None and prometheus.MULTIPROC_ENV not in os.environ
    folder = prometheus.prepare_workers(2, None)
    assert folder is not None and os.environ[prometheus.MULTIPROC_ENV] == str(folder) and folder.is_dir()
    (tmp_path / "counter_1.db").write_bytes(b"old")
    assert prometheus.prepare_workers(3, str(tmp_path)) == tmp_path
    assert not list(tmp_path.glob("*.db")) and os.environ[prometheus.MULTIPROC_ENV] == str(
        tmp_path
    )  # an earlier run's go


# ---------------------------------------------------------------------------------------------
# Real servers

integration = pytest.mark.integration  # servers in processes (the tests above run in process)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny classifier where a server finds its model: the model folder of an /opt/ml tree."""
    target = tmp_path_factory.mktemp("prometheus") / "opt-ml" / "model"
    shutil.copytree(serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir), target)
    return target


@integration
def test_a_scrape_counts_every_request_by_route_code_and_kind(classifier):
    s = serve_helpers.serve(classifier, BYOC_INFERENCE_BACKEND="onnxruntime")
    try:
        for _ in range(5):
            assert s.invoke({"inputs": TEXTS}).status_code == 200
        assert s.invoke("{not json").status_code == 400
        assert s.invoke({"inputs": "x"}, content_type="image/png").status_code == 415
        for _ in range(3):
            assert s.client.get("/ping").status_code == 200
        got = scrape(s)
        assert value(got, "byoc_requests_total", route="/invocations", code="200", model="") == 5
        assert value(got, "byoc_requests_total", route="/invocations", code="400", model="") == 1
        assert value(got, "byoc_errors_total", kind="bad_input", model="") == 2
        assert value(got, "byoc_requests_total", route="/ping", code="200", model="") >= 3
        assert value(got, "byoc_request_duration_seconds_count", route="/invocations", model="") == 7
        assert value(got, "byoc_batch_size_sum", model="") == 5 * len(TEXTS)  # every input ran once
        assert value(got, "byoc_inference_seconds_count", model="") >= 1
        assert value(got, "byoc_queue_seconds_count", model="") == 5
        assert value(got, "byoc_requests_in_flight", model="") == 0 and value(got, "byoc_queue_depth", model="") == 0
        assert value(got, "byoc_server_cpu_seconds_total") > 0
        # A scrape is no invocation: counted under its own route only.
        again = scrape(s)
        assert value(again, "byoc_requests_total", route="/metrics", code="200", model="") == 1
        assert value(again, "byoc_requests_total", route="/invocations", code="200", model="") == 5
        openmetrics = s.client.get("/metrics", headers={"accept": "application/openmetrics-text"})
        assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
        assert openmetrics.text.endswith("# EOF\n")
    finally:
        s.stop()


_HELD = (
    GATE_CODE
    + """
from byoc import inference as defaults
from byoc.inference import input_fn, model_fn, output_fn


def predict_fn(data, model):
    if data["inputs"] == ["hold"]:
        gate("held")
    return defaults.predict_fn(data, model)


predict_fn.batchable = True
"""
)


@integration
def test_metrics_are_answered_while_the_model_is_busy(classifier, tmp_path):
    gates = Gates(tmp_path / "gates")
    model = serve_helpers.model_with_code(classifier, tmp_path, _HELD)
    s = Server(model, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", **gates.env()})
    try:
        s.wait_ready()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            held = pool.submit(s.invoke, {"inputs": "hold"})
            gates.entered("held")
            queued = pool.submit(s.invoke, {"inputs": TEXTS})  # waits behind the held call
            wait_for(lambda: value(scrape(s), "byoc_queue_depth", model="") == len(TEXTS), "the queued request")
            response = s.client.get("/metrics", timeout=PING_S)  # from the event loop, not behind the model
            got = samples(response.text)
            assert value(got, "byoc_requests_in_flight", model="") == 2
            gates.open("held")
            assert held.result().status_code == 200 and queued.result().status_code == 200
        assert value(scrape(s), "byoc_requests_in_flight", model="") == 0
    finally:
        s.stop()


@integration
def test_several_workers_scrape_as_one_container(classifier, tmp_path):
    scratch = tmp_path / "tmp"  # the server's temporary folders: its shared metrics folder goes when it stops
    scratch.mkdir()
    s = serve_helpers.serve(
        classifier, BYOC_INFERENCE_BACKEND="onnxruntime", SAGEMAKER_MODEL_SERVER_WORKERS="2", TMPDIR=str(scratch)
    )
    try:
        s.wait_for_log("; ready", count=2)  # /ping answered by one worker says nothing of the other's load
        for _ in range(12):  # a connection each: uvicorn's workers share the socket, so both answer some
            assert httpx.post(f"{s.url}/invocations", json={"inputs": TEXTS[0]}).status_code == 200
        for _ in range(4):  # whichever worker answers the scrape counts the whole container
            got = scrape(s)
            assert value(got, "byoc_requests_total", route="/invocations", code="200", model="") == 12
            # The supervisor and its two workers: never multiprocessing's resource tracker beside them (it was 4).
            assert value(got, "byoc_server_processes") == 3
        assert len(list(scratch.glob("byoc-metrics-*"))) == 1, list(scratch.iterdir())
    finally:
        s.stop()
    assert not list(scratch.glob("byoc-metrics-*")), list(scratch.iterdir())  # it was left behind, one a start


@integration
def test_metrics_can_be_turned_off(classifier):
    s = serve_helpers.serve(classifier, BYOC_INFERENCE_BACKEND="onnxruntime", BYOC_METRICS="false")
    try:
        assert s.invoke({"inputs": TEXTS}).status_code == 200
        assert s.client.get("/metrics").status_code == 404
    finally:
        s.stop()


def _mme_model(classifier: Path, root: Path, name: str) -> Path:
    target = root / "models" / name / "model"
    shutil.copytree(classifier, target)
    return target


@integration
def test_a_multi_model_endpoint_reports_each_model_and_forgets_the_unloaded(classifier, tmp_path):
    (tmp_path / "model").mkdir()
    s = Server(tmp_path / "model", env={"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime"})
    try:
        s.wait_ready()
        for name in ("alpha", "beta"):
            url = str(_mme_model(classifier, tmp_path, name))
            assert s.client.post("/models", json={"model_name": name, "url": url}).status_code == 200
        assert s.client.post("/models", json={"model_name": "bad", "url": "/nowhere"}).status_code == 404
        for name, count in (("alpha", 3), ("beta", 1)):
            for _ in range(count):
                assert s.client.post(f"/models/{name}/invoke", json={"inputs": TEXTS}).status_code == 200
        assert s.client.post("/models/gamma/invoke", json={"inputs": TEXTS}).status_code == 404
        got = scrape(s)
        route = "/models/{model_name}/invoke"
        assert value(got, "byoc_requests_total", route=route, code="200", model="alpha") == 3
        assert value(got, "byoc_requests_total", route=route, code="200", model="beta") == 1
        assert (
            value(got, "byoc_requests_total", route=route, code="404", model="") == 1
        )  # no series for a name never loaded
        assert value(got, "byoc_errors_total", kind="not_found", model="") == 1
        assert value(got, "byoc_batch_size_sum", model="alpha") == 3 * len(TEXTS)
        assert value(got, "byoc_model_loads_total", outcome="loaded") == 2
        assert value(got, "byoc_model_load_seconds_count", outcome="loaded") == 2
        assert value(got, "byoc_models_loaded") == 2
        assert 0 < value(got, "byoc_model_memory_used_bytes") <= value(got, "byoc_model_memory_budget_bytes")
        assert s.client.delete("/models/beta").status_code == 200
        after = scrape(s)
        assert not [key for key in after if ("model", "beta") in key[1]]
        assert value(after, "byoc_model_unloads_total") == 1 and value(after, "byoc_models_loaded") == 1
        assert value(after, "byoc_requests_total", route=route, code="200", model="alpha") == 3
    finally:
        s.stop()


SLOW_LOAD = (
    GATE_CODE
    + """
from byoc.inference import model_fn as default_model_fn


def model_fn(model_dir):
    gate("load")
    return default_model_fn(model_dir)
"""
)


@integration
def test_a_refused_load_never_touches_the_series_of_the_model_of_its_name(classifier, tmp_path):
    """A second POST /models of a name that was loading (409) removed the loading model's series: once
    it had loaded, its invocations showed under no `model` label. A 404 or 400 did the same."""
    gates = Gates(tmp_path / "gates")
    (tmp_path / "model").mkdir()
    (tmp_path / "empty").mkdir()
    env = {"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime", **gates.env()}
    s = Server(tmp_path / "model", env=env)
    url = _mme_model(classifier, tmp_path, "slow")
    (url / "code").mkdir()
    (url / "code" / "inference.py").write_text(SLOW_LOAD)
    load = lambda folder: s.client.post("/models", json={"model_name": "slow", "url": str(folder)})
    bad = [tmp_path / "nowhere", url / "config.json", tmp_path / "empty"]  # 404; 400 a file; 400 no model in it
    refused = lambda: [load(folder).status_code for folder in [url, *bad]]
    try:
        s.wait_ready()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(load, url)
            gates.entered("load")
            while_loading = refused()
            gates.open("load")
            assert first.result().status_code == 200
        once_loaded = refused()
        for _ in range(5):
            assert s.client.post("/models/slow/invoke", json={"inputs": TEXTS}).status_code == 200
        got = scrape(s)
    finally:
        gates.open("load")
        s.stop()
    assert while_loading == once_loaded == [409, 404, 400, 400]
    assert value(got, "byoc_requests_total", route="/models/{model_name}/invoke", code="200", model="slow") == 5
    assert value(got, "byoc_batch_size_sum", model="slow") == 5 * len(TEXTS)
    assert value(got, "byoc_model_loads_total", outcome="loaded") == 1
    assert value(got, "byoc_model_loads_total", outcome="refused") == 8


RELOAD_SCRIPT = """
import asyncio, sys
from byoc.serving.resources import Resources
from byoc.serving.multi_model import Registry
from byoc.serving.prometheus import ServerMetrics
from byoc.serving.settings import ServeSettings

env = {"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime"}
metrics = ServerMetrics(multi_model=True)
registry = Registry(ServeSettings.from_env(env, resources=Resources(cpus=1, memory=4 << 30)), 1 << 30, print, metrics)


async def reload():
    await registry.load("m", sys.argv[1])
    await asyncio.gather(registry.unload("m", 1), registry.load("m", sys.argv[1]))  # loads as the unload waits
    scraped = metrics.exposition(None)[0].decode()
    await registry.stop()
    return 'byoc_queue_depth{model="m"}' in scraped  # the loaded model's series


print(asyncio.run(reload()))
"""


@integration
def test_an_unload_leaves_the_series_of_a_load_of_its_name_begun_meanwhile(classifier):
    """The unload forgot the name's series after waiting for its batcher to stop: a load of that name
    begun meanwhile had taken them, and its invocations showed under no `model` label. In a process
    of its own, as a load sets process-wide state."""
    done = subprocess.run(
        [sys.executable, "-c", RELOAD_SCRIPT, str(classifier)], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "True", done.stdout[-3000:]


# ---------------------------------------------------------------------------------------------
# A real Prometheus server

PROMETHEUS = shutil.which("prometheus")


@integration
@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run installs it)")
def test_a_real_prometheus_scrapes_the_server_and_answers_queries(classifier, tmp_path):
    s = serve_helpers.serve(classifier, BYOC_INFERENCE_BACKEND="onnxruntime")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": "byoc", "static_configs": [{"targets": [f"127.0.0.1:{s.port}"]}]}],
            }
        )
    )
    server = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def query(expression: str) -> list:
        try:
            answer = api.get("/api/v1/query", params={"query": expression}).json()
        except (httpx.TransportError, ValueError):
            return []  # not up yet
        return answer["data"]["result"] if answer.get("status") == "success" else []

    try:
        for _ in range(7):
            assert s.invoke({"inputs": TEXTS}).status_code == 200
        assert s.invoke("{nope").status_code == 400
        expression = 'byoc_requests_total{job="byoc",route="/invocations",code="200"}'
        result = wait_for(
            lambda: [r for r in query(expression) if r["value"][1] == "7"], "Prometheus to scrape 7 requests"
        )
        assert result[0]["metric"]["instance"] == f"127.0.0.1:{s.port}"
        assert wait_for(lambda: query('byoc_errors_total{kind="bad_input"} == 1'), "the bad request in Prometheus")
        assert wait_for(lambda: query("sum(byoc_batch_size_sum) == 28"), "the batch sizes in Prometheus")
        targets = api.get("/api/v1/targets").json()["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"]
        assert urllib.parse.urlparse(targets[0]["scrapeUrl"]).path == "/metrics"
    finally:
        server.terminate()
        server.wait(30)
        s.stop()
