"""One rank of a script-mode job: the user's script as a child process whose stdout and stderr pass
through with every secret byoc knows masked, while this process keeps only the last 64 KB of its
stderr, so that a failure can be reported with the script's last error line
(`python -m byoc.launch.script_rank COMMAND...`).

Nothing is copied to disk: a script may write any amount to stderr, and the failure record needs
only its last error line.
"""

from __future__ import annotations

import codecs
import json
import os
import selectors
import signal
import subprocess
import sys
from typing import IO

from byoc.contract import Paths
from byoc.launch.launcher import describe_exit, exit_code_of, rank_failure_recorded, write_rank_failure
from byoc.launch.settings import RankSettings
from byoc.logs import cut_secret_start, mask_text, remember_secrets

TAIL_BYTES = 64 * 1024
CHUNK = 64 * 1024
EXIT_CHECK_S = 1.0  # how often a quiet script is checked for its exit (its output never waits for this)


def last_error_line(tail: bytes) -> str | None:
    """The last 'SomethingError: ...' line of a stderr tail (else its last non-empty line)."""
    lines = tail.decode("utf-8", errors="replace").splitlines()
    for line in reversed(lines):
        text = line.strip()
        head = text.split(":", 1)[0]
        if ":" in text and (head.endswith(("Error", "Exception", "Interrupt")) or head == "SystemExit"):
            return text
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


class MaskedStream:
    """One pipe's bytes on their way to the log, every remembered secret masked (byoc.logs.mask_text).
    Each piece passes on as it comes, a progress bar's `\\r` updates included, except an end that may
    be the start of a secret the read cut in two: that waits for the next piece. Bytes that are not
    UTF-8 pass unchanged."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._held = ""

    def feed(self, chunk: bytes, final: bool = False) -> bytes:
        """What of `chunk` (after what was held) may be written now, masked; `final`: all of it."""
        text = self._held + self._decoder.decode(chunk, final)
        cut = len(text) if final else cut_secret_start(text)  # on the text as written: masking comes after
        self._held = text[cut:]
        return mask_text(text[:cut]).encode("utf-8", errors="surrogateescape")


class _Relay:
    """A pipe's MaskedStream and where it goes; `tail`: where the last TAIL_BYTES written are kept."""

    def __init__(self, out: IO[bytes], tail: bytearray | None = None) -> None:
        self.stream, self.out, self.tail = MaskedStream(), out, tail

    def pass_on(self, chunk: bytes) -> None:
        """Write what `chunk` lets through (an empty chunk, the pipe's end: what was held too)."""
        data = self.stream.feed(chunk, final=not chunk)
        if data:
            self.out.write(data)
            self.out.flush()
        if self.tail is not None:
            self.tail += data
            del self.tail[:-TAIL_BYTES]


def relay(child: subprocess.Popen[bytes], tail: bytearray) -> None:
    """Pass the child's stdout and stderr on, masked, until both close, or until it has exited and
    what it wrote has passed (a process it left behind may hold them open)."""
    assert child.stdout is not None and child.stderr is not None  # both piped (run)
    relays = {child.stdout: _Relay(sys.stdout.buffer), child.stderr: _Relay(sys.stderr.buffer, tail)}
    with selectors.DefaultSelector() as selector:
        for pipe, target in relays.items():
            selector.register(pipe, selectors.EVENT_READ, target)
        exited = False
        while selector.get_map():
            ready = selector.select(0 if exited else EXIT_CHECK_S)
            if not ready and exited:
                break
            exited = exited or (not ready and child.poll() is not None)
            for key, _ in ready:
                chunk = os.read(key.fd, CHUNK)
                key.data.pass_on(chunk)
                if not chunk:
                    selector.unregister(key.fileobj)
        for key in selector.get_map().values():  # still open after the script's exit: what they held
            key.data.pass_on(b"")


def remember_job_secrets(paths: Paths) -> None:
    """Remember the job's secrets as `byoc train` did (byoc.contract), to mask them in the script's output."""
    path = paths.config_dir / "hyperparameters.json"
    if path.is_file():  # checked by byoc train before the launch: an object of name -> value
        remember_secrets(json.loads(path.read_text()))


def run(command: list[str], rank: RankSettings | None = None) -> int:
    """Run `command`, pass its output through masked, and leave a failure record if it fails without
    one; `rank`: where the launcher wants it (default: read from the environment, now)."""
    rank = rank or RankSettings.from_env()
    # The launcher signals the whole process group, so the script gets SIGTERM itself; this process
    # only waits for it (a handler, not SIG_IGN, which the script would inherit).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    tail = bytearray()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        relay(child, tail)
        code = child.wait()
    if code and not rank_failure_recorded(rank):  # a script on byoc's runtime (code/train.py) leaves its own
        line = last_error_line(bytes(tail))
        detail = f"the process {describe_exit(code)}"
        write_rank_failure(rank, f"{detail}; its last error: {line}" if line else detail, exit_code_of(code))
    return code if code >= 0 else 128 - code


def main(command: list[str]) -> int:
    """A launched rank: the job's secrets remembered, then `command` run."""
    remember_job_secrets(Paths.from_env())
    return run(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
