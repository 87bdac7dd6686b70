"""Serving embeddings: `byoc serve` against infinity-emb 0.0.78 on its ONNX engine (optimum), alternated in one
run, fp32 and int8, with fastembed (ONNX Runtime in-process, no HTTP) as the ceiling of the same graph.

The same model (all-MiniLM-L6-v2, the bundled folder), the same machine, 127.0.0.1 only, SICK's sentences:
- byoc serves its own export (`byoc export-onnx`, `--int8`: pooling inside the graph);
- infinity-emb and fastembed serve optimum's feature-extraction graph of the model (`optimum-cli export onnx
  --task feature-extraction`; int8: `optimum-cli onnxruntime quantize --avx512_vnni`), pooling in Python;
- two shapes: 1 sentence a request at concurrency 32, 16 a request at concurrency 8; byoc gets TEI's body
  on /invocations, infinity-emb OpenAI's on /embeddings;
- `--rounds` rounds, the servers alternated within each, each phase bounded in time; the medians reported.

infinity-emb, optimum and fastembed live in a venv of their own (`--competitors`: its python), as they need
numpy < 2, transformers < 4.49 and an older torch than byoc's tiers. `make bench-embed-vs` makes it in the
checkout (.venv-infinity/, the Makefile's recipe) and runs:

    .venv/bin/python benchmarks/bench_embed_vs.py --competitors .venv-infinity/bin/python [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures  # noqa: E402  (the shared models and data)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
from child_process import dies_with_parent, exit_on_sigterm  # noqa: E402

WORK = Path("/tmp/byoc-bench-embed-vs")
SERVED = "all-MiniLM-L6-v2"  # infinity-emb's name for the model (OpenAI's "model")
FASTEMBED = """
import json, sys, time
from fastembed import TextEmbedding
folder, texts = sys.argv[1], json.loads(sys.stdin.read())
model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=folder, threads=None)
list(model.embed(texts[:256], batch_size=32))
start, done = time.perf_counter(), 0
while time.perf_counter() - start < 8:
    done += len(list(model.embed(texts[:1024], batch_size=32)))
print(json.dumps(done / (time.perf_counter() - start)))
"""


def optimum_folders(competitors: str) -> dict[str, Path]:
    """optimum's feature-extraction graph of the bundled model, fp32 and int8, each in a folder of its own."""
    from byoc.training.model import bundled_model_dir

    fp32, int8 = WORK / "optimum-fp32", WORK / "optimum-int8"
    cli = str(Path(competitors).parent / "optimum-cli")
    if not (fp32 / "model.onnx").exists():
        shutil.rmtree(fp32, ignore_errors=True)
        subprocess.run(
            [cli, "export", "onnx", "--model", str(bundled_model_dir()), "--task", "feature-extraction", str(fp32)],
            check=True,
            capture_output=True,
        )
    if not (int8 / "model_quantized.onnx").exists():
        shutil.rmtree(int8, ignore_errors=True)
        subprocess.run(
            [cli, "onnxruntime", "quantize", "--onnx_model", str(fp32), "--avx512_vnni", "-o", str(int8)],
            check=True,
            capture_output=True,
        )
    return {"fp32": fp32, "int8": int8}


def start_infinity(competitors: str, folder: Path, port: int) -> tuple[subprocess.Popen, float]:
    binary = str(Path(competitors).parent / "infinity_emb")
    # Started in the folder, which it names ".": infinity-emb 0.0.78 hands optimum the ONNX file's absolute
    # path for a local folder, which optimum refuses ("Trying to load /x/model.onnx but only found model.onnx").
    command = [binary, "v2", "--model-id", ".", "--served-model-name", SERVED, "--engine", "optimum"]
    command += ["--device", "cpu", "--port", str(port)]
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=dies_with_parent,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"infinity_emb exited: {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}")
        try:
            status, _ = reference_stack._request(port, "/health", timeout=2)
            if status == 200:
                return proc, started
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("infinity_emb did not answer /health in 300 s")


def fastembed_rate(competitors: str, folder: Path, texts: list[str]) -> float:
    """fastembed in-process on optimum's graph (the folder's graph as model.onnx)."""
    target = WORK / f"fastembed-{folder.name}"
    if not target.exists():
        shutil.copytree(folder, target)
        quantized = target / "model_quantized.onnx"
        if quantized.exists():
            quantized.rename(target / "model.onnx")
    done = subprocess.run(
        [competitors, "-c", FASTEMBED, str(target)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        preexec_fn=dies_with_parent,
    )
    if done.returncode:
        return float("nan")
    return float(done.stdout.strip().splitlines()[-1])


def measure(port: int, texts: list[str], opts: argparse.Namespace, infinity_model: str | None) -> dict[str, float]:
    rates = {}
    for per_request, concurrency in fixtures.SHAPES:
        if infinity_model is None:
            r = servers.run_load(port, texts, per_request, concurrency, opts.warmup, opts.seconds)
        else:
            r = servers.run_load(
                port,
                texts,
                per_request,
                concurrency,
                opts.warmup,
                opts.seconds,
                path="/embeddings",
                key="input",
                extra={"model": infinity_model},
            )
        rates[f"{per_request}x{concurrency}"] = r["sentences_per_second"] if not r["errors"] else float("nan")
    return rates


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--competitors", required=True, help="the python of the venv holding infinity-emb and fastembed"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    ours, theirs = fixtures.model_folder(), optimum_folders(opts.competitors)
    first, second, _ = fixtures.sick_pairs()
    texts = list(dict.fromkeys(first + second))

    def scenario(server: str, precision: str) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            port = servers.free_port()
            if server == "byoc":
                settings = {"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": precision}
                proc, started = servers.start_byoc(ours, port, settings)
                reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
                model = None
            else:
                proc, started = start_infinity(opts.competitors, theirs[precision], port)
                model = SERVED
            try:
                rates = measure(port, texts, opts, model)
            finally:
                stop(proc)
            shown = ", ".join(f"{shape} {rate:7.1f}" for shape, rate in rates.items())
            print(f"{server:12s} {precision}: {shown} sentences/s", flush=True)
            return rates

        return run

    names = [(server, precision) for precision in ("fp32", "int8") for server in ("byoc", "infinity-emb")]
    runs = harness.alternate({f"{s} {p}": scenario(s, p) for s, p in names}, opts.rounds)
    results: dict = {"medians": {}, "runs": runs, "fastembed": {}}
    for name, rounds in runs.items():
        results["medians"][name] = {shape: statistics.median(r[shape] for r in rounds) for shape in rounds[0]}
    for precision, folder in theirs.items():
        results["fastembed"][precision] = fastembed_rate(opts.competitors, folder, texts)
    print("\n| | byoc | infinity-emb | byoc / infinity-emb | fastembed in-process |")
    print("|---|---|---|---|---|")
    for precision in ("fp32", "int8"):
        for per_request, concurrency in fixtures.SHAPES:
            shape = f"{per_request}x{concurrency}"
            ours_rate = results["medians"][f"byoc {precision}"][shape]
            theirs_rate = results["medians"][f"infinity-emb {precision}"][shape]
            print(
                f"| {precision}, {per_request}/request, c={concurrency} | {ours_rate:.0f} | {theirs_rate:.0f} | "
                f"{ours_rate / theirs_rate:.2f}x | {results['fastembed'][precision]:.0f} |"
            )
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
