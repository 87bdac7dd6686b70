"""The container's own resources, as its cgroup limits them: CPUs and memory.

`os.cpu_count()` is the host's cores: a container limited to 2 CPUs on a 64-core host (`docker run
--cpus 2`, a shared serverless host) would start 64 ONNX Runtime threads per session and run slower
than with 2. Here the CPU count is the smallest of the affinity mask (`--cpuset-cpus`, taskset) and
the CFS quota (`--cpus`: cgroup v2's cpu.max, v1's cpu.cfs_quota_us / cpu.cfs_period_us, rounded
up), and the memory limit is cgroup v2's memory.max or v1's memory.limit_in_bytes (None: unlimited).

Each reader takes the files' roots as parameters, so tests run them on made-up cgroup trees.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF = Path("/proc/self")
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number (PAGE_COUNTER_MAX pages) for "no limit"


@dataclass(frozen=True)
class Resources:
    cpus: int  # CPUs this process may use
    memory: int | None  # bytes, or None when the cgroup sets no limit
    source: str = "the affinity mask"  # what set the CPUs, for the log
    physical: int | None = None  # the machine's memory, in bytes

    @property
    def usable_memory(self) -> int | None:
        """What this process may use: the cgroup's limit, else the machine's memory."""
        return self.memory if self.memory is not None else self.physical


def read_resources(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF) -> Resources:
    """This process's CPUs and memory limit, from its cgroup (v1 or v2) and its affinity."""
    cpus, cpu_source = cpu_count(root, proc)
    return Resources(cpus, memory_limit(root, proc), cpu_source, physical_memory())


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_count(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF) -> tuple[int, str]:
    """(CPUs, what limited them): the affinity mask, capped by the cgroup's CPU quota."""
    try:
        cpus, source = len(os.sched_getaffinity(0)), "the affinity mask"
    except (AttributeError, OSError):  # not Linux
        cpus, source = os.cpu_count() or 1, "os.cpu_count()"
    quota = cpu_quota(root, proc)
    if quota is not None and math.ceil(quota) < cpus:
        cpus, source = max(1, math.ceil(quota)), f"the cgroup's CPU quota ({quota:g} CPUs)"
    return cpus, source


def cpu_quota(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF) -> float | None:
    """CPUs' worth of time the cgroup allows per period, or None for no quota."""
    for folder in _folders(root, proc, "cpu"):
        v2 = _read(folder / "cpu.max")
        if v2 is not None:
            quota, _, period = v2.partition(" ")
            return None if quota == "max" else _ratio(quota, period or "100000")
        v1 = _read(folder / "cpu.cfs_quota_us")
        if v1 is not None:
            return None if v1.strip() == "-1" else _ratio(v1, _read(folder / "cpu.cfs_period_us") or "100000")
    return None


def memory_limit(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF) -> int | None:
    """Bytes of memory the cgroup allows, or None for no limit."""
    for folder in _folders(root, proc, "memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            value = _read(folder / name)
            if value is None:
                continue
            if value.strip() == "max":
                return None
            try:
                limit = int(value)
            except ValueError:
                return None
            return None if limit >= _UNLIMITED else limit
    return None


def _folders(root: Path, proc: Path, controller: str) -> list[Path]:
    """Where this process's cgroup files for `controller` may be, most specific first: its own
    cgroup's folder (from /proc/self/cgroup), then the mount's root (a container sees its own cgroup
    there when it has a cgroup namespace)."""
    mounts = [root, root / controller, root / "cpu,cpuacct"] if controller == "cpu" else [root, root / controller]
    found: list[Path] = []
    for line in (_read(proc / "cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" or controller in controllers.split(","):  # v2 ("0::/x"), or v1 naming it
            found += [mount / path.lstrip("/") for mount in mounts]
    return [folder for folder in [*found, *mounts] if folder.is_dir()]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        value, length = int(quota), int(period)
    except ValueError:
        return None
    return value / length if value > 0 and length > 0 else None
