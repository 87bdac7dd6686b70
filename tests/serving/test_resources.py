"""byoc.serving.resources on made-up cgroup trees: the CPU quota (v1 and v2) and the affinity mask give
the CPUs the server's threads use, the memory limit its multi-model budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from byoc.serving import resources


def tree(tmp_path: Path, files: dict[str, str], cgroup: str) -> tuple[Path, Path]:
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "cgroup").write_text(cgroup)
    return root, proc


AFFINITY = len(os.sched_getaffinity(0))
V1_CPU = "4:cpu,cpuacct:/\n"


@pytest.mark.parametrize(
    "files,cgroup,quota",
    [
        ({"cpu.max": "200000 100000"}, "0::/\n", 2.0),  # v2, docker run --cpus 2, cgroup namespace
        ({"cpu.max": "150000 100000"}, "0::/\n", 1.5),
        ({"cpu.max": "max 100000"}, "0::/\n", None),
        ({"job/cpu.max": "50000 100000", "cpu.max": "max 100000"}, "0::/job\n", 0.5),  # own cgroup first
        (
            {"cpu,cpuacct/cpu.cfs_quota_us": "300000", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
            "4:cpu,cpuacct:/\n",
            3.0,
        ),
        (
            {"cpu/docker/x/cpu.cfs_quota_us": "-1", "cpu/docker/x/cpu.cfs_period_us": "100000"},
            "2:cpu:/docker/x\n",
            None,
        ),
        ({}, "0::/\n", None),  # no cgroup files at all
    ],
)
def test_the_cpu_quota_in_each_cgroup_version(tmp_path, files, cgroup, quota):
    root, proc = tree(tmp_path, files, cgroup)
    assert resources.cpu_quota(root, proc) == quota
    cpus, source = resources.cpu_count(root, proc)
    expected = min(AFFINITY, max(1, -(-quota // 1))) if quota else AFFINITY
    assert cpus == expected
    assert ("quota" in source) == (quota is not None and expected < AFFINITY)


def test_docker_run_cpus_2_on_a_big_host_gives_two_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    root, proc = tree(tmp_path, {"cpu.max": "200000 100000"}, "0::/\n")
    assert resources.cpu_count(root, proc) == (2, "the cgroup's CPU quota (2 CPUs)")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # --cpuset-cpus 0 wins over a larger quota
    assert resources.cpu_count(root, proc)[0] == 1


@pytest.mark.parametrize(
    "files,cgroup,memory",
    [
        ({"memory.max": "1073741824"}, "0::/\n", 1 << 30),
        ({"memory.max": "max"}, "0::/\n", None),
        ({"memory/memory.limit_in_bytes": "2147483648"}, "4:memory:/\n", 2 << 30),
        ({"memory/memory.limit_in_bytes": "9223372036854771712"}, "4:memory:/\n", None),  # v1's "unlimited"
        ({"memory/a/b/memory.limit_in_bytes": "536870912"}, "4:memory:/a/b\n", 512 << 20),
        ({}, "", None),
    ],
)
def test_the_memory_limit_in_each_cgroup_version(tmp_path, files, cgroup, memory):
    root, proc = tree(tmp_path, files, cgroup)
    assert resources.memory_limit(root, proc) == memory


def test_this_machine_reads_without_error():
    found = resources.read_resources()
    assert 1 <= found.cpus <= (os.cpu_count() or 1) and (found.memory is None or found.memory > 0)
