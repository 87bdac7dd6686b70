"""A benchmark killed by its pid takes its children with it (benchmarks/child_process.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import build_classifier_with_graph, free_port

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, {benchmarks!r})
    from child_process import dies_with_parent, exit_on_sigterm
    exit_on_sigterm()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=dies_with_parent)
    try:  # the pid printed inside: a SIGTERM sent as soon as it is read finds the cleanup in place
        print(child.pid, flush=True)
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


# A benchmark's own server start (servers.start_byoc, which most serving benchmarks use), then the
# benchmark hangs: it is killed by its pid the way a CI timeout kills it.
SERVING_PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {benchmarks!r})
    import servers
    proc, _ = servers.start_byoc(Path({model!r}), {port}, {{}})
    print(proc.pid, flush=True)
    time.sleep(600)
    """
)


def answers_ping(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def session(leader: int) -> list[int]:
    """Live processes of the session `leader` started (start_byoc's server starts one: it and its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, _, _, sid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and int(sid) == leader and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.integration  # a real `byoc serve`
def test_byoc_serve_ends_when_the_benchmark_that_started_it_is_killed(tmp_path, tiny_model_dir):
    model = build_classifier_with_graph(tmp_path / "root" / "model", tiny_model_dir)
    port = free_port()
    code = SERVING_PARENT.format(benchmarks=str(BENCHMARKS), model=str(model), port=port)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = parent.stdout.readline()  # type: ignore[union-attr]
    assert line.strip().isdigit(), f"the benchmark did not start its server: {parent.communicate()[1][-3000:]}"
    server = int(line)
    try:
        wait_until(lambda: answers_ping(port) or gone(server), "the server to answer /ping", limit=300)
        assert not gone(server), "the server exited before answering /ping"
        parent.kill()
        parent.wait()
        wait_until(lambda: not session(server), "the server outlived the benchmark killed by SIGKILL", limit=60)
    finally:
        parent.kill()
        parent.communicate()
        for pid in session(server):  # what outlived it (without dies_with_parent: all of it)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
