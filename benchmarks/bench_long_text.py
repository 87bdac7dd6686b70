"""One long text and small requests together on a token classifier (issue 39): how long the small ones
wait, /ping's worst answer, the long text's own time, and the server's memory.

MiniLM-L6 with a seeded token classification head whose answers hold entities (an entity every few
words, as a busy NER model's), `byoc serve` on ONNX Runtime, 127.0.0.1 only. For each size: one request with a
text of that many characters; meanwhile a client sends a one-sentence request every 0.2 s and another
asks /ping every 0.05 s. Run it with another checkout's byoc (`--container OTHER/container`, put first
on PYTHONPATH) for a before-and-after, in the same run. Run it alone: it measures on these 2 cores.

    .venv/bin/python benchmarks/bench_long_text.py [--chars 50000 100000] [--container ../old/container]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
from child_process import dies_with_parent, exit_on_sigterm  # noqa: E402

WORK = Path("/tmp/byoc-bench-long-text")
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]

WORDS = ["John", "Smith", "lives", "in", "Paris", "and", "U.S.", "works", "at", "Lloyd-Webber", "today.", "a,b"]


def build_model() -> Path:
    """MiniLM with a seeded NER head, saved as byoc publishes it, under WORK/model."""
    import torch
    import transformers

    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    target = WORK / "model"
    if (target / "model.onnx").exists():
        return target
    torch.manual_seed(0)
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        bundled_model_dir(), num_labels=5, id2label=dict(enumerate(TAGS)), label2id={n: i for i, n in enumerate(TAGS)}
    )
    with torch.no_grad():  # an untrained head's logits are near 0: spread them, O first
        model.classifier.weight.normal_(0, 0.3)
        model.classifier.bias[0] += 2.0
    model.save_pretrained(target, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(target)
    assert onnx_graph.export(target) is not None
    return target


def text_of(chars: int) -> str:
    rng = random.Random(0)
    words: list[str] = []
    size = 0
    while size < chars:
        words.append(rng.choice(WORDS))
        size += len(words[-1]) + 1
    return " ".join(words)[:chars]


def measure(port: int, pid: int, chars: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=600)
    stop, pings, smalls = threading.Event(), [], []

    def pinger() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            client.get("/ping")
            pings.append(time.perf_counter() - started)
            time.sleep(0.05)

    def small() -> None:
        time.sleep(0.5)  # the long text is being worked on
        while not stop.is_set():
            started = time.perf_counter()
            answer = client.post("/invocations", json={"inputs": ["John lives in Paris"]})
            smalls.append((time.perf_counter() - started, answer.status_code))
            time.sleep(0.2)

    threads = [threading.Thread(target=pinger), threading.Thread(target=small)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    answer = httpx.post(f"{url}/invocations", json={"inputs": text_of(chars)}, timeout=600)
    seconds = time.perf_counter() - started
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()
    return {
        "chars": chars,
        "status": answer.status_code,
        "answer_bytes": len(answer.content),
        "long_text_s": round(seconds, 2),
        "small_requests": len(smalls),
        "small_worst_s": round(max(s for s, _ in smalls), 3),
        "small_codes": sorted({code for _, code in smalls}),
        "ping_worst_s": round(max(pings), 3),
        "rss_mib": round(servers.rss_tree_mib(pid)),
    }


def serve(model: Path, port: int, container: Path | None, env: dict[str, str]) -> subprocess.Popen:
    full = {
        **os.environ,
        "SAGEMAKER_BASE_DIR": str(model.parent),
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "BYOC_INFERENCE_BACKEND": "onnxruntime",
        **env,
    }
    if container is not None:
        full["PYTHONPATH"] = f"{container}:{full.get('PYTHONPATH', '')}"
    command = [sys.executable, "-c", "from byoc.cli import main; main(['serve'])"]
    return subprocess.Popen(
        command, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dies_with_parent
    )


def served(model: Path, container: Path | None, opts: argparse.Namespace) -> dict[str, dict]:
    """One checkout's server: each text length measured beside the small requests, {chars: its row}."""
    port = servers.free_port()
    proc = serve(model, port, container, {"BYOC_MAX_TEXT_CHARS_PER_REQUEST": opts.limit})
    rows = {}
    try:
        reference_stack.wait_ready(port, timeout=300, since=time.monotonic(), proc=proc)
        for chars in opts.chars:
            rows[str(chars)] = {"byoc": str(container or "this checkout"), **measure(port, proc.pid, chars)}
            print(json.dumps(rows[str(chars)]), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return rows


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[50_000, 100_000])
    parser.add_argument("--container", type=Path, help="another checkout's container/ (byoc before a change)")
    parser.add_argument("--limit", default="10000000", help="BYOC_MAX_TEXT_CHARS_PER_REQUEST for the run")
    parser.add_argument("--json", type=Path)
    harness.add_rounds(parser)
    opts = parser.parse_args()
    model = build_model()
    checkouts = {str(c or "this checkout"): c for c in ([opts.container] if opts.container else []) + [None]}
    declared = {name: lambda c=c: served(model, c, opts) for name, c in checkouts.items()}
    results = [row for rows in harness.scenarios(declared, opts.rounds).values() for row in rows.values()]
    # The text: 5.8 MB, inside the 6 MB payload limit, at the default BYOC_MAX_TEXT_CHARS_PER_REQUEST.
    port = servers.free_port()
    proc = serve(model, port, None, {})
    try:
        reference_stack.wait_ready(port, timeout=300, since=time.monotonic(), proc=proc)
        started = time.perf_counter()
        answer = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"inputs": text_of(5_800_000)}, timeout=600)
        row = {"byoc": "this checkout, default limit", "chars": 5_800_000, "status": answer.status_code}
        row["answered_s"] = round(time.perf_counter() - started, 2)
        print(json.dumps(row), flush=True)
        results.append(row)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
