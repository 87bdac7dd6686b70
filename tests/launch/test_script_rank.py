"""byoc.launch.script_rank: the failure record of a script-mode rank names the script's last error
line, its output passes through with the job's secrets masked, SIGTERM reaches it and its exit
status is kept. Its run under the launcher, in a real job, is in launch/test_script.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from byoc import logs
from byoc.launch.script_rank import MaskedStream, last_error_line


@pytest.fixture(autouse=True)
def forget_secrets():
    """Each test starts from no secret and leaves none (the set is the process's: a job run in process by
    an earlier test remembered its own)."""
    known = set(logs._KNOWN)
    logs._KNOWN.clear()
    yield
    logs._KNOWN.clear()
    logs._KNOWN.update(known)


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b"Traceback ...\n  File x\nValueError: bad value\n", "ValueError: bad value"),
        (b"KeyError: 'a'\nwarning: something after it\n\n", "KeyError: 'a'"),  # the error, not the noise after
        (b"RuntimeError: first\nOSError: second\n", "OSError: second"),  # the last one
        (b"KeyboardInterrupt: \n", "KeyboardInterrupt:"),
        (b"SystemExit: 3\n", "SystemExit: 3"),
        (b"loss went up\nlast words\n\n", "last words"),  # no error line: the last non-empty line
        (b"", None),
        (b"\xff\xfe broken bytes\nTypeError: caf\xc3\xa9\n", "TypeError: caf\u00e9"),  # decoded, never raising
    ],
)
def test_the_last_error_line(tail, expected):
    assert last_error_line(tail) == expected


def test_progress_bars_pass_through_as_they_come():
    """tqdm's `\\r` updates end without a newline: each reaches the log whole, at once, not held for one."""
    logs.remember_secrets({"hf_token": '"hf_SeCrEt123"'})
    stream = MaskedStream()
    updates = [b"\r  0%|          | 0/3 [00:00<?, ?it/s]", b"\r 33%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88 | 1/3"]
    updates += [b"\r100%|##########| 3/3 [00:01<00:00, 2.9it/s]", b"\n", b"\xff\xfe not UTF-8\r"]
    assert [stream.feed(update) for update in updates] == updates
    assert stream.feed(b"", final=True) == b""


def test_a_secret_cut_across_reads_is_masked_wherever_the_reads_cut():
    logs.remember_secrets({"hf_token": '"hf_SeCrEt123"', "dbUrl": '"postgres://me:pa55-SeCrEt@db/app"'})
    data = "\rloading hf_SeCrEt123 caf\u00e9\n".encode() + b"url postgres://me:pa55-SeCrEt@db/app\r\xff done\n"
    masked = "\rloading *** caf\u00e9\n".encode() + b"url postgres://me:***@db/app\r\xff done\n"
    for first in range(len(data)):
        for second in range(first, len(data)):
            stream = MaskedStream()
            pieces = [stream.feed(part) for part in (data[:first], data[first:second], data[second:])]
            assert b"".join(pieces) + stream.feed(b"", final=True) == masked, (first, second)
            assert all(b"SeCrEt" not in piece for piece in pieces)
    stream = MaskedStream()
    assert stream.feed(b"token hf_SeC") == b"token "  # only what may be the secret's start waits
    assert stream.feed(b"rEt12") == b""
    assert stream.feed(b"3, then hf_S") == b"***, then "
    assert stream.feed(b"omething else") == b"hf_Something else"  # not the secret after all: passed on


@contextlib.contextmanager
def script_rank(tmp_path: Path, script: str) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m byoc.launch.script_rank python -c SCRIPT` as the launcher starts a rank, in a job
    whose hyperparameters hold a secret; whatever is left of its process group is killed after."""
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps({"db_password": '"Hunter2-SeCrEt"', "epochs": "3"}))
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(tmp_path), "BYOC_FAILURE_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "byoc.launch.script_rank", sys.executable, "-u", "-c", script]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with subprocess.Popen(command, env=env, start_new_session=True, **pipes) as rank:
        try:
            yield rank
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, signal.SIGKILL)


def test_sigterm_reaches_the_script_and_its_exit_status_is_kept(tmp_path):
    """The launcher signals the rank's process group: the script gets SIGTERM itself, at once, and
    the rank exits as the script did (killed by SIGTERM: 143)."""
    script = "import time\nprint('ready Hunter2-SeCrEt', flush=True)\ntime.sleep(600)\n"
    with script_rank(tmp_path, script) as rank:
        assert rank.stdout is not None
        assert rank.stdout.readline() == b"ready ***\n"  # passed on masked while the script still runs
        os.killpg(rank.pid, signal.SIGTERM)
        _, err = rank.communicate(timeout=60)  # a hang guard: the sleep is 600 s
    assert rank.returncode == 128 + signal.SIGTERM, err
    assert json.loads((tmp_path / "rank-0.json").read_text())["message"] == "the process was killed by SIGTERM"


def test_a_process_the_script_leaves_behind_does_not_hold_the_rank(tmp_path):
    """A background process holding the script's stdout and stderr open: the rank ends with the
    script, its exit code kept, its last words passed on."""
    script = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('\\r1/2\\r2/2 bye Hunter2-SeCrEt', end='')\n"
        "sys.exit(3)\n"
    )
    with script_rank(tmp_path, script) as rank:
        out, _ = rank.communicate(timeout=60)  # a hang guard: the leftover sleeps 600 s
    assert (rank.returncode, out) == (3, b"\r1/2\r2/2 bye ***")


def test_a_secret_that_begins_another_never_lets_the_longer_ones_end_through():
    """With hf_SeCrEt and hf_SeCrEt123 both secret, a read ending after the first masked it at once and
    the next read passed '123' on: a piece of the longer secret in the log."""
    logs.remember_secrets({"hf_token": '"hf_SeCrEt123"', "old_token": '"hf_SeCrEt"', "key": '"abcdef"'})
    data = b"a hf_SeCrEt123 b hf_SeCrEt c abcdef d\n"
    for first in range(len(data)):
        for second in range(first, len(data)):
            stream = MaskedStream()
            pieces = [stream.feed(part) for part in (data[:first], data[first:second], data[second:])]
            assert b"".join(pieces) + stream.feed(b"", final=True) == b"a *** b *** c *** d\n", (first, second)
