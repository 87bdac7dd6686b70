"""BYOC_PROFILE=async: an asynchronous endpoint's request of 100,000 texts (a JSON Lines body, as a
batch of records from S3) is answered in full, in memory bounded by a few times the body, while
ordinary requests sent meanwhile are answered before it, not after."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import pytest
import serve_helpers
from serve_helpers import GATE_CODE, TEXTS, Gates, Server

pytestmark = pytest.mark.integration  # a server in a process of its own


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# The default handlers, where a batch of the big request's waits until an ordinary request is on its
# way (past its input_fn, not yet predicted), until four ordinary ones were predicted. However fast the
# machine, the big request is not done before the third ordinary one was answered (the test sends them
# one after the other), and no wait depends on which of the two the batcher picks next: waiting for the
# k-th ordinary request's note alone (an earlier version) deadlocked whenever the big request's next
# batch was picked before the ordinary request reached the batcher, which holds the inference thread.
ORDINARY = ["an ordinary request", "and another one"]
TAKES_TURNS = (
    GATE_CODE
    + f"""
from byoc.inference import input_fn as default_input, predict_fn as default

ORDINARY = {ORDINARY!r}
TEXTS = {TEXTS!r}  # the big request's texts are these with a number


def input_fn(body, content_type):
    data = default_input(body, content_type)
    if data["inputs"] == ORDINARY:
        note("ordinary")
    return data


def predict_fn(data, model):
    texts = data["inputs"]
    if ORDINARY[0] in texts:
        note("ordinary.predicted")
    elif any(text not in TEXTS for text in texts):  # the big request's alone (merged: nothing to wait for)
        _until(
            lambda: noted("ordinary") > noted("ordinary.predicted") or noted("ordinary.predicted") >= 4,
            "an ordinary request on its way",
        )
    return default(data, model)


predict_fn.batchable = True
"""
)


def test_a_hundred_thousand_texts_are_answered_in_full_and_nobody_waits_behind_them(
    tmp_path, tmp_path_factory, tiny_model_dir
):
    model = serve_helpers.model_with_code(  # where the server looks: SAGEMAKER_BASE_DIR/model
        serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir), tmp_path, TAKES_TURNS
    )
    texts = [f"{TEXTS[i % 4]} {i}" for i in range(100_000)]
    body = "\n".join(json.dumps(t) for t in texts).encode()
    s = Server(model, env={"BYOC_PROFILE": "async", **Gates(tmp_path / "gates").env()})
    try:
        s.wait_ready()
        s.invoke({"inputs": TEXTS})
        before = rss_mib(s.proc.pid)
        peak = before
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            big = pool.submit(
                s.client.post, "/invocations", content=body, headers={"content-type": "application/jsonlines"}
            )
            ordinary = []
            while not big.done():
                answer = s.invoke({"inputs": ORDINARY})
                ordinary.append((answer.status_code, big.done()))
                peak = max(peak, rss_mib(s.proc.pid))
                time.sleep(0.2)  # a sample of memory and an ordinary request every 0.2 s, not a flood
            answer = big.result()
    finally:
        s.stop()
    assert answer.status_code == 200, answer.text[:500]
    assert len(answer.json()) == 100_000
    assert ordinary and all(status == 200 for status, _ in ordinary)
    # Not starved: ordinary requests were answered while the big one was still running.
    assert sum(1 for _, big_done in ordinary if not big_done) >= 3, ordinary
    body_mib = len(body) / 2**20
    assert peak - before < 8 * body_mib + 50, (before, peak, body_mib)


def test_the_profile_lifts_the_limits_and_each_variable_still_wins(tmp_path):
    from byoc.serving.settings import ServeSettings

    env = {"SAGEMAKER_BASE_DIR": str(tmp_path)}
    realtime, asynchronous = ServeSettings.from_env(env), ServeSettings.from_env({**env, "BYOC_PROFILE": "async"})
    assert (realtime.max_payload_mb, realtime.timeout, realtime.max_inputs) == (6, 60, 4096)
    assert (asynchronous.max_payload_mb, asynchronous.timeout, asynchronous.max_inputs) == (1024, 3600, 1_000_000)
    assert asynchronous.max_queued_inputs >= asynchronous.max_inputs and asynchronous.body_timeout == 900
    chosen = ServeSettings.from_env({**env, "BYOC_PROFILE": "async", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "900"})
    assert chosen.timeout == 900
    with pytest.raises(ValueError, match="BYOC_PROFILE"):
        ServeSettings.from_env({**env, "BYOC_PROFILE": "batch"})
