"""The serving benchmark's load generator counts what a server really completes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import servers  # noqa: E402  (byoc serve started, the load generator, memory)

LATENCY = 0.5  # every answer of the fake server comes this long after its request, on the clock below
CONCURRENCY = 4


class Clock:
    """The load generator's clock (benchmarks/servers.py reads `time.monotonic()`), moved only by the fake server:
    the answers come at the moments the test says, however fast the machine runs the clients."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _lockstep_server(clock: Clock):
    """A server that holds each request until every client has one in, then moves the clock on by
    LATENCY and answers them all: each client's answers end at 0.5, 1.0, 1.5, 2.0 s..."""
    held: list[asyncio.Future] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                answered = asyncio.get_running_loop().create_future()
                held.append(answered)
                if len(held) == CONCURRENCY:
                    clock.now += LATENCY
                    for future in held:
                        future.set_result(None)
                    held.clear()
                await answered
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return serve


def test_throughput_counts_requests_that_began_before_the_window(monkeypatch):
    """4 clients on a server that answers in 0.5 s: 8 requests/s. Answers end at 0.5, 1.0, 1.5 s
    (and 2.0 s, after the window), so the window [0.25 s, 1.75 s] sees 3 per client: 12 in 1.5 s.
    Counting only requests that also began inside the window sees 2 per client (5.3/s): with long
    latencies (the reference's 16-sentence requests) that undercounted throughput by up to half."""
    clock = Clock()
    monkeypatch.setattr(servers, "time", clock)

    async def main() -> dict:
        server = await asyncio.start_server(_lockstep_server(clock), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await servers.load_phase(port, [b"{}"], concurrency=CONCURRENCY, warmup=0.25, seconds=1.5)

    result = asyncio.run(main())
    assert result["errors"] == 0
    assert result["requests"] == 12 and result["requests_per_second"] == 8.0, result
    assert result["p50_ms"] == result["p99_ms"] == LATENCY * 1000
