"""A multi-model endpoint under one bad or busy neighbour (issue 28), through a real server: models
whose code shares module names keep their own whatever idiom imports them, and lend no library a
helper file named like the module it imports (nor leave it one after the unload), load/unload churn gives
back all it took (resident memory flat over hundreds of cycles), a load that hangs times out and
costs no other load or model anything, a call that hangs after its model's unload keeps /ping at
503, and hostile load and list requests are clear 4xx answers."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys

import pytest
from serve_helpers import GATE_CODE, HANG_GUARD_S, TEXTS, Gates, wait_for

from serving.test_multi_model import classifier, invoke, load, mme, model_copy, rss_mib  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration  # servers in processes

# The common idiom: the folder on sys.path by the module itself, a helper imported at the top and
# another inside predict_fn (at call time, when every loaded model's folder is on sys.path).
IDIOM = """
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import helper
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    import late
    return [{'label': f"{helper.LABEL}/{late.LABEL}", 'score': a['score']} for a in default(data, model)]


predict_fn.batchable = True
"""


def idiom(label: str, big: bool = False) -> dict[str, str]:
    big_table = "BIG = bytearray(5 << 20)\nBIG[::4096] = b'x' * len(BIG[::4096])\n"  # resident: pages touched
    helper = f"LABEL = {label!r}\n" + (big_table if big else "")
    return {"inference.py": IDIOM, "helper.py": helper, "late.py": f"LABEL = {label!r}\n"}


def test_models_get_their_own_siblings_whatever_idiom_imports_them(classifier, tmp_path):  # noqa: F811
    s = mme(tmp_path)
    try:
        for name in ("alpha", "beta"):
            assert load(s, name, model_copy(classifier, tmp_path, name, idiom(name))).status_code == 200
        # beta's folder is first on sys.path now: alpha's `import late` at call time found beta's late.py.
        answers = {name: invoke(s, name, {"inputs": TEXTS[:2]}).json() for name in ("alpha", "beta", "alpha")}
    finally:
        s.stop()
    assert {a["label"] for a in answers["alpha"]} == {"alpha/alpha"}
    assert {a["label"] for a in answers["beta"]} == {"beta/beta"}


CYCLES = 200
WARM_UP = 20  # cycles before the first measure: allocator arenas, caches of the runtime


def test_load_unload_churn_gives_back_what_each_load_took(classifier, tmp_path):  # noqa: F811
    """A model with code/, a sibling helper and a 5 MB module-level object: each cycle kept ~15 MiB."""
    s = mme(tmp_path)
    url = model_copy(classifier, tmp_path, "churn", idiom("churn", big=True))
    try:
        for cycle in range(CYCLES):
            if cycle == WARM_UP:
                warm = rss_mib(s.proc.pid)
            assert load(s, "churn", url).status_code == 200
            assert invoke(s, "churn", {"inputs": TEXTS[:1]}).json()[0]["label"] == "churn/churn"
            assert s.client.delete("/models/churn").status_code == 200
        grown = rss_mib(s.proc.pid) - warm
    finally:
        s.stop()
    # Kept, a cycle would add >= 5 MiB: 900 MiB over the measured cycles. Given back: a few MiB of noise.
    assert grown < 0.1 * 5 * (CYCLES - WARM_UP), f"{grown:.0f} MiB more after {CYCLES - WARM_UP} cycles"


def test_hostile_load_and_list_requests_are_clear_4xx_never_500(classifier, tmp_path):  # noqa: F811
    s = mme(tmp_path)
    try:
        url = model_copy(classifier, tmp_path, "m")
        assert load(s, "m", url).status_code == 200
        listing = lambda token: s.client.get("/models", params={"next_page_token": token})
        for token in ("²", "9" * 5000, "-1", "abc"):  # "²" passed str.isdigit, then int() refused it: 500
            answer = listing(token)
            assert answer.status_code == 400 and "next_page_token" in answer.json()["error"], (token, answer.text)
        assert listing("0").json()["models"][0]["modelName"] == "m"
        assert s.client.get("/models", params={"limit": "²"}).json()["models"][0]["modelName"] == "m"
        nested = b'{"model_name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # RecursionError: 500
        assert s.client.post("/models", content=nested).status_code == 400
        long_name = s.client.post("/models", json={"model_name": "x" * 200_000, "url": str(url)})  # was 200, then 431
        assert long_name.status_code == 400 and "at most 1024" in long_name.json()["error"]
        a_file = load(s, "f", url / "config.json")  # was 404 "does not exist"
        assert a_file.status_code == 400 and "is a file" in a_file.json()["error"]
        (tmp_path / "empty").mkdir()
        empty = load(s, "e", tmp_path / "empty")  # fell back to torch silently, outside the budget
        assert empty.status_code == 400 and "no model in" in empty.json()["error"]
        assert [m["modelName"] for m in s.client.get("/models").json()["models"]] == ["m"]
        assert invoke(s, "m", {"inputs": TEXTS[:1]}).status_code == 200
    finally:
        log = s.stop()
    assert "Traceback" not in log


HANGS_AT_LOAD = (
    GATE_CODE
    + """
