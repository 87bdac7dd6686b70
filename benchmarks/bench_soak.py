"""Soak: `byoc serve` under ordinary traffic with hostile requests mixed in.

One server (the default: ONNX Runtime fp32, on fixtures.py's MiniLM emotion classifier), two
phases of `--seconds` each (60 by default), 32 clients on keep-alive connections:
- baseline: every request is innocent (one emotion test tweet, as JSON);
- soak: the same, with 10% of requests hostile (`--hostile`), in turn: a string the tokenizer cannot
  encode, JSON nested 100,000 deep, a body that is not UTF-8, wrong input types, an unsupported
  content type, an Accept nothing can satisfy, an Accept list with weights (answered), and 150,000
  inputs in one request (under 1 MB);
- connections: the baseline's traffic while other clients hold the server's connections: 1,100
  connections that never send a byte (past BYOC_MAX_CONNECTIONS: the server closes the longest
  idle), 256 that send headers and part of a body and stall, 16 that send their headers one byte a
  second, and one request a second whose single text is 5.8 MB, from a process of its own. Each
  connection the server closes is opened again 5 s later.
It reports innocent requests that failed (any answer but 200, a closed connection, a timeout: the
target is 0), the innocent p99 latency against the baseline's, the statuses each kind of hostile
request got (never a 5xx), and the server's resident memory (RSS) at the start and end of the soak.

    .venv/bin/python benchmarks/bench_soak.py [--seconds 60] [--json benchmarks/results/soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixtures  # noqa: E402  (the shared models and data)
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
import shared_data  # noqa: E402
from child_process import exit_on_sigterm  # noqa: E402

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
                        servers.request(reader, writer, body, content_type, accept), 90
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


RECONNECT_AFTER_S = 5.0  # an attacker holding connections opens another this long after one is closed
LONG_TEXT = json.dumps({"inputs": ("what a wonderful day it was, " * 200_000)[:5_800_000]}).encode()
STALLED_BODY = (
    b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
)


async def _harass(port: int, seconds: float, idle: int = 1100, stalled: int = 256, trickling: int = 16) -> dict:
    """Clients that hold connections (idle, stalled in their body, trickling their headers) and one
    long-text request a second, for `seconds`; how often the server closed each kind, and the
    long-text requests' statuses."""
    stop_at = time.monotonic() + seconds
    closed: Counter[str] = Counter()
    long_statuses: Counter[int | str] = Counter()

    async def hold(kind: str, first: bytes, trickle: bytes = b"") -> None:
        while time.monotonic() < stop_at:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                writer.write(first)
                for byte in trickle:
                    if time.monotonic() >= stop_at or reader.at_eof():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(1.0)
                await asyncio.wait_for(reader.read(), max(0.0, stop_at - time.monotonic()))
                closed[kind] += 1  # the server answered (408) or closed it
            except asyncio.TimeoutError:
                break
            except OSError:
                closed[kind] += 1
            finally:
                writer.close()
            await asyncio.sleep(RECONNECT_AFTER_S)  # then comes back

    async def long_texts() -> None:
        while time.monotonic() < stop_at:
            began = time.monotonic()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                status: int | str = await asyncio.wait_for(servers.request(reader, writer, LONG_TEXT), 60)
                writer.close()
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as err:
                status = type(err).__name__
            long_statuses[status] += 1
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    trickle = b"POST /invocations HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n"
    await asyncio.gather(
        *(hold("idle", b"") for _ in range(idle)),
        *(hold("stalled body", STALLED_BODY + b'{"inputs": "') for _ in range(stalled)),
        *(hold("trickled headers", b"", trickle) for _ in range(trickling)),
        long_texts(),
    )
    return {
        "held": {"idle": idle, "stalled body": stalled, "trickled headers": trickling},
        "closed_by_server": dict(closed),
        "long_text_statuses": {str(k): v for k, v in long_statuses.items()},
    }


def _harass_in_process(port: int, seconds: float, results: multiprocessing.Queue) -> None:
    used = time.process_time()
    harassed = asyncio.run(_harass(port, seconds))
    results.put({**harassed, "attacker_cpu_s": round(time.process_time() - used, 1)})


async def _under_siege(port: int, texts: list[str], concurrency: int, seconds: float, seed: int) -> dict:
    """The baseline's traffic while another process holds connections: a client of its own, as an
    attacker is, so that its 1,400 connections do not slow the innocent clients' own event loop."""
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    attacker = spawn.Process(target=_harass_in_process, args=(port, seconds + 2, results))
    attacker.start()
    await asyncio.sleep(2)  # the connections are open before the measured traffic starts
    soak = await _soak(port, texts, concurrency, seconds, 0.0, seed)
    harassed = await asyncio.get_running_loop().run_in_executor(None, results.get)
    attacker.join()
    return {**soak, **harassed}


