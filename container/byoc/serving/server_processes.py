"""The server's processes in GET /metrics (byoc.serving.prometheus), read from /proc at each scrape
(Linux; nothing elsewhere):

    byoc_server_resident_memory_bytes, byoc_server_cpu_seconds_total   every process of the server: the
        supervisor, its workers and what they started (multiprocessing's resource tracker, a handler's
        subprocesses): what the server costs the container
    byoc_server_processes   the supervisor and its workers alive (1 + SAGEMAKER_MODEL_SERVER_WORKERS when
        all are up; 1 with one worker): a helper process is no worker, so it is not counted
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# multiprocessing marks the processes it spawns (uvicorn's workers) with this argument; its resource
# tracker, which uvicorn's supervisor starts beside them, runs without it.
SPAWNED = b"--multiprocessing-fork"


class ServerProcesses:
    """A prometheus_client collector for the server's processes: `root` (the one process, or uvicorn's
    supervisor where `supervisor`) and every process under it."""

    def __init__(self, root: int, supervisor: bool = False) -> None:
        self.root, self.supervisor = root, supervisor
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def collect(self) -> Iterator[Any]:
        # Only here, as every prometheus_client import: BYOC_METRICS=false never loads it.
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        memory = cpu = 0.0
        counted = serving = 0
        for pid, parent in _tree(self.root):
            try:
                memory += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * self.page
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                cpu += (int(fields[11]) + int(fields[12])) / self.ticks  # utime, stime
                counted += 1
                serving += pid == self.root or (self.supervisor and parent == self.root and _is_worker(pid))
            except (OSError, ValueError, IndexError):
                continue  # it ended meanwhile
        if not counted:
            return
        yield GaugeMetricFamily(
            "byoc_server_resident_memory_bytes", "Resident memory of the server's processes", memory
        )
        yield CounterMetricFamily(
            "byoc_server_cpu_seconds", "CPU time of the server's processes (user and system)", cpu
        )
        yield GaugeMetricFamily("byoc_server_processes", "The server's supervisor and workers alive", serving)


def _is_worker(pid: int) -> bool:
    """Whether a child of the supervisor is one of its workers (multiprocessing spawned it)."""
    return SPAWNED in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def _tree(root: int) -> Iterator[tuple[int, int | None]]:
    """`root` and every process under it, each with its parent (/proc's children lists)."""
    seen: set[int] = set()
    todo: list[tuple[int, int | None]] = [(root, None)]
    while todo:
        pid, parent = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        yield pid, parent
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                todo.extend((int(child), pid) for child in task.read_text().split())
            except (OSError, ValueError):
                continue
