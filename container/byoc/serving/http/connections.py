"""Connections that cannot hold the server: uvicorn's httptools protocol with limits of its own.

uvicorn leaves a connection that never sends a byte open for ever, reads headers of any size on
the event loop (an 8 MB Accept header stalled /ping for seconds), and, at its connection limit,
answers every request, /ping included, with a plain-text 503. Here:
- a connection that sends nothing is closed after the keep-alive timeout, as an idle keep-alive
  one is; headers must be complete within `header_timeout` of their first byte (408 otherwise);
- headers over `max_header_bytes` get a JSON 431 and the connection closes; nothing of them is
  echoed;
- at `max_connections`, a new connection closes the one idle for longest (never sent a request,
  idle between requests, stuck in its headers, then stalled in its body, in that order) instead
  of being refused: stalled and idle connections cannot lock /ping or ordinary clients out.
The body's own timeout is the app's (it answers 408 in JSON); requests that are being answered are
never closed here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1024
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 15.0
    keep_alive_timeout: float = 75.0


class ConnectionGuard:
    """One server's connection limits and its idle connections, oldest first: the next to close at
    the connection limit, found in O(1) however many there are (a scan of 1,024 on every new
    connection cost the event loop more than the idle clients did). `protocol()` is what uvicorn
    makes each connection with; each server (and each uvicorn worker) has a guard of its own."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.idle: dict[GuardedProtocol, None] = {}

    def protocol(self) -> Callable[..., GuardedProtocol]:
        """`uvicorn.run(..., http=guard.protocol())`."""
        return functools.partial(GuardedProtocol, guard=self)

    def __reduce__(self) -> tuple[Any, ...]:
        # A uvicorn worker process gets the limits, and a registry of its own connections.
        return (ConnectionGuard, (self.limits,))


def error_bytes(status: int, reason: str, message: str) -> bytes:
    """A complete JSON error response that closes the connection."""
    body = json.dumps({"error": message, "status": status}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above (made by `ConnectionGuard.protocol()`)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.limits = guard.limits
        self.in_head = True  # reading a request's headers (or waiting for a request)
        self.head_bytes = 0  # bytes of the headers read so far
        self.idle_since = 0.0
        self.header_timer: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.idle_since = self.loop.time()
        # uvicorn arms its keep-alive timer only after a response: one that never sends is closed too.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.limits.keep_alive_timeout, self.timeout_keep_alive_handler
        )
        if len(self.connections) > self.limits.max_connections:
            victim = _longest_idle(self.guard.idle, self.connections, self)
            if victim is not None:
                victim.transport.close()
        self.guard.idle[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.idle.pop(self, None)
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.in_head:
            self.head_bytes += len(data)
        super().data_received(data)
        if self.in_head and self.head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
            self._refuse(
                431,
                "Request Header Fields Too Large",
                f"the request's line and headers are over {self.limits.max_header_bytes} bytes "
                "(BYOC_MAX_HEADER_BYTES): send shorter headers",
            )

    def on_message_begin(self) -> None:
        self.guard.idle.pop(self, None)
        super().on_message_begin()
        self._cancel_header_timer()
        self.header_timer = self.loop.call_later(self.limits.header_timeout, self._headers_too_slow)

    def on_headers_complete(self) -> None:
        self.in_head, self.head_bytes = False, 0
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.in_head, self.head_bytes = True, 0

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self.guard.idle.pop(self, None)
            self.guard.idle[self] = None  # the newest idle one

    def _headers_too_slow(self) -> None:
        self.header_timer = None
        if self.in_head and not self.transport.is_closing():
            self._refuse(
                408,
                "Request Timeout",
                f"the request's headers did not arrive within {self.limits.header_timeout:g} s (BYOC_HEADER_TIMEOUT)",
            )

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self.logger.info("closing a connection from %s: %s", _peer(self.client), message)
        self.transport.write(error_bytes(status, reason, message))
        self.transport.close()

    def eviction_rank(self) -> tuple[int, float] | None:
        """How readily this connection, not idle, is closed to make room: stuck in its headers first,
        then stalled in its body; None for never (its request is complete and being answered)."""
        cycle = self.cycle
        if self.transport.is_closing():
            return None
        if cycle is None or cycle.response_complete:
            return (0, self.idle_since)
        if cycle.more_body:
            return (1, self.idle_since)
        return None


def _longest_idle(idle: dict[Any, None], connections: set[Any], newcomer: Any) -> Any:
    """The idle connection idle longest, else the one stuck longest in its headers, else in its body."""
    while idle:
        oldest = next(iter(idle))
        del idle[oldest]
        if oldest is not newcomer and not oldest.transport.is_closing():
            return oldest
    ranked = [
        (rank, c)
        for c in connections
        if c is not newcomer and isinstance(c, GuardedProtocol) and (rank := c.eviction_rank()) is not None
    ]
    return min(ranked, key=lambda item: item[0])[1] if ranked else None


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
