"""The reference stack: the Hugging Face inference DLC's model server, run locally for benchmarks.

SageMaker users serve HF text classifiers today with the Hugging Face PyTorch inference DLC: Java
multi-model-server (MMS) 1.1.11 in front of Python workers that run sagemaker-huggingface-
inference-toolkit's handler service. `setup()` builds that stack in `.venv-ref` (torch 2.13.0 CPU,
transformers 4.57.6, toolkit 2.6.0, MMS 1.1.11, setuptools<81); `start()`/`stop()` run it.

How the DLC starts it (read: aws/deep-learning-containers huggingface/pytorch/inference/docker/
2.6/py3/Dockerfile.cpu and huggingface/build_artifacts/inference/mms-entrypoint.py; in the venv
sagemaker_huggingface_inference_toolkit/{serving,mms_model_server,handler_service}.py,
sagemaker_inference/{model_server,environment}.py, mms/{model_server,model_service_worker}.py):
- `python dockerd-entrypoint.py serve` calls `serving.main()`, in WORKDIR / with ENV TEMP=/tmp,
  PYTHONUNBUFFERED=1, PYTHONDONTWRITEBYTECODE=1, MKL_THREADING_LAYER=GNU.
- `serving.main()` puts /opt/ml/model/code on PYTHONPATH, writes /etc/sagemaker-mms.properties
  (inference+management address http://0.0.0.0:8080 or $SAGEMAKER_BIND_TO_PORT, workers only if
  SAGEMAKER_MODEL_SERVER_WORKERS is set, vmargs=-XX:-UseContainerSupport), runs `multi-model-server
  --start --model-store / --mms-config /etc/sagemaker-mms.properties --log-config
  <sagemaker_inference>/etc/log4j2.xml --models model=/opt/ml/model` and waits on the Java process.
  MMS then defaults to one worker per CPU (2 here): one worker server process that forks a child
  per worker; each child builds `pipeline(HF_TASK, model_dir)`, after importing
  /opt/ml/model/code/inference.py as a user override if there is one.

This module runs that same `serving.main()` with HF_TASK=text-classification and the DLC's ENV,
and changes only where things live, all in a fresh temporary run dir:
- The model: the toolkit reads SAGEMAKER_BASE_DIR instead of /opt/ml, so it is copied to
  <run dir>/model *without* `code/` (that inference.py is written for our server). /opt/ml is unused.
- /etc/sagemaker-mms.properties is hard-coded (a module constant): the launcher re-points it to
  <run dir>/sagemaker-mms.properties before calling `serving.main()`; the content is unchanged.
- cwd = <run dir>, so MMS's log4j2 files land in <run dir>/logs (mms_log, access_log, ...); TEMP
  and TMPDIR = <run dir>/tmp hold MMS's .model_server.pid and the workers' unix sockets. The
  launcher's stdout/stderr (which also carry MMS's and the workers' logs) go to `log_path`.
- 127.0.0.1 only: the config enables MMS's env overrides, so MMS_INFERENCE_ADDRESS and
  MMS_MANAGEMENT_ADDRESS replace the toolkit's 0.0.0.0; the port also goes the toolkit's way,
  SAGEMAKER_BIND_TO_PORT. As in the DLC, the management API shares that port.
/ping answers 200 as soon as the Java frontend is up, seconds before a worker has loaded the model:
measure both `wait_ready` and `wait_first_answer`. The toolkit refuses to start while another MMS
runs on the machine ("multiple mms model servers are not supported"): one reference at a time.

    python benchmarks/reference_stack.py setup
    python benchmarks/reference_stack.py smoke --model-dir DIR [--port 8081]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from child_process import dies_with_parent, exit_on_sigterm  # benchmarks/, beside this script

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-ref"
PY = VENV / "bin" / "python"
STAMP = VENV / ".reference-stack-installed"
# torch first and pinned: the CPU wheel on this machine's disk satisfies it; unpinned, a later
# install could pull a multi-GB CUDA build.
TORCH = ["torch==2.13.0"]
PACKAGES = [
    "transformers==4.57.6",
    "sagemaker-huggingface-inference-toolkit==2.6.0",
    "multi-model-server==1.1.11",
    "setuptools<81",
]
MMS_CLASS = "com.amazonaws.ml.mms.ModelServer"
LAUNCHER = """import sys
from sagemaker_inference import model_server
from sagemaker_huggingface_inference_toolkit import mms_model_server, serving
model_server.MMS_CONFIG_FILE = mms_model_server.MMS_CONFIG_FILE = sys.argv[1]
serving.main()
"""


class ReferenceServer(subprocess.Popen):
    """The launcher process (`serving.main()`), with its run dir and start time."""

    run_dir: Path
    started_at: float  # time.monotonic() at launch


def _java_major() -> int:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    except FileNotFoundError:
        return 0
    match = re.search(r'version "(\d+)', out)
    return int(match.group(1)) if match else 0


def setup() -> Path:
    """Create `.venv-ref` with the reference stack and make sure Java 17+ is there; idempotent."""
    wanted = "\n".join(TORCH + PACKAGES)
    if STAMP.is_file() and STAMP.read_text() == wanted and _java_major() >= 17:
        return VENV
    if not PY.exists():
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(VENV)], check=True)
    for group in (TORCH, PACKAGES):
        subprocess.run([str(PY), "-m", "pip", "install", "--quiet", *group], check=True)
    if _java_major() < 17:
        subprocess.run(["apt-get", "update"], check=True)
        subprocess.run(["apt-get", "install", "-y", "openjdk-17-jre-headless"], check=True)
    subprocess.run([str(PY), "-c", "import sagemaker_huggingface_inference_toolkit.handler_service"], check=True)
    STAMP.write_text(wanted)
    return VENV


def start(model_dir: Path, port: int, workers: int | None = None, log_path: Path | None = None) -> ReferenceServer:
    """Start the DLC's server on 127.0.0.1:port serving a copy of `model_dir` without `code/`."""
    model_dir = Path(model_dir).resolve()
    run_dir = Path(tempfile.mkdtemp(prefix="reference-stack-"))
    shutil.copytree(model_dir, run_dir / "model", ignore=lambda d, names: ["code"] if Path(d) == model_dir else [])
    (run_dir / "tmp").mkdir()
    address = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(  # the toolkit runs `multi-model-server` from PATH
        PATH=f"{VENV / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        HF_TASK="text-classification",
        SAGEMAKER_BASE_DIR=str(run_dir),
        SAGEMAKER_BIND_TO_PORT=str(port),
        MMS_INFERENCE_ADDRESS=address,
        MMS_MANAGEMENT_ADDRESS=address,
        TEMP=str(run_dir / "tmp"),
        TMPDIR=str(run_dir / "tmp"),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        MKL_THREADING_LAYER="GNU",
    )
    if workers:
        env["SAGEMAKER_MODEL_SERVER_WORKERS"] = str(workers)
    log_path = Path(log_path) if log_path else run_dir / "server.log"
    with open(log_path, "ab") as log:
        proc = ReferenceServer(
            [str(PY), "-c", LAUNCHER, str(run_dir / "sagemaker-mms.properties")],
            cwd=run_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=dies_with_parent,
        )
    proc.run_dir, proc.started_at = run_dir, time.monotonic()
    return proc


