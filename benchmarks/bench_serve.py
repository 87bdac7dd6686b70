"""Serving speed: `byoc serve` against the reference stack (HF inference DLC: toolkit on MMS).

Same machine, same run, same model (an all-MiniLM-L6-v2 emotion classifier trained here by
`byoc train`, with its int8 graph made ahead: serving_int8=true), same sentences (emotion test
tweets), 127.0.0.1 only. For each server:
- cold start: process start to the first 200 on /ping, and to the first answered /invocations;
- for single-sentence and 16-sentence JSON requests at concurrency 1, 8 and 32: requests/s,
  sentences/s and p50/p90/p99 latency over a fixed window after a warm-up (every phase is
  bounded in time and stops by itself);
- resident memory once loaded (RSS of every process of the server; PSS too for the reference,
  whose forked workers share pages);
- the model alone: the default predict_fn in a process of its own, 32 tweets per call, no HTTP
  (fp32 and int8): a ceiling for any server on this machine.
The load generator is a small asyncio HTTP/1.1 client on keep-alive connections, cheap enough
not to starve the servers on these 2 cores. Run it alone.

    .venv/bin/python benchmarks/bench_serve.py [--seconds 12] [--warmup 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures  # noqa: E402  (the shared models and data)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
import shared_data  # noqa: E402
from child_process import dies_with_parent, exit_on_sigterm  # noqa: E402

# --- the model alone -----------------------------------------------------------------------------

CEILING = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_precision
texts = json.loads(sys.stdin.read())
result = bench_precision.measure(bench_precision.Path(sys.argv[2]), json.loads(sys.argv[3]), texts, [""] * len(texts))
print(json.dumps(result["sentences_per_second"]))
"""


