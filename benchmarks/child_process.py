"""Children that end with the benchmark that started them.

A benchmark killed by its pid (`kill PID`, a CI timeout) used to leave its `byoc train` running: nothing
tells a child that its parent is gone. Linux can: PR_SET_PDEATHSIG sends the child SIGTERM when the
process that started it ends, however it ends (SIGKILL included). Elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dies_with_parent() -> None:
    """`preexec_fn` for subprocess: this child gets SIGTERM when its parent ends (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so `finally` blocks (temporary folders, servers) run and children follow."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def byoc_train(env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess:
    """`byoc train` (this Python's) with `env`, ending with the benchmark; `kwargs` go to subprocess.run."""
    byoc = str(Path(sys.executable).parent / "byoc")
    return subprocess.run([byoc, "train"], env=env, preexec_fn=dies_with_parent, **kwargs)