def _processes(proc: ReferenceServer) -> dict[int, str]:
    """Live processes of the stack: its process group, plus anything naming its run dir."""
    found: dict[int, str] = {}
    for entry in (e for e in Path("/proc").iterdir() if e.name.isdigit()):
        try:
            state, _, pgid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and (int(pgid) == proc.pid or str(proc.run_dir) in cmd):
            found[int(entry.name)] = cmd
    return found


def stop(proc: ReferenceServer, grace: float = 10.0, keep_run_dir: bool = False) -> None:
    """Terminate the launcher, MMS's Java and every Python worker; raise if any survives.

    SIGTERM goes to each of them, SIGKILL to whatever is left after `grace` seconds. (SIGTERM to
    the launcher alone, as `docker stop` does, stops the launcher and Java but orphans MMS's Python
    worker server process, which stays blocked in accept() on its unix socket.)
    """
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in _processes(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while _processes(proc) and time.monotonic() < deadline:
            time.sleep(0.1)
    proc.wait(timeout=5)
    if left := _processes(proc):
        raise RuntimeError(f"reference stack processes survived: {left}")
    if not keep_run_dir:
        shutil.rmtree(proc.run_dir, ignore_errors=True)


def memory(proc: ReferenceServer, field: str = "Rss") -> dict[str, float]:
    """MiB by role (java, workers, launcher) of `field` from /proc/PID/smaps_rollup ("Rss", "Pss").

    "workers" is MMS's worker server process plus one forked child per worker, which share
    pages copy-on-write: their Rss sum counts the shared pages once per process, Pss does not.
    """
    mib = {"java": 0.0, "workers": 0.0, "launcher": 0.0}
    for pid, cmd in _processes(proc).items():
        role = "java" if MMS_CLASS in cmd else "workers" if "model_service_worker" in cmd else "launcher"
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        mib[role] += sum(int(line.split()[1]) for line in rollup if line.startswith(field + ":")) / 1024
    return mib


def _request(port: int, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def _poll(check, timeout: float, since: float | None, proc: subprocess.Popen | None) -> tuple[float, Any]:
    start = time.monotonic() if since is None else since
    while time.monotonic() - start < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"reference stack exited with {proc.returncode}")
        done, value = check()
        if done:
            return time.monotonic() - start, value
        time.sleep(0.05)
    raise TimeoutError(f"not ready after {timeout:.0f}s")


def wait_ready(
    port: int, timeout: float = 300.0, since: float | None = None, proc: subprocess.Popen | None = None
) -> float:
    """Poll GET /ping until 200; seconds since `since` (a time.monotonic(), default: now)."""
    return _poll(lambda: (_request(port, "/ping", timeout=2)[0] == 200, None), timeout, since, proc)[0]


def wait_first_answer(
    port: int,
    payload: Any = None,
    timeout: float = 300.0,
    since: float | None = None,
    proc: subprocess.Popen | None = None,
) -> tuple[float, Any]:
    """POST /invocations until it answers 200; (seconds since `since`, decoded answer).

    MMS answers /ping 200 as soon as its frontend is up, before any worker has loaded the model.
    """
    payload = payload or {"inputs": "i feel wonderful today"}

    def check() -> tuple[bool, Any]:
        status, text = _request(port, "/invocations", payload, timeout=120)
        return status == 200, json.loads(text) if status == 200 else None

    return _poll(check, timeout, since, proc)


def wait_models_loaded(proc: ReferenceServer, port: int, timeout: float = 300.0) -> int:
    """Wait until every MMS worker has loaded the model; returns the worker count.

    MMS's management API (same port) lists the workers as READY before they have loaded the model,
    so the count comes from it and the loads from the "Model model loaded io_fd=..." log lines.
    """
    status, text = _request(port, "/models/model", timeout=5)
    count = len(json.loads(text).get("workers", [])) if status == 200 else 0
    log = proc.run_dir / "logs" / "mms_log.log"

    def check() -> tuple[bool, int]:
        loaded = set(re.findall(r"Model model loaded io_fd=(\S+)", log.read_text(errors="replace")))
        return count > 0 and len(loaded) >= count, count

    return _poll(check, timeout, None, proc)[1]


def smoke(model_dir: Path, port: int) -> None:
    setup()
    proc = start(model_dir, port)
    print(f"run dir: {proc.run_dir}")
    ok = False
    try:
        ping = wait_ready(port, since=proc.started_at, proc=proc)
        print(f"/ping ready after {ping:.2f}s")
        first, answer = wait_first_answer(port, since=proc.started_at, proc=proc)
        print(f"first answer after {first:.2f}s: {json.dumps(answer)}")
        batch = [
            f"{who} {feel}"
            for who in ("i", "she", "we", "they")
            for feel in (
                "feel wonderful today",
                "am furious about this",
                "am scared of the dark",
                "was amazed by the news",
            )
        ]
        status, text = _request(port, "/invocations", {"inputs": batch})
        print(f"16 inputs -> HTTP {status}: {text}")
        n = wait_models_loaded(proc, port)
        time.sleep(2)
        for field in ("Rss", "Pss"):
            mib = memory(proc, field)
            print(
                f"{n} workers loaded, idle; {field} MiB: "
                + ", ".join(f"{k} {v:.0f}" for k, v in mib.items())
                + f"; java+workers {mib['java'] + mib['workers']:.0f}"
            )
        ok = True
    finally:
        t0 = time.monotonic()
        stop(proc, keep_run_dir=not ok)  # keep the logs when something failed
        print(
            f"stopped in {time.monotonic() - t0:.2f}s, no stack process left"
            + ("" if ok else f"; logs kept in {proc.run_dir}")
        )


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="build .venv-ref and check Java")
    sm = sub.add_parser("smoke", help="start, query and stop the stack once")
    sm.add_argument("--model-dir", type=Path, required=True)
    sm.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    if args.cmd == "setup":
        print(setup())
    else:
        smoke(args.model_dir, args.port)


if __name__ == "__main__":
    main()
