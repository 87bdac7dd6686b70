"""Many models on one endpoint: `byoc serve` as a SageMaker multi-model endpoint (MME) with 50
MiniLM-size classifiers loaded from disk.

One server (SAGEMAKER_MULTI_MODEL=true, the default settings, 127.0.0.1), models loaded one after
the other as SageMaker loads them (`POST /models`), each a copy of fixtures.py's MiniLM emotion
classifier (hard links: the disk holds one copy, the server loads each as its own). It measures:
- load time per model (the POST /models answer), p50 and p99;
- resident memory (RSS) per loaded model, and the accounting the server's budget uses;
- the first request to a model right after its load against a warm request to it (p50 of each);
- resident memory once every model is unloaded (`DELETE /models/{name}`), against before the first load;
- load/unload churn, SageMaker's normal life for a busy MME: one model with code of its own (an
  inference.py, a sibling helper.py holding a 5 MB object) loaded, invoked and unloaded `--churn`
  times; resident memory per cycle after a warm-up (flat: each unload gives back what its load took).

    .venv/bin/python benchmarks/bench_mme.py [--models 50] [--churn 200] [--json benchmarks/results/mme.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures  # noqa: E402  (the shared models and data)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
import shared_data  # noqa: E402
from child_process import exit_on_sigterm  # noqa: E402

WORK = fixtures.MME_WORK


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# A model's own code as users write it: its folder put on sys.path, a sibling imported, a big
# module-level object (a vocabulary, a lookup table) that only an unload can give back.
CHURN_CODE = {
    "inference.py": (
        "import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\nimport helper\n"
        "from byoc.inference import predict_fn as default\n\n\n"
        "def predict_fn(data, model):\n    return default(data, model)\n\n\npredict_fn.batchable = True\n"
    ),
    "helper.py": "TABLE = bytearray(5 << 20)\nTABLE[::4096] = b'x' * len(TABLE[::4096])\n",
}
WARM_UP = 20


def with_code(folder: Path) -> Path:
    """A copy of the model folder (hard links) with CHURN_CODE in its code/."""
    target = WORK / "models" / "churn" / "model"
    for source in folder.rglob("*"):
        dest = target / source.relative_to(folder)
        if source.is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, dest)
    for name, code in CHURN_CODE.items():
        (target / "code").mkdir(exist_ok=True)
        (target / "code" / name).unlink(missing_ok=True)  # a hard link: writing through it changes the original
        (target / "code" / name).write_text(code)
    return target


def churn(client: httpx.Client, pid: int, folder: Path, cycles: int, body: dict) -> dict:
    """Load, invoke and unload one model `cycles` times; resident memory along the way."""
    rss, began = [servers.rss_tree_mib(pid)], time.monotonic()
    for cycle in range(cycles):
        assert client.post("/models", json={"model_name": "churn", "url": str(folder)}).status_code == 200
        assert client.post("/models/churn/invoke", json=body).status_code == 200
        assert client.delete("/models/churn").status_code == 200
        rss.append(servers.rss_tree_mib(pid))
        if (cycle + 1) % 50 == 0:
            print(f"churn: {cycle + 1} cycles, rss {rss[-1]:.0f} MiB", flush=True)
    measured = max(1, cycles - WARM_UP)
    return {
        "cycles": cycles,
        "cycle_s_mean": (time.monotonic() - began) / max(1, cycles),
        "rss_mib": {"start": rss[0], "after_warm_up": rss[min(WARM_UP, cycles)], "end": rss[-1]},
        "rss_mib_per_cycle_after_warm_up": (rss[-1] - rss[min(WARM_UP, cycles)]) / measured,
    }


def run(model: Path, count: int, texts: list[str], cycles: int = 200) -> dict:
    folders = fixtures.model_copies(model, count)
    port = servers.free_port()
    (WORK / "model").mkdir(parents=True, exist_ok=True)
    env = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_BASE_DIR": str(WORK)}
    proc, started = servers.start_byoc(WORK / "model", port, env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        reference_stack.wait_ready(port, timeout=120, since=started, proc=proc)
        body = {"inputs": texts[0]}
        rss_start = servers.rss_tree_mib(proc.pid)
        loads, first, warm, rss = [], [], [], [rss_start]
        for i, folder in enumerate(folders):
            name = f"m{i:03d}"
            began = time.monotonic()
            answer = client.post("/models", json={"model_name": name, "url": str(folder)})
            loads.append(time.monotonic() - began)
            assert answer.status_code == 200, answer.text
            for kind in (first, warm):  # right after its load, then again
                began = time.monotonic()
                assert client.post(f"/models/{name}/invoke", json=body).status_code == 200
                kind.append(time.monotonic() - began)
            rss.append(servers.rss_tree_mib(proc.pid))
            print(f"{name}: load {loads[-1] * 1000:.0f} ms, first {first[-1] * 1000:.1f} ms, rss {rss[-1]:.0f} MiB")
        rss_loaded = rss[-1]
        for i in range(count):
            assert client.delete(f"/models/m{i:03d}").status_code == 200
        time.sleep(1)
        rss_unloaded = servers.rss_tree_mib(proc.pid)
        churn_result = churn(client, proc.pid, with_code(folders[0]), cycles, body)
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    return {
        "models": count,
        "model_files_mib": sum(f.stat().st_size for f in folders[0].rglob("*") if f.is_file()) / 2**20,
        "load_s": {"p50": percentile(loads, 0.5), "p99": percentile(loads, 0.99), "max": max(loads)},
        "first_request_ms_p50": statistics.median(first) * 1000,
        "warm_request_ms_p50": statistics.median(warm) * 1000,
        "rss_mib": {"start": rss_start, "loaded": rss_loaded, "unloaded": rss_unloaded},
        "rss_mib_per_model": (rss_loaded - rss_start) / count,
        "rss_mib_per_model_after_the_first": (rss_loaded - rss[1]) / max(1, count - 1),
        "churn": churn_result,
    }


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--churn", type=int, default=200, help="load/unload cycles of a model with code")
    parser.add_argument("--json", type=Path, help="also write the results here")
    harness.add_rounds(parser)
    opts = parser.parse_args()
    if fixtures.EMOTION is None:
        sys.exit(shared_data.missing("emotion"))
    texts = fixtures.sentences()
    model = fixtures.train_model()
    # One scenario (the server's life: models loaded, answered, unloaded, then churned), repeated over rounds.
    declared = {"many_models": lambda: run(model, opts.models, texts, opts.churn)}
    results = {**harness.scenarios(declared, opts.rounds)["many_models"], "rounds": opts.rounds}
    print(
        f"{results['models']} models of {results['model_files_mib']:.0f} MiB on disk: load p50 "
        f"{results['load_s']['p50'] * 1000:.0f} ms, p99 {results['load_s']['p99'] * 1000:.0f} ms; "
        f"{results['rss_mib_per_model']:.0f} MiB resident per model; first request after a load "
        f"{results['first_request_ms_p50']:.1f} ms (p50) against {results['warm_request_ms_p50']:.1f} ms warm; "
        f"resident {results['rss_mib']['start']:.0f} MiB before, {results['rss_mib']['loaded']:.0f} MiB loaded, "
        f"{results['rss_mib']['unloaded']:.0f} MiB after unloading every model",
        flush=True,
    )
    c = results["churn"]
    print(
        f"churn: {c['cycles']} load/invoke/unload cycles of a model with code, {c['cycle_s_mean'] * 1000:.0f} ms "
        f"each; resident {c['rss_mib']['start']:.0f} MiB before, {c['rss_mib']['after_warm_up']:.0f} MiB after "
        f"{WARM_UP}, {c['rss_mib']['end']:.0f} MiB after all: {c['rss_mib_per_cycle_after_warm_up']:.2f} MiB a cycle",
        flush=True,
    )
    if opts.json:
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
