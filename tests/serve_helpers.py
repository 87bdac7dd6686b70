"""What the serving tests share: models to serve (trained by `byoc train`, or a tiny classifier with
its serving graph built in process), `byoc serve` in a process of its own, a model whose
code/inference.py is replaced, and ways to wait on the server's progress instead of the clock
(`wait_for`, `Gates`, `Server.wait_for_log`; docs/testing.md, "Independent of speed")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from helpers import Job, run_train_process, sentiment_rows, write_csv

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["i love this so much", "i hate this a lot number 3", "what a great day it was", "rude people and cold food"]

# A bound that only guards against a hang: minutes, where what is waited for takes well under a second
# here, so that no machine is slow enough to reach it. It says nothing about speed.
HANG_GUARD_S = 300

# The durations a serving test may assert: promises to SageMaker's clients, not guesses about our speed.
PING_S = 2  # SageMaker's: /ping answers within 2 s, else the instance is taken for unhealthy
INVOCATION_S = 60  # SageMaker's: an invocation is answered within 60 s
STOP_GRACE_S = 30  # SageMaker's: an endpoint's container gets SIGKILL 30 s after SIGTERM


def wait_for(predicate: Callable[[], object], what: str, timeout: float = HANG_GUARD_S, every: float = 0.02):
    """Poll `predicate` until it returns something true, and return that; fail naming `what` if it has
    not after `timeout` s (a hang guard, never a measure of speed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(every)


# Handler code a test's code/inference.py starts with (`GATE_CODE + source`): `note(name, text)` says
# that a call got somewhere (a line in a file the test reads), `gate(name)` holds a call until the test
# opens the gate (`Gates.open`), `wait_noted(name, count)` until other calls have noted `name` `count`
# times: a slow handler that lasts exactly as long as the test needs, on any machine, where a `sleep`
# would have to end at the right moment.
GATE_CODE = """
import os as _os
import time as _time


def _path(name):
    return _os.path.join(_os.environ["BYOC_TEST_GATES"], name)


def note(name, text=""):
    with open(_path(name + ".log"), "a") as f:
        f.write(text + "\\n")


def _until(done, what):
    deadline = _time.monotonic() + 300  # a hang guard: the test (or another request) gets there first
    while not done():
        if _time.monotonic() > deadline:
            raise RuntimeError("waited 300 s for " + what)
        _time.sleep(0.01)


def gate(name):
    note(name + ".entered")
    _until(lambda: _os.path.exists(_path(name + ".open")), "the test to open the gate " + name)
    note(name + ".left")


def noted(name):
    try:
        with open(_path(name + ".log")) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


def wait_noted(name, count):
    _until(lambda: noted(name) >= count, str(count) + " notes " + name)
"""


class Gates:
    """The test's side of GATE_CODE: a folder the handlers write their notes in (`env()` names it to the
    server), the notes read back, and gates opened."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        return {"BYOC_TEST_GATES": str(self.folder)}

    def notes(self, name: str) -> list[str]:
        path = self.folder / f"{name}.log"
        return path.read_text().splitlines() if path.exists() else []

    def wait(self, name: str, count: int = 1, text: str | None = None) -> list[str]:
        """The notes `name` once there are `count` of them (of `text`, if given)."""

        def enough() -> list[str] | None:
            notes = self.notes(name)
            return notes if sum(1 for n in notes if text is None or n == text) >= count else None

        return wait_for(enough, f"{count} note(s) {name!r}" + (f" of {text!r}" if text is not None else ""))

    def entered(self, name: str, count: int = 1) -> None:
        """Wait until `count` calls have reached gate `name` (they wait there until it opens)."""
        self.wait(name + ".entered", count)

    def open(self, name: str) -> None:
        (self.folder / f"{name}.open").write_text("")


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

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
    )
    return _publish(model, tiny_model_dir, target)


def task_classifier(tmp_path_factory, tiny_model_dir: Path, task: str) -> Path:
    """A tiny untrained model of `task` (multi_label_classification: anger, joy, love with threshold
    0.3; regression: one output named "similarity"; token_classification: O, B-PER, I-PER, B-LOC,
    I-LOC), saved as byoc publishes it, with its serving graph."""
    target = tmp_path_factory.getbasetemp() / f"tiny-{task}"
    if (target / "model.onnx").exists():
        return target
    import torch
    import transformers

    from byoc.tasks import get as task_named

    names = {
        "multi_label_classification": ["anger", "joy", "love"],
        "regression": ["similarity"],
        "token_classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    }[task]
    torch.manual_seed(0)
    model = getattr(transformers, task_named(task).auto_class).from_pretrained(
        tiny_model_dir,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        **({} if task == "token_classification" else {"problem_type": task}),
    )
    if task == "multi_label_classification":
        model.config.byoc_threshold = 0.3
    return _publish(model, tiny_model_dir, target)


def _publish(model, tiny_model_dir: Path, target: Path) -> Path:
    """The model saved as byoc publishes it: safetensors, the tiny BERT's tokenizer, the serving graph."""
    from byoc import onnx_graph

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
        self.client = httpx.Client(base_url=self.url, timeout=INVOCATION_S)  # SageMaker's limit for an answer
        # Read from the start: a server that logs more than the pipe holds (64 KiB) would block in its
        # next log line (a multi-model churn of 200 cycles did).
        self._lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self._lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = HANG_GUARD_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("server exited: " + self.rest()[-3000:])
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

    def log(self) -> str:
        """What the server has printed so far."""
        return "".join(self._lines)

    def wait_for_log(self, text: str, count: int = 1, timeout: float = HANG_GUARD_S) -> str:
        """The log once `text` is in it `count` times; fails if the server exits first."""

        def there() -> str | None:
            exited = self.proc.poll() is not None
            log = self.log()
            if log.count(text) >= count:
                return log
            if exited and not self._reader.is_alive():
                raise AssertionError(f"the server exited before logging {text!r}: " + log[-3000:])
            return None

        return wait_for(there, f"{text!r} in the server's log", timeout)

    def rest(self) -> str:
        """The whole log of a server that has exited."""
        self._reader.join(HANG_GUARD_S)
        return "".join(self._lines)

    def wait_exit(self, timeout: float = HANG_GUARD_S) -> tuple[int, str]:
        """(exit code, log) of a server expected to exit on its own; fails if it keeps running (a hang guard)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server kept running: " + self.rest()[-2000:]) from None
        return code, self.rest()

    def stop(self) -> str:
        """Stop the server as SageMaker does (SIGTERM, SIGKILL after its grace); its whole log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.rest()


def serve(model_dir: Path, tmp_path: Path | None = None, source: str | None = None, **env: str) -> Server:
    """A ready server on the model; with `source`, on a copy of it whose code/inference.py is `source`."""
    if source is not None:
        assert tmp_path is not None
        model_dir = model_with_code(model_dir, tmp_path, source)
    s = Server(model_dir, env=env)
    s.wait_ready()
    return s
