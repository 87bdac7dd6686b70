"""The serving benchmark's load generator counts what a server really completes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_serve  # noqa: E402

LATENCY = 0.5  # every answer of the fake server takes this long


async def _slow_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            await asyncio.sleep(LATENCY)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def test_throughput_counts_requests_that_began_before_the_window():
    """4 clients on a server that answers in 0.5 s: 8 requests/s. Answers end at 0.5, 1.0, 1.5 s
    (and 2.0 s, after the window), so the window [0.25 s, 1.75 s] sees 3 per client: 12 in 1.5 s.
    Counting only requests that also began inside the window sees 2 per client (5.3/s): with long
    latencies (the reference's 16-sentence requests) that undercounted throughput by up to half."""

    async def main() -> dict:
        server = await asyncio.start_server(_slow_server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await bench_serve._load(port, [b"{}"], concurrency=4, warmup=0.25, seconds=1.5)

    result = asyncio.run(main())
    assert result["errors"] == 0
    assert 7.0 <= result["requests_per_second"] <= 8.7, result
    assert result["p50_ms"] >= LATENCY * 1000