from byoc.inference import model_fn as default_model_fn


def model_fn(model_dir):
    gate("load")
    return default_model_fn(model_dir)
"""
)


def test_a_load_being_made_has_one_state_on_every_route(classifier, tmp_path):  # noqa: F811
    """Retrying its name answered 409 "loaded already" while GET and DELETE answered 404."""
    gates = Gates(tmp_path / "gates")
    s = mme(tmp_path)
    try:
        url = model_copy(classifier, tmp_path, "slow", {"inference.py": HANGS_AT_LOAD})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(load, s, "slow", url)
            gates.entered("load")
            again = load(s, "slow", url)
            described, deleted = s.client.get("/models/slow"), s.client.delete("/models/slow")
            gates.open("load")
            assert slow.result().status_code == 200
    finally:
        s.stop()
    assert again.status_code == 409 and "is loading already" in again.json()["error"]
    for answer in (described, deleted):
        assert answer.status_code == 404 and "is loading: not loaded yet" in answer.json()["error"], answer.text


def test_a_load_that_hangs_times_out_and_costs_no_other_load_or_model_anything(classifier, tmp_path):  # noqa: F811
    """A model_fn that hangs held the one load slot for good: every later load waited, its name
    answered 409 on POST and 404 elsewhere, and /ping stayed 200."""
    gates = Gates(tmp_path / "gates")
    # Every load here is under the timeout: 5 s leaves an ordinary load (a tenth of a second) a wide
    # margin on a busy machine, and each hung load below costs the test that long.
    s = mme(tmp_path, BYOC_MULTI_MODEL_LOAD_TIMEOUT="5")
    try:
        assert load(s, "good", model_copy(classifier, tmp_path, "good")).status_code == 200
        stuck_urls = {name: model_copy(classifier, tmp_path, name, {"inference.py": HANGS_AT_LOAD}) for name in "xyz"}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            stuck = pool.submit(load, s, "x", stuck_urls["x"])
            gates.entered("load")
            queued = pool.submit(load, s, "other", model_copy(classifier, tmp_path, "other"))  # behind the hung one
            timed_out, other = stuck.result(), queued.result()
        assert timed_out.status_code == 504, timed_out.text
        assert "has not ended" in timed_out.json()["error"] and "BYOC_MULTI_MODEL_LOAD_TIMEOUT=5 s" in timed_out.text
        assert other.status_code == 200
        # One state on every route: not loaded, and why; another try is answered at once.
        retried = load(s, "x", stuck_urls["x"])
        assert retried.status_code == 504 and "has not ended" in retried.json()["error"]
        for answer in (s.client.get("/models/x"), s.client.delete("/models/x"), invoke(s, "x", {"inputs": "a"})):
            assert answer.status_code == 404 and "has not ended" in answer.json()["error"], answer.text
        assert [m["modelName"] for m in s.client.get("/models").json()["models"]] == ["good", "other"]
        assert invoke(s, "good", {"inputs": TEXTS[:1]}).status_code == 200
        assert s.client.get("/ping").status_code == 200  # every loaded model answers
        # Loads that never end hold threads and memory for good: from the third, /ping says so.
        assert load(s, "y", stuck_urls["y"]).status_code == 504
        assert s.client.get("/ping").status_code == 200
        assert load(s, "z", stuck_urls["z"]).status_code == 504
        ping = s.client.get("/ping")
        assert ping.status_code == 503 and "3 loads hang ('x', 'y', 'z')" in ping.json()["error"]
        gates.open("load")  # the hung loads end: what they loaded is dropped, their names free again
        for name in "xyz":  # each ends on its own thread, in any order
            s.wait_for_log(f"the hung load of {name!r} ended")
        wait_for(lambda: s.client.get("/ping").status_code == 200, "/ping healthy once the hung loads ended")
        assert load(s, "x", stuck_urls["x"]).status_code == 200
        assert invoke(s, "x", {"inputs": TEXTS[:1]}).status_code == 200
    finally:
        gates.open("load")
        s.stop()


HANGS_AT_PREDICT = (
    GATE_CODE
    + """