def phases(model: Path, texts: list[str], opts: argparse.Namespace) -> dict:
    """A fresh server through the three phases, its resident memory read after each."""
    port = servers.free_port()
    proc, started = servers.start_byoc(model, port, {})
    try:
        reference_stack.wait_ready(port, timeout=300, since=started, proc=proc)
        asyncio.run(_soak(port, texts, opts.concurrency, opts.warmup, 0.0, opts.seed))  # warm-up, not measured
        ran = {"baseline": asyncio.run(_soak(port, texts, opts.concurrency, opts.seconds, 0.0, opts.seed))}
        ran["rss_mib_start"] = servers.rss_tree_mib(proc.pid)
        ran["soak"] = asyncio.run(_soak(port, texts, opts.concurrency, opts.seconds, opts.hostile, opts.seed))
        ran["rss_mib_end"] = servers.rss_tree_mib(proc.pid)
        ran["connections"] = asyncio.run(_under_siege(port, texts, opts.concurrency, opts.seconds, opts.seed))
        ran["rss_mib_after_connections"] = servers.rss_tree_mib(proc.pid)
        ran["alive"] = proc.poll() is None
        return ran
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase (baseline, soak)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--hostile", type=float, default=0.10, help="share of hostile requests in the soak phase")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    harness.add_rounds(parser)
    opts = parser.parse_args()
    if fixtures.EMOTION is None:
        sys.exit(shared_data.missing("emotion"))
    texts = fixtures.sentences()
    model = fixtures.train_model()
    # One scenario (a server's life: baseline, the soak, then held connections, in that order: memory carries
    # over from phase to phase), repeated over rounds.
    rounds = harness.alternate({"soak": lambda: phases(model, texts, opts)}, opts.rounds)["soak"]
    ran = harness.median_of(rounds)  # the figures; a failure in any round fails the run (below)
    baseline, soak, siege, alive = ran["baseline"], ran["soak"], ran["connections"], ran["alive"]
    rss_start, rss_end, rss_siege = ran["rss_mib_start"], ran["rss_mib_end"], ran["rss_mib_after_connections"]
    results = {
        "seconds": opts.seconds,
        "concurrency": opts.concurrency,
        "hostile_share": opts.hostile,
        "baseline": baseline,
        "soak": soak,
        "connections": siege,
        "innocent_failed": soak["innocent_failed"],
        "p99_ratio": soak["p99_ms"] / baseline["p99_ms"],
        "connections_innocent_failed": siege["innocent_failed"],
        "connections_p99_ratio": siege["p99_ms"] / baseline["p99_ms"],
        "rss_mib_start": rss_start,
        "rss_mib_end": rss_end,
        "rss_mib_after_connections": rss_siege,
        "server_alive_at_end": alive,
        "rounds": opts.rounds,
    }
    print(
        f"baseline: {baseline['innocent_requests']} requests, {baseline['innocent_failed']} failed, "
        f"p50 {baseline['p50_ms']:.0f} ms, p99 {baseline['p99_ms']:.0f} ms, {baseline['innocent_per_second']:.0f}/s\n"
        f"soak ({opts.hostile:.0%} hostile): {soak['innocent_requests']} innocent requests, "
        f"{soak['innocent_failed']} failed {soak['innocent_failures'] or ''}, p50 {soak['p50_ms']:.0f} ms, "
        f"p99 {soak['p99_ms']:.0f} ms ({results['p99_ratio']:.2f}x the baseline's), "
        f"{soak['innocent_per_second']:.0f}/s; {soak['hostile_requests']} hostile requests, "
        f"unexpected statuses: {soak['hostile_unexpected'] or 'none'}\n"
        f"connections held ({siege['held']}): {siege['innocent_requests']} innocent requests, "
        f"{siege['innocent_failed']} failed {siege['innocent_failures'] or ''}, p50 {siege['p50_ms']:.0f} ms, "
        f"p99 {siege['p99_ms']:.0f} ms ({results['connections_p99_ratio']:.2f}x the baseline's), "
        f"{siege['innocent_per_second']:.0f}/s; closed by the server: {siege['closed_by_server']}; "
        f"5.8 MB texts: {siege['long_text_statuses']}; the attacker used {siege['attacker_cpu_s']} s of CPU\n"
        f"resident memory: {rss_start:.0f} MiB at the start of the soak, {rss_end:.0f} MiB at its end, "
        f"{rss_siege:.0f} MiB after the connections phase",
        flush=True,
    )
    if opts.json:
        harness.write_results(opts.json, results)
    clean = [
        r["alive"]
        and not r["soak"]["innocent_failed"]
        and not r["soak"]["hostile_unexpected"]
        and not r["connections"]["innocent_failed"]
        and set(r["connections"]["long_text_statuses"]) == {"200"}
        for r in rounds
    ]
    return 0 if all(clean) else 1


if __name__ == "__main__":
    sys.exit(main())
