"""byoc.serving.http.connections: each server's connection limits and idle connections are its own,
passed to uvicorn with the protocol, not set in the module (a test can run two servers with different
limits in one process). Its behaviour under idle, stalled and oversized connections is tested against
a real server in serving/test_under_fire.py and serving/test_hostile.py."""

from __future__ import annotations

import pickle

from byoc.serving.http import connections
from byoc.serving.server import connection_guard
from byoc.serving.settings import ServeSettings


def test_each_guard_has_its_own_limits_and_idle_connections():
    small = connections.ConnectionGuard(connections.ConnectionLimits(max_connections=4))
    large = connections.ConnectionGuard(connections.ConnectionLimits(max_connections=400))
    small.idle["a connection"] = None  # type: ignore[index]
    assert large.idle == {} and small.protocol().keywords["guard"] is small
    assert (small.protocol().func, large.protocol().keywords["guard"].limits.max_connections) == (
        connections.GuardedProtocol,
        400,
    )


def test_a_worker_process_gets_the_limits_and_an_empty_registry():
    """uvicorn pickles the protocol factory into each worker (SAGEMAKER_MODEL_SERVER_WORKERS > 1)."""
    guard = connections.ConnectionGuard(connections.ConnectionLimits(header_timeout=3.0))
    guard.idle["a connection"] = None  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(guard.protocol())).keywords["guard"]
    assert copy.limits == guard.limits and copy.idle == {}


def test_the_servers_guard_follows_its_settings():
    settings = ServeSettings.from_env(
        {
            "BYOC_MAX_CONCURRENCY": "4",
            "BYOC_MAX_CONNECTIONS": "16",
            "BYOC_MAX_HEADER_BYTES": "2048",
            "BYOC_KEEP_ALIVE_TIMEOUT": "4",
        }
    )
    limits = connection_guard(settings).limits
    assert (limits.max_connections, limits.max_header_bytes, limits.keep_alive_timeout) == (16, 2048, 4.0)