from byoc.inference import predict_fn as default


def predict_fn(data, model):
    gate("predict")
    return default(data, model)


predict_fn.batchable = True
"""
)


def test_a_call_that_hangs_after_its_model_is_unloaded_keeps_ping_at_503(classifier, tmp_path):  # noqa: F811
    """/ping turned 200 again after the unload while the orphaned call held the one inference thread,
    so every other model timed out behind a healthy /ping."""
    gates = Gates(tmp_path / "gates")
    # The other model's requests are under this timeout too: 5 s leaves them a wide margin.
    s = mme(tmp_path, SAGEMAKER_MODEL_SERVER_TIMEOUT="5")
    try:
        assert load(s, "other", model_copy(classifier, tmp_path, "other")).status_code == 200
        url = model_copy(classifier, tmp_path, "hangs", {"inference.py": HANGS_AT_PREDICT})
        assert load(s, "hangs", url).status_code == 200
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(invoke, s, "hangs", {"inputs": TEXTS[:1]})
            gates.entered("predict")
            assert call.result().status_code == 504  # SAGEMAKER_MODEL_SERVER_TIMEOUT
        assert s.client.delete("/models/hangs").status_code == 200
        ping = wait_for(lambda: (p := s.client.get("/ping")).status_code == 503 and p, "/ping 503")
        assert "'hangs', unloaded since" in ping.json()["error"], ping.text
        assert s.client.get("/ping").status_code == 503  # and stays so while the call holds the thread
        gates.open("predict")
        wait_for(lambda: s.client.get("/ping").status_code == 200, "/ping healthy once the call ended")
        assert invoke(s, "other", {"inputs": TEXTS[:1]}).status_code == 200
    finally:
        gates.open("predict")
        s.stop()


GROWS = """
from byoc.inference import predict_fn as default

HELD = []


def predict_fn(data, model):
    if "grow" in data["inputs"]:
        HELD.append(bytearray(300 << 20))
        HELD[-1][::4096] = b"x" * len(HELD[-1][::4096])  # resident: every page touched
    return default(data, model)


predict_fn.batchable = True
"""


def test_a_model_that_grew_while_serving_counts_at_the_next_load(classifier, tmp_path):  # noqa: F811
    """The budget was checked against what each model took at its load only: a model that grew by
    300 MiB while serving was never counted, and a later load could push the container out of memory."""
    s = mme(tmp_path, BYOC_MULTI_MODEL_MEMORY_MB="250")
    try:
        assert load(s, "grows", model_copy(classifier, tmp_path, "grows", {"inference.py": GROWS})).status_code == 200
        assert invoke(s, "grows", {"inputs": ["grow"]}).status_code == 200
        refused = load(s, "next", model_copy(classifier, tmp_path, "next"))
        assert refused.status_code == 507, refused.text
        assert "measured now: 3" in refused.json()["error"], refused.text  # 300-odd MiB, of the 250
        assert s.client.delete("/models/grows").status_code == 200  # gives the 300 MiB back
        assert load(s, "next", tmp_path / "models" / "next" / "model").status_code == 200
    finally:
        s.stop()


def test_a_load_whose_model_fn_fails_leaves_none_of_its_code(tmp_path):
    """The failed model's inference.py and helper stayed in sys.modules: each retry kept another copy.
    In a process of its own: a load sets process-wide state (the default handlers' settings,
    OMP_NUM_THREADS) that later tests in this one must not inherit."""
    code = tmp_path / "models" / "bad" / "model" / "code"
    code.mkdir(parents=True)
    (code / "helper.py").write_text("TABLE = bytearray(1 << 20)\n")
    (code / "inference.py").write_text("import helper\n\n\ndef model_fn(model_dir):\n    raise ValueError('no')\n")
    script = f"""
