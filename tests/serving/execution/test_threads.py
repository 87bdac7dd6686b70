"""byoc.serving.execution.threads: the server's handler threads grow while busy, are reused while idle, and never hold
the process at exit (a hung handler in a ThreadPoolExecutor kept a stopped server alive)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from byoc.serving.execution.threads import DaemonThreads


def test_a_busy_pool_grows_up_to_its_limit_and_reuses_idle_threads():
    pool = DaemonThreads(3, "test")
    release = threading.Event()
    blocked = [pool.submit(release.wait) for _ in range(3)]
    assert pool.threads == 3
    queued = pool.submit(lambda: "after")  # every thread is busy: it waits for the first to finish
    assert not queued.done()
    release.set()
    assert queued.result(5) == "after" and all(f.result(5) for f in blocked)
    for i in range(20):  # sequential calls reuse the idle threads
        assert pool.submit(lambda x: x * 2, i).result(5) == 2 * i
    assert pool.threads == 3
    pool.shutdown()
    assert pool.threads == 0


def test_a_hung_call_costs_one_thread_and_the_next_call_gets_another():
    pool = DaemonThreads(4, "test")
    hung = pool.submit(time.sleep, 3600)
    assert pool.submit(lambda: 42).result(5) == 42
    assert not hung.done()
    pool.shutdown(wait=False, cancel_futures=True)


def test_exceptions_and_base_exceptions_reach_the_caller():
    pool = DaemonThreads(1, "test")
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)

    def exits():
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        pool.submit(exits).result(5)
    assert pool.submit(lambda: "still serving").result(5) == "still serving"
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)


def test_a_hung_thread_never_holds_the_process_at_exit():
    code = (
        "import sys, threading, time; sys.path.insert(0, sys.argv[1])\n"
        "from byoc.serving.execution.threads import DaemonThreads\n"
        "hanging = threading.Event()\n"
        "pool = DaemonThreads(2, 'test'); pool.submit(lambda: (hanging.set(), time.sleep(3600)))\n"
        "assert hanging.wait(300)\n"  # the call hangs in its thread when the interpreter exits
    )
    # The hung call would hold the process for an hour: the timeout only guards against that hang.
    done = subprocess.run([sys.executable, "-c", code, sys.path[0]], timeout=300)
    assert done.returncode == 0
