"""One rank of a script-mode job: the user's script as a child process whose stderr passes through
unchanged, while this process keeps only its last 64 KB, so that a failure can be reported with
the script's last error line (`python -m byoc.launch.script_rank COMMAND...`).

Nothing is copied to disk: a script may write any amount to stderr, and the failure record needs
only its last error line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from byoc.launch.launcher import describe_exit, exit_code_of, rank_failure_recorded, write_rank_failure
from byoc.launch.settings import RankSettings

TAIL_BYTES = 64 * 1024
CHUNK = 64 * 1024


def last_error_line(tail: bytes) -> str | None:
    """The last 'SomethingError: ...' line of a stderr tail (else its last non-empty line)."""
    lines = tail.decode("utf-8", errors="replace").splitlines()
    for line in reversed(lines):
        text = line.strip()
        head = text.split(":", 1)[0]
        if ":" in text and (head.endswith(("Error", "Exception", "Interrupt")) or head == "SystemExit"):
            return text
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


def run(command: list[str], rank: RankSettings | None = None) -> int:
    """Run `command`, pass its stderr through, and leave a failure record if it fails without one;
    `rank`: where the launcher wants it (default: read from the environment, now)."""
    rank = rank or RankSettings.from_env()
    # The launcher signals the whole process group, so the script gets SIGTERM itself; this process
    # only waits for it (a handler, not SIG_IGN, which the script would inherit).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    child = subprocess.Popen(command, stderr=subprocess.PIPE)
    assert child.stderr is not None
    tail = bytearray()
    out = sys.stderr.buffer
    while chunk := os.read(child.stderr.fileno(), CHUNK):
        out.write(chunk)
        out.flush()
        tail += chunk
        del tail[:-TAIL_BYTES]
    code = child.wait()
    if code and not rank_failure_recorded(rank):  # a script on byoc's runtime (code/train.py) leaves its own
        line = last_error_line(bytes(tail))
        detail = f"the process {describe_exit(code)}"
        write_rank_failure(rank, f"{detail}; its last error: {line}" if line else detail, exit_code_of(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