import asyncio, sys
from byoc.serving.resources import Resources
from byoc.serving.multi_model import LoadRefused, Registry
from byoc.serving.settings import ServeSettings

env = {{"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_BASE_DIR": {str(tmp_path)!r}}}
registry = Registry(ServeSettings.from_env(env, resources=Resources(cpus=1, memory=4 << 30)), 1 << 30, print)


async def load_twice():
    statuses = []
    for _ in range(2):
        try:
            await registry.load("bad", {str(code.parent)!r})
        except LoadRefused as refused:
            statuses.append(refused.status)
    await registry.stop()
    return statuses


print(asyncio.run(load_twice()), [name for name in sys.modules if name.startswith("byoc_model_")])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[500, 500] []", done.stdout[-3000:]


# Helper files named like standard-library modules, and a model whose code is on the stack while
# libraries import them for the first time: at the model's import (unittest.case imports difflib and
# pprint) and in its model_fn (multiprocessing.spawn imports runpy; shutil imports tarfile when it
# first packs a tar). The libraries got the model's files, and held them after its unload.
SHADOWS = ("difflib", "pprint", "runpy", "tarfile")
SHADOWING = """
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import pprint  # the model's own pprint.py: its own file imports it
import unittest.case
from byoc.inference import model_fn as default_model_fn

OWN_PPRINT = pprint


def model_fn(model_dir):
    import multiprocessing.spawn
    import shutil
    shutil.make_archive(os.path.join(os.path.dirname(model_dir), "packed"), "tar", os.path.dirname(__file__))
    model = default_model_fn(model_dir)
"""
SHADOW_SCRIPT = """
import asyncio, json, sys, types
from byoc.serving.resources import Resources
from byoc.serving.multi_model import LoadRefused, Registry
from byoc.serving.settings import ServeSettings

FOLDER, URL, SHADOWS = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
env = {"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime"}
registry = Registry(ServeSettings.from_env(env, resources=Resources(cpus=1, memory=4 << 30)), 1 << 30, print)


def of_model(value):
    return isinstance(value, types.ModuleType) and (getattr(value, "__file__", None) or "").startswith(FOLDER + "/")


first = [name for name in SHADOWS + ["unittest", "multiprocessing.spawn"] if name in sys.modules]


async def load_and_unload():
    try:
        entry = await registry.load("m", URL)
    except LoadRefused as refused:
        return refused.status, None
    own = of_model(sys.modules[entry.server.code_name].OWN_PPRINT)
    await registry.unload("m", wait=1)
    return 200, own


status, own = asyncio.run(load_and_unload())
held = [f"{name}.{attr}" for name, module in list(sys.modules.items())
        for attr, value in list(getattr(module, "__dict__", {}).items()) if of_model(value)]
real = {name: name in sys.modules and not of_model(sys.modules[name]) for name in SHADOWS}
libraries = [sys.modules["unittest.case"].pprint, sys.modules["unittest.case"].difflib,
             sys.modules["multiprocessing.spawn"].runpy]
print(json.dumps({"first": first, "status": status, "own": own, "held": sorted(held), "real": real,
                  "libraries_real": [sys.modules.get(m.__name__) is m for m in libraries]}))
"""


@pytest.mark.parametrize("fails", [False, True], ids=["unloaded", "failed"])
def test_a_models_helper_files_are_never_a_librarys_and_leave_with_it(classifier, tmp_path, fails):  # noqa: F811
    """In a process of its own: the libraries' first imports of these modules happen there."""
    ending = "    raise ValueError('no')\n" if fails else "    return model\n"
    code = {"inference.py": SHADOWING + ending} | {f"{name}.py": "FROM_THE_MODEL = True\n" for name in SHADOWS}
    url = model_copy(classifier, tmp_path, "m", code)
    args = [str(url / "code"), str(url), ",".join(SHADOWS)]
    done = subprocess.run(
        [sys.executable, "-c", SHADOW_SCRIPT, *args], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["first"] == [], got  # else the libraries imported them before the model's code ran
    assert (got["status"], got["own"]) == ((500, None) if fails else (200, True)), done.stdout[-3000:]
    assert got["held"] == [], got  # references to the model's private modules, from library modules
    assert got["real"] == dict.fromkeys(SHADOWS, True) and got["libraries_real"] == [True] * 3, got
