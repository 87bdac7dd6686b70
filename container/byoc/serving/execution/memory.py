"""The server process's memory: glibc's heap arenas bounded, freed buffers given back when idle, and the resident
size read (the multi-model registry's budget). Nothing here knows of a model or a request."""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any


@functools.cache
def _glibc() -> Any:
    """glibc, or None where the C library is another (nothing to tune then)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def tune_malloc() -> None:
    """glibc gives each allocating thread its own heap arena; the server needs two (glibc only)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(-8, 2)  # M_ARENA_MAX


def resident_bytes() -> int:
    """This process's resident memory (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def release_memory() -> None:
    """Give freed activation buffers back to the system once the server is idle (glibc keeps
    them in its heaps otherwise, so resident memory would stay at its busiest)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
