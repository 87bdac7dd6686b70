"""The serving half of `make bench-gpu` (benchmarks/bench_gpu.py): `byoc serve` on a trained
artifact, once per GPU backend, against the issue's targets (first answer within 3 s, at least
5,000 sentences/s with 16 a request at concurrency 32, p50 at most 5 ms at concurrency 1, at most
1 GB of host memory). Which backend really served is read from the server's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child_process import dies_with_parent  # benchmarks/, on sys.path (bench_gpu puts it there)

SERVE_BACKENDS = {  # name -> the server's settings; auto is what an endpoint gets by default
    "auto": {},
    "onnxruntime-cuda:fp32": {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"},
    "onnxruntime-cuda:fp16": {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp16"},
    "torch-cuda:fp32": {"BYOC_INFERENCE_BACKEND": "torch", "BYOC_INFERENCE_PRECISION": "fp32"},
    "torch-cuda:half": {"BYOC_INFERENCE_BACKEND": "torch", "BYOC_INFERENCE_PRECISION": "auto"},
}
CPU_SERVE_BACKENDS = {"auto": {}, "torch:fp32": SERVE_BACKENDS["torch-cuda:fp32"]}  # the --device cpu smoke run
TARGETS = {"first_answer_s": 3.0, "sentences_per_second_16x32": 5000.0, "p50_ms_1x1": 5.0, "rss_mib": 1024.0}


def serving(model_dir: Path, texts: list[str], seconds: float, backends: dict[str, dict[str, str]]) -> dict:
    """`byoc serve` on a trained artifact, once per backend; see the module's docstring."""
    out: dict = {}
    for name, settings in backends.items():
        try:
            out[name] = serve_one(model_dir, texts, seconds, settings)
        except Exception as err:  # a backend this machine cannot run (no onnxruntime-gpu): the others still run
            out[name] = {"error": f"{type(err).__name__}: {err}"[-2000:]}
        print(f"serving {name}: {json.dumps(out[name])}", flush=True)
    return out


def serve_one(model_dir: Path, texts: list[str], seconds: float, settings: dict[str, str]) -> dict:
    import reference_stack
    import servers

    port = servers.free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="byoc-serve-", suffix=".log", delete=False)
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(model_dir.parent), "SAGEMAKER_BIND_TO_PORT": str(port), **settings}
    env.pop("SM_MODEL_DIR", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "byoc"), "serve"],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
        preexec_fn=dies_with_parent,
    )
    try:
        try:
            first, _ = reference_stack.wait_first_answer(
                port, {"inputs": texts[0]}, timeout=600, since=started, proc=proc
            )
        except Exception as err:
            raise RuntimeError(f"{err}; server log: {Path(log.name).read_text()[-1500:]}") from None
        out: dict = {"first_answer_s": first, "load": {}}
        takeover = torch_takeover(port, texts[0], Path(log.name), started, proc)
        if takeover is not None:  # ONNX Runtime on the CPU answered first: the load is measured on torch
            out["torch_takeover_s"] = takeover
        for per_request, concurrency in ((1, 1), (1, 32), (16, 32)):
            r = servers.run_load(port, texts, per_request, concurrency, min(2.0, seconds / 4), seconds)
            out["load"][f"{per_request}x{concurrency}"] = {
                k: r[k] for k in ("sentences_per_second", "p50_ms", "errors")
            }
        out["rss_mib"] = servers.rss_tree_mib(proc.pid)
        lines = Path(log.name).read_text().splitlines()
        out["served_by"] = next((x.split("serving with ", 1)[1] for x in lines if "serving with " in x), None)
        runs_on = [x.split("model runs on ", 1)[1] for x in lines if "model runs on " in x]
        out["runs_on"] = runs_on[-1] if runs_on else None  # (the last: torch, where ONNX Runtime answered first)
        out["meets"] = {
            "first_answer_s": first <= TARGETS["first_answer_s"],
            "sentences_per_second_16x32": out["load"]["16x32"]["sentences_per_second"]
            >= TARGETS["sentences_per_second_16x32"],
            "p50_ms_1x1": out["load"]["1x1"]["p50_ms"] <= TARGETS["p50_ms_1x1"],
            "rss_mib": out["rss_mib"] <= TARGETS["rss_mib"],
        }
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        Path(log.name).unlink(missing_ok=True)


def torch_takeover(port: int, text: str, log: Path, started: float, proc: subprocess.Popen) -> float | None:
    """Seconds from the server's start until torch took over from ONNX Runtime on the CPU, which answers while
    torch loads on CUDA (BYOC_CPU_WHILE_LOADING); None where the server did not start that way. The swap comes
    with a batch, so requests are sent until the log says it happened."""
    import reference_stack

    if "answering on ONNX Runtime on the CPU" not in log.read_text():
        return None
    while "now serving on " not in log.read_text():
        if proc.poll() is not None or time.monotonic() - started > 600:
            raise RuntimeError(f"torch never took over; server log: {log.read_text()[-1500:]}")
        reference_stack._request(port, "/invocations", {"inputs": text}, timeout=60)
        time.sleep(0.05)
    return round(time.monotonic() - started, 2)
