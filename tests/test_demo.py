"""The README's first screen: the demo job runs end to end and learns its task, and `byoc serve` on the
demo's model answers the README's own request with the answer the README shows (same shape, same
labels)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from readme_example import labels, served_example, shape
from serve_helpers import Server

pytestmark = pytest.mark.integration  # real jobs in processes: not in make test-fast

REPO = Path(__file__).resolve().parents[1]


def test_demo_trains_predicts_and_serves_the_readme_answer(tmp_path):
    env = {**os.environ, "BYOC_DEMO_DIR": str(tmp_path)}
    env.pop("SAGEMAKER_BASE_DIR", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", done.stdout).group(1))
    assert accuracy >= 0.8, done.stdout[-2000:]
    assert "-> shipping" in done.stdout and "-> billing" in done.stdout
    assert (tmp_path / "opt-ml" / "model" / "model.safetensors").exists()

    # The README serves demo-output/opt-ml with `byoc serve` and sends one curl request: the same here,
    # on this test's copy of the demo and a free port, with the path, headers and body read from README.md.
    example = served_example()
    server = Server(tmp_path / "opt-ml" / "model")
    try:
        server.wait_ready()
        response = server.client.post(example.path, content=example.body.encode(), headers=example.headers)
    finally:
        log = server.stop()
    assert response.status_code == 200, response.text + log[-2000:]
    answer = response.json()
    assert shape(answer) == shape(example.answer), f"README shows {example.answer}, the server answered {answer}"
    assert labels(answer) == labels(example.answer), f"README shows {example.answer}, the server answered {answer}"


def test_the_retrieval_demo_trains_evaluates_encodes_serves_and_answers_its_query(tmp_path):
    """`make demo-retrieval`: byoc train, encode and serve one after another on the CPU; the held-out questions
    ranked better than BM25 ranks them, and the query's best article is the one it asks about."""
    env = {**os.environ, "BYOC_DEMO_DIR": str(tmp_path)}
    env.pop("SAGEMAKER_BASE_DIR", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo_retrieval.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(r"NDCG@10 ([0-9.]+) on the held-out questions \(BM25: ([0-9.]+)\)", done.stdout)
    assert float(found.group(1)) > float(found.group(2)), done.stdout
    assert "encoded 16 articles" in done.stdout and "1. Lost parcels" in done.stdout, done.stdout
    assert (tmp_path / "retrieval" / "encode" / "model" / "manifest.json").exists()
