"""The benchmarks' servers and load (the harness's half that runs things; harness.py writes what they measure):
a free port, `byoc serve` started in a session of its own, the load generator (a small asyncio HTTP/1.1 client on
keep-alive connections, cheap enough not to starve the servers on 2 cores; every phase bounded in time), and the
resident memory of a server's process tree."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_process import dies_with_parent  # noqa: E402


def free_port() -> int:
    """A free port below 10000 (MMS rejects 5-digit ports: "Invalid port number")."""
    for port in range(8081, 10000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8081-9999")


async def request(
    reader,
    writer,
    body: bytes,
    content_type: bytes = b"application/json",
    accept: bytes = b"application/json",
    path: bytes = b"/invocations",
) -> int:
    writer.write(
        b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type + b"\r\n"
        b"Accept: " + accept + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readline()).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.readexactly(length)
    return status


async def load_phase(
    port: int, bodies: list[bytes], concurrency: int, warmup: float, seconds: float, path: bytes = b"/invocations"
) -> dict:
    start = time.monotonic()
    measure_from, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    errors = 0

    async def client(i: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = i
        try:
            while time.monotonic() < stop_at:
                began = time.monotonic()
                status = await asyncio.wait_for(
                    request(reader, writer, bodies[n % len(bodies)], path=path), stop_at + 60 - began
                )
                ended = time.monotonic()
                n += concurrency
                # Counted by when it ends: a request that began before the window still completes in
                # it. (Counting only requests that both begin and end inside undercounts throughput
                # by about latency / window: half of it for 6 s requests in a 12 s window.)
                if measure_from <= ended <= stop_at:
                    if status == 200:
                        latencies.append(ended - began)
                    else:
                        errors += 1
        finally:
            writer.close()

    tasks = [asyncio.create_task(client(i)) for i in range(concurrency)]
    # Bounded: whatever is still in flight at the end of the window is abandoned.
    await asyncio.wait(tasks, timeout=warmup + seconds + 5)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")
    return {
        "requests": len(latencies),
        "errors": errors,
        "requests_per_second": len(latencies) / seconds,
        "p50_ms": pick(0.50),
        "p90_ms": pick(0.90),
        "p99_ms": pick(0.99),
    }


def run_load(
    port: int,
    texts: list[str],
    per_request: int,
    concurrency: int,
    warmup: float,
    seconds: float,
    path: str = "/invocations",
    key: str = "inputs",
    extra: dict | None = None,
) -> dict:
    """`per_request` texts a request (TEI's `{"inputs": ...}`; `key`, `extra` and `path` for other servers'
    bodies, such as OpenAI's `{"input": [...], "model": ...}` on /embeddings)."""
    bodies = [
        json.dumps({key: texts[i : i + per_request] if per_request > 1 else texts[i], **(extra or {})}).encode()
        for i in range(0, len(texts) - per_request, per_request)
    ]
    result = asyncio.run(load_phase(port, bodies, concurrency, warmup, seconds, path.encode()))
    result["sentences_per_second"] = result["requests_per_second"] * per_request
    return result


def rss_tree_mib(pid: int) -> float:
    """RSS of a process and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    return total


def start_byoc(model: Path, port: int, settings: dict[str, str]) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(model.parent), "SAGEMAKER_BIND_TO_PORT": str(port), **settings}
    env.pop("SM_MODEL_DIR", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "byoc"), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=dies_with_parent,
    )
    return proc, started
