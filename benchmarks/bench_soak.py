"""Soak: `byoc serve` under ordinary traffic with hostile requests mixed in.

One server (the default: ONNX Runtime fp32, on bench_serve.py's MiniLM emotion classifier), two
phases of `--seconds` each (60 by default), 32 clients on keep-alive connections:
- baseline: every request is innocent (one emotion test tweet, as JSON);
- soak: the same, with 10% of requests hostile (`--hostile`), in turn: a string the tokenizer cannot
  encode, JSON nested 100,000 deep, a body that is not UTF-8, wrong input types, an unsupported
  content type, an Accept nothing can satisfy, an Accept list with weights (answered), and 150,000
  inputs in one request (under 1 MB).
It reports innocent requests that failed (any answer but 200, a closed connection, a timeout: the
target is 0), the innocent p99 latency against the baseline's, the statuses each kind of hostile
request got (never a 5xx), and the server's resident memory (RSS) at the start and end of the soak.

    .venv/bin/python benchmarks/bench_soak.py [--seconds 60] [--json benchmarks/results/soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve  # noqa: E402
import reference_stack  # noqa: E402

JSON = b"application/json"
# (kind, body, content type, accept, the statuses it may get)
HOSTILE = [
    ("unencodable string", b'{"inputs": ["fine", "\\ud800 broken"]}', JSON, JSON, {400}),
    ("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000, JSON, JSON, {400}),
    ("not UTF-8", b'{"inputs": "\xff\xfe broken"}', JSON, JSON, {400}),
    ("wrong types", b'{"inputs": [1, null, {"text": 5}], "parameters": {"top_k": "x"}}', JSON, JSON, {400}),
    ("unsupported content type", b"<inputs>x</inputs>", b"application/xml", JSON, {415}),
    ("nothing acceptable", b'{"inputs": "fine"}', JSON, b"image/png, */*;q=0", {406}),
    ("accept list with weights", b'{"inputs": "fine"}', JSON, b"text/csv;q=0.5, application/json;q=0.9", {200}),
    ("150000 inputs", json.dumps({"inputs": ["hi"] * 150_000}).encode(), JSON, JSON, {413}),
]


async def _soak(port: int, texts: list[str], concurrency: int, seconds: float, hostile: float, seed: int) -> dict:
    stop_at = time.monotonic() + seconds
    latencies: list[float] = []
    innocent_failures: Counter[str] = Counter()
    statuses: dict[str, Counter[int | str]] = {kind: Counter() for kind, *_ in HOSTILE}
    counts = Counter()

    async def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n, turn = i, i
        try:
            while time.monotonic() < stop_at:
                evil = rng.random() < hostile
                if evil:
                    kind, body, content_type, accept, _ = HOSTILE[turn % len(HOSTILE)]
                    turn += 1
                else:
                    kind, body, content_type, accept = (
                        "innocent",
                        json.dumps({"inputs": texts[n % len(texts)]}).encode(),
                        JSON,
                        JSON,
                    )
                    n += concurrency
                began = time.monotonic()
                try:
                    status: int | str = await asyncio.wait_for(
                        bench_serve._request(reader, writer, body, content_type, accept), 90
                    )
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as err:
                    status = type(err).__name__  # the connection is gone: open another
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                counts[kind] += 1
                if evil:
                    statuses[kind][status] += 1
                elif status == 200:
                    latencies.append(time.monotonic() - began)
                else:
                    innocent_failures[str(status)] += 1
        finally:
            writer.close()

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")
    unexpected = {
        kind: {str(s): c for s, c in statuses[kind].items() if s not in allowed}
        for kind, _, _, _, allowed in HOSTILE
        if any(s not in allowed for s in statuses[kind])
    }
    return {
        "innocent_requests": counts["innocent"],
        "innocent_failed": sum(innocent_failures.values()),
        "innocent_failures": dict(innocent_failures),
        "innocent_per_second": len(latencies) / seconds,
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "hostile_requests": sum(counts.values()) - counts["innocent"],
        "hostile_statuses": {
            kind: {str(s): c for s, c in counter.items()} for kind, counter in statuses.items() if counter
        },
        "hostile_unexpected": unexpected,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase (baseline, soak)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--hostile", type=float, default=0.10, help="share of hostile requests in the soak phase")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    if bench_serve.DATA is None:
        sys.exit("the emotion data (../shared/data/emotion) is not beside the project")
    texts = bench_serve.sentences()
    model = bench_serve.train_model()
    port = bench_serve.free_port()
    proc, started = bench_serve.start_byoc(model, port, {})
    try:
        reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
        asyncio.run(_soak(port, texts, opts.concurrency, opts.warmup, 0.0, opts.seed))  # warm-up, not measured
        baseline = asyncio.run(_soak(port, texts, opts.concurrency, opts.seconds, 0.0, opts.seed))
        rss_start = bench_serve.rss_tree_mib(proc.pid)
        soak = asyncio.run(_soak(port, texts, opts.concurrency, opts.seconds, opts.hostile, opts.seed))
        rss_end = bench_serve.rss_tree_mib(proc.pid)
        alive = proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    results = {
        "seconds": opts.seconds,
        "concurrency": opts.concurrency,
        "hostile_share": opts.hostile,
        "baseline": baseline,
        "soak": soak,
        "innocent_failed": soak["innocent_failed"],
        "p99_ratio": soak["p99_ms"] / baseline["p99_ms"],
        "rss_mib_start": rss_start,
        "rss_mib_end": rss_end,
        "server_alive_at_end": alive,
    }
    print(
        f"baseline: {baseline['innocent_requests']} requests, {baseline['innocent_failed']} failed, "
        f"p50 {baseline['p50_ms']:.0f} ms, p99 {baseline['p99_ms']:.0f} ms, {baseline['innocent_per_second']:.0f}/s\n"
        f"soak ({opts.hostile:.0%} hostile): {soak['innocent_requests']} innocent requests, "
        f"{soak['innocent_failed']} failed {soak['innocent_failures'] or ''}, p50 {soak['p50_ms']:.0f} ms, "
        f"p99 {soak['p99_ms']:.0f} ms ({results['p99_ratio']:.2f}x the baseline's), "
        f"{soak['innocent_per_second']:.0f}/s; {soak['hostile_requests']} hostile requests, "
        f"unexpected statuses: {soak['hostile_unexpected'] or 'none'}\n"
        f"resident memory: {rss_start:.0f} MiB at the start of the soak, {rss_end:.0f} MiB at its end",
        flush=True,
    )
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if alive and not soak["innocent_failed"] and not soak["hostile_unexpected"] else 1


if __name__ == "__main__":
    sys.exit(main())