def model_ceiling(model: Path, texts: list[str], settings: dict[str, str]) -> float:
    """Sentences/s of the default predict_fn in a process of its own, 32 tweets per call, no HTTP:
    what no server on this machine can beat at concurrency 32 (it runs with the same threads)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    done = subprocess.run(
        [sys.executable, "-c", CEILING, str(Path(__file__).resolve().parent), str(model), json.dumps(settings)],
        input=json.dumps(texts),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=dies_with_parent,
    )
    return float(done.stdout.strip().splitlines()[-1])


def measure(name: str, port: int, proc, started: float, texts: list[str], opts) -> dict:
    ping = reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
    first, _ = reference_stack.wait_first_answer(port, {"inputs": texts[0]}, timeout=300, since=started, proc=proc)
    if name == "reference":
        reference_stack.wait_models_loaded(proc, port)  # every MMS worker loaded before measuring
    result = {"cold_start_ping_s": ping, "cold_start_first_answer_s": first, "load": {}}
    for per_request in (1, 16):
        for concurrency in (1, 8, 32):
            key = f"{per_request}x{concurrency}"
            result["load"][key] = servers.run_load(port, texts, per_request, concurrency, opts.warmup, opts.seconds)
            r = result["load"][key]
            print(
                f"{name:10s} {per_request:2d} sentence(s)/request, concurrency {concurrency:2d}: "
                f"{r['requests_per_second']:7.1f} req/s {r['sentences_per_second']:7.1f} sentences/s "
                f"p50 {r['p50_ms']:7.0f} ms p90 {r['p90_ms']:7.0f} ms p99 {r['p99_ms']:7.0f} ms"
                f"{'  errors ' + str(r['errors']) if r['errors'] else ''}",
                flush=True,
            )
    if name == "reference":
        result["rss_mib"] = sum(reference_stack.memory(proc, "Rss").values())
        result["pss_mib"] = sum(reference_stack.memory(proc, "Pss").values())
    else:
        result["rss_mib"] = servers.rss_tree_mib(proc.pid)
    print(
        f"{name:10s} cold start: /ping {ping:.1f} s, first answer {first:.1f} s; resident {result['rss_mib']:.0f} MiB",
        flush=True,
    )
    return result


def ceiling(name: str, model: Path, texts: list[str], settings: dict) -> float:
    rate = model_ceiling(model, texts, settings)
    print(f"the model alone ({name}, in process, 32 sentences per call): {rate:.0f} sentences/s", flush=True)
    return rate


def byoc(name: str, model: Path, settings: dict, texts: list[str], opts: argparse.Namespace) -> dict:
    port = servers.free_port()
    proc, started = servers.start_byoc(model, port, settings)
    try:
        return measure(name, port, proc, started, texts, opts)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def reference(model: Path, texts: list[str], opts: argparse.Namespace) -> dict:
    port = servers.free_port()
    ref = reference_stack.start(model, port, log_path=fixtures.SERVE_WORK / "reference.log")
    try:
        return measure("reference", port, ref, ref.started_at, texts, opts)
    finally:
        reference_stack.stop(ref)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="measured window per phase")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured start of each phase")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=("torch", "int8"),
        help="leave out byoc serve on torch, or its int8 mode",
    )
    harness.add_rounds(parser)
    opts = parser.parse_args()
    if fixtures.EMOTION is None:
        sys.exit(shared_data.missing("emotion"))
    texts = fixtures.sentences()
    model = fixtures.train_model()
    declared = {}
    for name, settings in (("fp32", {}), ("int8", {"BYOC_INFERENCE_PRECISION": "int8"})):
        declared[f"ceiling {name}"] = lambda name=name, settings=settings: ceiling(name, model, texts, settings)
    # The default (ONNX Runtime on the model's serving graph), the same server on torch, and int8.
    for name, settings in (
        ("byoc", {}),
        ("byoc-torch", {"BYOC_INFERENCE_BACKEND": "torch"}),
        ("byoc-int8", {"BYOC_INFERENCE_PRECISION": "int8"}),
    ):
        if name == "byoc" or name.split("-")[1] not in opts.skip:
            declared[name] = lambda name=name, settings=settings: byoc(name, model, settings, texts, opts)
    if not opts.skip_reference:
        reference_stack.setup()
        declared["reference"] = lambda: reference(model, texts, opts)
    results: dict = harness.scenarios(declared, opts.rounds)
    results["ceiling"] = {name: results.pop(f"ceiling {name}") for name in ("fp32", "int8")}
    results["rounds"] = opts.rounds
    if "reference" in results:
        print_table(results)
    if opts.json:
        harness.write_results(opts.json, results)
    return 0


def print_table(results: dict) -> None:
    ours, ref = results["byoc"], results["reference"]
    others = [results.get("byoc-torch"), results.get("byoc-int8")]
    print(
        "\n| measure | byoc serve (default: ONNX Runtime, fp32) | byoc serve on torch "
        "| byoc serve, int8 (opt-in, model.int8.onnx) | reference (HF DLC: toolkit 2.6 on MMS 1.1.11) "
        "| default / reference | int8 / reference |"
    )
    print("|---|---|---|---|---|---|---|")
    cells = lambda f: " | ".join(f(r) if r else "-" for r in [ours, *others, ref])
    ratio = lambda r, f: f"{f(r) / max(f(ref), 1e-9):.2f}x" if r else "-"
    for key in ("1x1", "1x8", "1x32", "16x1", "16x8", "16x32"):
        per, conc = key.split("x")
        sps = lambda r, key=key: r["load"][key]["sentences_per_second"]
        p50 = lambda r, key=key: r["load"][key]["p50_ms"]
        lat = lambda r, key=key: "{p50_ms:.0f} / {p90_ms:.0f} / {p99_ms:.0f}".format(**r["load"][key])
        print(
            f"| sentences/s, {per}/request, concurrency {conc} | {cells(lambda r, sps=sps: f'{sps(r):.0f}')} | "
            f"{ratio(ours, sps)} | {ratio(others[1], sps)} |"
        )
        print(
            f"| p50 / p90 / p99 ms, {per}/request, concurrency {conc} | {cells(lat)} | "
            f"{ratio(ours, p50)} (p50) | {ratio(others[1], p50)} (p50) |"
        )
    for label, key in (
        ("start to first 200 on /ping", "cold_start_ping_s"),
        ("start to first answered /invocations", "cold_start_first_answer_s"),
    ):
        value = lambda r, key=key: r[key]
        print(
            f"| {label} | {cells(lambda r, key=key: f'{r[key]:.1f} s')} | {ratio(ours, value)} "
            f"| {ratio(others[1], value)} |"
        )
    ceiling = results.get("ceiling")
    if ceiling:  # the most any server here could do: the model alone, without HTTP
        print(
            f"| the model alone, in process, 32 sentences per call (no HTTP): sentences/s "
            f"| {ceiling['fp32']:.0f} | - | {ceiling['int8']:.0f} | - "
            f"| {ceiling['fp32'] / ref['load']['1x32']['sentences_per_second']:.2f}x "
            f"(of the reference at 1/request, concurrency 32) | "
            f"{ceiling['int8'] / ref['load']['1x32']['sentences_per_second']:.2f}x |"
        )
    rss = lambda r: r["rss_mib"]
    mib = lambda r: f"{r['rss_mib']:.0f} MiB"
    print(
        f"| resident memory (RSS, all processes; reference PSS {ref['pss_mib']:.0f} MiB) | {cells(mib)} | "
        f"{ratio(ours, rss)} | {ratio(others[1], rss)} |"
    )


if __name__ == "__main__":
    sys.exit(main())
