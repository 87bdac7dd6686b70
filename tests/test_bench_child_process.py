"""A benchmark killed by its pid takes its children with it (benchmarks/child_process.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, {benchmarks!r})
    from child_process import dies_with_parent, exit_on_sigterm
    exit_on_sigterm()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=dies_with_parent)
    print(child.pid, flush=True)
    try:
        time.sleep(600)
    finally:
        open({marker!r}, "w").write("cleaned up")
    """
)


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def start_parent(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    code = PARENT.format(benchmarks=str(BENCHMARKS), marker=str(tmp_path / "marker"))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())  # type: ignore[union-attr]


def wait_until(condition, what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_child_ends_when_the_benchmark_that_started_it_is_killed(tmp_path, sig):
    parent, child = start_parent(tmp_path)
    try:
        assert not gone(child)
        parent.send_signal(sig)
        parent.wait()
        wait_until(lambda: gone(child), "the child outlived its killed parent")
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_sigterm_runs_the_benchmarks_cleanup(tmp_path):
    parent, child = start_parent(tmp_path)
    parent.terminate()
    assert parent.wait() == 128 + signal.SIGTERM
    assert (tmp_path / "marker").read_text() == "cleaned up"
    wait_until(lambda: gone(child), "the child outlived its parent")
