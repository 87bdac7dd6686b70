"""What `GET /metrics` costs (byoc.serving.prometheus), in the same run against its own baseline.

1. Serving with metrics on (the default) against BYOC_METRICS=false: two `byoc serve` on fixtures.py's
   MiniLM emotion classifier, loaded in turns (A B A B ...: the machine's drift falls on both), one
   and 16 tweets per request at concurrency 8; the median of the rounds' requests/s and p50 latency.
2. A scrape with 100 models loaded: a multi-model endpoint holding 100 copies of that classifier, each
   invoked twice (so that every model has its series), scraped `--scrapes` times: the answer's time
   (p50, max), its size and its series; the same with one model loaded, for scale.
Only 127.0.0.1; every phase is bounded in time and stops by itself. Run it alone.

    .venv/bin/python benchmarks/bench_metrics.py [--rounds 3] [--seconds 8] [--models 100] [--json F]
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


def serving_overhead(model: Path, texts: list[str], rounds: int, seconds: float, warmup: float) -> dict:
    """Requests/s and p50 with metrics on and off, the two servers loaded in turns."""
    running = {}
    try:
        for name, settings in (("metrics", {}), ("no-metrics", {"BYOC_METRICS": "false"})):
            port = servers.free_port()
            proc, started = servers.start_byoc(model, port, settings)
            running[name] = (port, proc)
            reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
        results: dict = {}
        for per_request in (1, 16):
            scenarios = {
                name: (
                    lambda port=port, per_request=per_request: servers.run_load(
                        port, texts, per_request, 8, warmup, seconds
                    )
                )
                for name, (port, _) in running.items()
            }
            runs = harness.alternate(scenarios, rounds)  # (the servers loaded in turns)
            key = f"{per_request}x8"
            results[key] = {
                name: {
                    "requests_per_second": statistics.median(r["requests_per_second"] for r in done),
                    "p50_ms": statistics.median(r["p50_ms"] for r in done),
                    "errors": sum(r["errors"] for r in done),
                }
                for name, done in runs.items()
            }
            on, off = results[key]["metrics"], results[key]["no-metrics"]
            results[key]["ratio"] = on["requests_per_second"] / off["requests_per_second"]
            print(
                f"{per_request:2d} tweet(s)/request, concurrency 8: "
                f"metrics on {on['requests_per_second']:.1f} req/s (p50 {on['p50_ms']:.0f} ms), "
                f"off {off['requests_per_second']:.1f} req/s (p50 {off['p50_ms']:.0f} ms): "
                f"{results[key]['ratio']:.3f}x",
                flush=True,
            )
        return results
    finally:
        for _, proc in running.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


def scrape_cost(model: Path, count: int, scrapes: int, texts: list[str]) -> dict:
    """Scrape time, size and series with `count` models loaded (after 1, for scale)."""
    root = fixtures.MME_WORK / "metrics-mme"
    folders = fixtures.model_copies(model, count)
    port = servers.free_port()
    (root / "model").mkdir(parents=True, exist_ok=True)
    settings = {"SAGEMAKER_MULTI_MODEL": "true", "BYOC_INFERENCE_BACKEND": "onnxruntime"}
    proc, started = servers.start_byoc(root / "model", port, settings)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
    results: dict = {}
    try:
        reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
        for n, folder in enumerate(folders, 1):
            name = f"m{n:03d}"
            assert client.post("/models", json={"model_name": name, "url": str(folder)}).status_code == 200
            for text in texts[:2]:
                assert client.post(f"/models/{name}/invoke", json={"inputs": text}).status_code == 200
            if n in (1, count):
                results[str(n)] = measure_scrapes(client, scrapes)
                r = results[str(n)]
                print(
                    f"{n:3d} model(s) loaded: a scrape takes p50 {r['p50_ms']:.1f} ms, max {r['max_ms']:.1f} ms; "
                    f"{r['bytes'] / 1024:.0f} KiB, {r['series']} series",
                    flush=True,
                )
        return results
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def measure_scrapes(client: httpx.Client, scrapes: int) -> dict:
    times, body = [], ""
    for _ in range(scrapes):
        began = time.perf_counter()
        response = client.get("/metrics")
        times.append((time.perf_counter() - began) * 1000)
        body = response.text
    series = [line for line in body.splitlines() if line and not line.startswith("#")]
    return {
        "p50_ms": statistics.median(times),
        "max_ms": max(times),
        "bytes": len(body.encode()),
        "series": len(series),
    }


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per phase")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--parts", nargs="*", default=["serving", "scrape"], choices=("serving", "scrape"))
    opts = parser.parse_args()
    if fixtures.EMOTION is None:
        sys.exit(shared_data.missing("emotion"))
    texts = fixtures.sentences()
    model = fixtures.train_model()
    results = {}
    if "serving" in opts.parts:
        results["serving"] = serving_overhead(model, texts, opts.rounds, opts.seconds, opts.warmup)
    if "scrape" in opts.parts:
        results["scrape"] = scrape_cost(model, opts.models, opts.scrapes, texts)
    if opts.json:
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
