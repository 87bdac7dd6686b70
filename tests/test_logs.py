"""byoc.logs: the secrets of a job stay out of what it writes. A value remembered as secret (by its
hyperparameter's name, or a URL's password) is masked in every log line, a traceback included, and
in output/failure. Which names are secret, and script mode's masked arguments: launch/test_script.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from byoc import logs
from byoc.contract import Paths, write_failure
from helpers import REPO


@pytest.fixture(autouse=True)
def forget_secrets():
    """What a test remembers stays in it (the set is the process's)."""
    known = set(logs._KNOWN)
    yield
    logs._KNOWN.clear()
    logs._KNOWN.update(known)


def test_secret_values_are_remembered_by_name_and_json_strings_decoded():
    logs.remember_secrets({"hfToken": '"hf_abcdef"', "epochs": "3", "name": '"my run"', "use_auth": "true"})
    assert logs.mask_text('token hf_abcdef, "hf_abcdef", 3 epochs of my run, auth true') == (
        'token ***, "***", 3 epochs of my run, auth true'
    )


def test_a_urls_password_is_masked_whatever_its_name():
    logs.remember_secrets({"dbUrl": "postgres://me:pa55word@db:5432/app"})
    assert logs.mask_text("connecting to postgres://me:pa55word@db:5432/app failed (pa55word)") == (
        "connecting to postgres://me:***@db:5432/app failed (***)"
    )
    assert logs.mask_text("https://example.com/a:b@c") == "https://example.com/a:b@c"  # a path, no credentials
    assert logs.mask_hyperparameters({"dbUrl": "s3://k:v@bucket"}) == {"dbUrl": "s3://k:***@bucket"}


def test_a_long_run_of_letters_is_searched_once_not_from_every_letter():
    """A hostile multi-model load's 200 KB model_name reached the log line's mask: the URL pattern's
    unbounded scheme retried from every letter (quadratic: minutes on the server's event loop, 60 s
    request timeouts). A megabyte now masks in one pass; the guard only stops a hang."""
    # In a process of its own: the regex engine holds the GIL, so no thread of this one could time it out.
    program = (
        "from byoc import logs\n"
        "logs.remember_secrets({'dbUrl': 'postgres://me:pa55word@db:5432/app'})\n"
        "print(logs.mask_text('model ' + 'x' * 1_000_000 + ' at postgres://me:pa55word@db')[-30:])\n"
    )
    masked = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)  # a hang guard
    assert masked.stdout == ("x" * 30 + " at postgres://me:***@db")[-30:] + "\n", masked.stderr
    assert logs.mask_text("xpostgres://u:p@h") == "xpostgres://u:***@h"  # a scheme glued to a word still counts
    assert logs.mask_text("a" * 40 + "://u:p@h") == "a" * 40 + "://u:p@h"  # no scheme is 40 letters long


def test_the_failure_file_never_holds_a_remembered_secret(tmp_path):
    logs.remember_secrets({"db_password": "Hunter2-SeCrEt"})
    paths = Paths(tmp_path)
    write_failure(paths, "unrecognized arguments: --db_password Hunter2-SeCrEt --x 1")
    assert paths.failure_file.read_text() == "unrecognized arguments: --db_password *** --x 1\n"


def test_log_lines_and_tracebacks_are_masked():
    code = """
import logging
from byoc import logs
logs.configure_logging()
logs.remember_secrets({"apiKey": "sk-SeCrEt-123"})
log = logging.getLogger("byoc.test")
log.info("calling with sk-SeCrEt-123")
try:
    raise ValueError("bad key sk-SeCrEt-123")
except ValueError:
    log.exception("failed")
logging.getLogger("transformers").warning("not byoc's logger: sk-SeCrEt-123")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert "SeCrEt" not in done.stdout + done.stderr, done.stdout
    assert done.stdout.count("***") == 3 and "ValueError: bad key ***" in done.stdout, done.stdout
