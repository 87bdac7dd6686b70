"""A host's ranks as processes of their own: the GPUs they run on, their start, their stop, their failures.

Each rank is spawned (a fresh interpreter: it loads its model on its own device) and shares the job's stop (a
multiprocessing Event): a SIGTERM that comes while the corpus is read or the ranks start stops them all the same.
The job waits on every rank; the first that fails stops the others (each between two batches) and fails the job,
naming it and why.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import queue
import re
import signal
from pathlib import Path
from typing import Any, cast

from byoc.encoding import encoder
from byoc.encoding.encoder import RankJob
from byoc.encoding.settings import EncodeError
from byoc.environment import Environment
from byoc.errors import EXIT_FAILURE, EXIT_STOPPED, describe
from byoc.logs import configure_logging

logger = logging.getLogger(__name__)

_context = multiprocessing.get_context("spawn")
job_stop = _context.Event()  # the job's stop, which every rank reads (encoder.shared_stop)


def gpu_ids() -> list[str]:
    """The NVIDIA GPUs this container sees, as CUDA_VISIBLE_DEVICES names them (its /dev/nvidiaN devices, or the
    variable's list where it is set), found without importing torch."""
    devices = [
        p.name.removeprefix("nvidia") for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)
    ]
    visible = Environment().env.get("CUDA_VISIBLE_DEVICES")  # (set and empty: no GPU, as CUDA reads it)
    if visible is not None and devices:
        return [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return sorted(devices, key=int)


def stop() -> None:
    """The job's SIGTERM: this process and every rank stop between two batches."""
    encoder.stop_requested.set()
    job_stop.set()


def run(jobs: list[RankJob]) -> None:
    """Run the ranks to their end. Stopped where a rank stopped on SIGTERM (and none failed); an error naming
    the first rank that failed (the others stopped then); nothing where every rank finished."""
    errors = _context.Queue()
    processes = {}
    for job in jobs:
        encoder.check_stop("before the ranks started")
        process = _context.Process(target=_rank, args=(job, errors, job_stop), name=f"byoc-encode-{job.rank}")
        process.start()
        processes[process.sentinel] = (job.rank, process)
    reports: dict[int, tuple[str, str]] = {}
    waiting = set(processes)
    while waiting:
        for sentinel in multiprocessing.connection.wait(list(waiting)):
            waiting.discard(sentinel)
            rank, process = processes[cast(int, sentinel)]  # (a process's sentinel: its file descriptor)
            process.join()
            reports.update(_drain(errors))
            if process.exitcode not in (0, EXIT_STOPPED) and not job_stop.is_set():
                logger.error("rank %d failed: stopping the other ranks", rank)
                job_stop.set()
    reports.update(_drain(errors))
    failed = [(rank, p.exitcode) for rank, p in processes.values() if p.exitcode not in (0, EXIT_STOPPED)]
    if failed:
        rank, code = failed[0]
        kind, message = reports.get(rank, ("error", _ended(rank, code)))
        raise (EncodeError if kind == "user" else RuntimeError)(message)
    if any(p.exitcode == EXIT_STOPPED for _, p in processes.values()):
        raise encoder.Stopped("stopped by SIGTERM")


def _drain(errors: Any) -> dict[int, tuple[str, str]]:
    found: dict[int, tuple[str, str]] = {}
    while True:
        try:
            rank, kind, message = errors.get_nowait()
        except queue.Empty:
            return found
        found[rank] = (kind, message)


def _ended(rank: int, code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = " (the kernel ends a process so when memory runs out)" if name == "SIGKILL" else ""
        return f"rank {rank} was killed by {name}{why}"
    return f"rank {rank} ended with exit code {code} without saying why (the lines above it in the log)"


def _rank(job: RankJob, errors: Any, shared: Any) -> None:
    configure_logging()
    encoder.shared_stop = shared
    signal.signal(signal.SIGTERM, lambda *_: encoder.stop_requested.set())
    try:
        encoder.run(job)
    except encoder.Stopped:
        raise SystemExit(EXIT_STOPPED) from None
    except Exception as err:
        if not isinstance(err, EncodeError):
            logger.exception("rank %d failed", job.rank)
        errors.put((job.rank, "user" if isinstance(err, EncodeError) else "error", f"rank {job.rank}: {describe(err)}"))
        raise SystemExit(EXIT_FAILURE) from None
