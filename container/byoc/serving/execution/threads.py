"""Threads for the server's blocking work that can never hold the process.

`ThreadPoolExecutor`'s threads are joined when Python exits, so one handler that hangs (a
`time.sleep(3600)` in a user's `input_fn`) keeps a stopped server alive until SIGKILL, and a
fixed pool of hung threads makes every later request wait. These threads are daemons (exit does
not wait for them), and the pool grows while every thread is busy, up to `max_workers`: a hung
handler costs its own request a timeout, and the next request gets a fresh thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_STOP = None  # tells an idle thread to end


class DaemonThreads(Executor):
    """An executor of daemon threads, started on demand and kept while idle for reuse."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers, self.name = max_workers, name
        self._work: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting for work
        self._pending = 0  # work queued while every thread was busy
        self._shutdown = False
        self._count = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        item = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self.name}: cannot take work after shutdown")
            if self._idle > 0:  # an idle thread takes it from the queue
                self._idle -= 1
                self._work.put(item)
            elif len(self._threads) < self.max_workers:
                self._start_thread(item)
            else:  # every thread is busy: the first to finish takes it
                self._pending += 1
                self._work.put(item)
        return future

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _start_thread(self, first: tuple[Future, Callable[..., Any], tuple, dict]) -> None:
        self._count += 1
        thread = threading.Thread(target=self._serve, args=(first,), name=f"{self.name}-{self._count}", daemon=True)
        self._threads.add(thread)
        thread.start()

    def _serve(self, item: tuple[Future, Callable[..., Any], tuple, dict] | None) -> None:
        while item is not _STOP:
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # the caller decides what a handler's exception means
                    future.set_exception(err)
            del item, future, fn, args, kwargs  # no reference to a finished call's data while idle
            with self._lock:
                if self._shutdown:
                    break
                if self._pending > 0:  # work queued while every thread was busy: this one takes it
                    self._pending -= 1
                else:
                    self._idle += 1
            item = self._work.get()
        with self._lock:
            self._threads.discard(threading.current_thread())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; idle threads end. Busy ones end when their call returns (never waited
        for past `wait`: a hung call must not hold the caller)."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[0].cancel()
        for _ in threads:
            self._work.put(_STOP)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()
