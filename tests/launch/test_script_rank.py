"""byoc.launch.script_rank: the failure record of a script-mode rank names the script's last error
line. Its run under the launcher (stderr passed through, SIGTERM) is in launch/test_script.py."""

from __future__ import annotations

import pytest

from byoc.launch.script_rank import last_error_line


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
