"""What the serving tests share: models to serve (trained by `byoc train`, or a tiny classifier with
its serving graph built in process), `byoc serve` in a process of its own, and a model whose
code/inference.py is replaced."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from helpers import Job, run_train_process, sentiment_rows, write_csv

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["i love this so much", "i hate this a lot number 3", "what a great day it was", "rude people and cold food"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trained_classifier(tmp_path_factory, tiny_model_dir: Path) -> Path:
    """A tiny classifier trained by `byoc train` (the artifact layout the server must serve), trained
    once per test session: the modules that serve it share it."""
    root = tmp_path_factory.getbasetemp() / "serve-job" / "opt-ml"
    if (root / "model" / "model.onnx").exists():
        return root / "model"
    shutil.rmtree(root, ignore_errors=True)
    job = Job(root).resources()
    job.hyperparameters({"max_steps": "30", "learning_rate": "5e-3", "per_device_train_batch_size": "8"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(64))
    done = run_train_process(root)
    assert done.returncode == 0, done.stdout[-2000:]
    return job.model_dir


def tiny_classifier(tmp_path_factory, tiny_model_dir: Path) -> Path:
    """A 2-label classifier on the tiny BERT, untrained, saved as byoc publishes it, with its serving
    graph: the default handlers load it on ONNX Runtime in well under a second. Built once a session."""
    target = tmp_path_factory.getbasetemp() / "tiny-classifier"
    if (target / "model.onnx").exists():
        return target
    import torch
    from transformers import AutoModelForSequenceClassification

    from byoc import onnx_graph

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
    )
    shutil.rmtree(target, ignore_errors=True)
    model.save_pretrained(target, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, target / name)
    assert onnx_graph.export(target) is not None
    return target


def model_with_code(model_dir: Path, tmp_path: Path, source: str, name: str = "inference.py") -> Path:
    """A copy of the model (under tmp_path/opt-ml/model) whose code/ holds `source` as `name`."""
    target = tmp_path / "opt-ml" / "model"
    shutil.copytree(model_dir, target)
    (target / "code").mkdir(exist_ok=True)
    (target / "code" / name).write_text(source)
    return target


class Server:
    """`byoc serve` in a process of its own, on a free port (`byoc`: another install's command, e.g. a venv's)."""

    def __init__(self, model_dir: Path, env: dict | None = None, byoc: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = model_dir.parent
        full_env = {
            **os.environ,
            "SAGEMAKER_BASE_DIR": str(base),
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            **(env or {}),
        }
        full_env.pop("SM_MODEL_DIR", None)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [str(byoc or Path(sys.executable).parent / "byoc"), "serve"],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("server exited: " + self.proc.stdout.read()[-3000:])
            try:
                if self.client.get("/ping").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("server never became ready")

    def invoke(self, body, content_type="application/json", accept=None, **kwargs) -> httpx.Response:
        headers = {"content-type": content_type, **({"accept": accept} if accept else {})}
        data = json.dumps(body) if not isinstance(body, (str, bytes)) else body
        return self.client.post("/invocations", content=data, headers=headers, **kwargs)

    def wait_exit(self, timeout: float = 60) -> tuple[int, str]:
        """(exit code, log) of a server expected to exit on its own; fails if it keeps running."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server kept running: " + self.proc.stdout.read()[-2000:]) from None
        return code, self.proc.stdout.read()

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stdout.read()


def serve(model_dir: Path, tmp_path: Path | None = None, source: str | None = None, **env: str) -> Server:
    """A ready server on the model; with `source`, on a copy of it whose code/inference.py is `source`."""
    if source is not None:
        assert tmp_path is not None
        model_dir = model_with_code(model_dir, tmp_path, source)
    s = Server(model_dir, env=env)
    s.wait_ready()
    return s
