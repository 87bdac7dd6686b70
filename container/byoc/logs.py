"""Logging set-up for every byoc process (`byoc train`, its ranks, `byoc serve`): readable lines on
stdout (CloudWatch), one copy of each report from a multi-process job, no progress bars; and the
one rule that keeps credentials passed as hyperparameters out of every log line."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from byoc.environment import Environment, SettingError

LOG_LEVEL_ENV = "BYOC_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(read: Environment) -> str:
    """BYOC_LOG_LEVEL (INFO). Each program's settings read it too, so that a bad value stops the
    program at start like any other (logging itself starts before them, at INFO then)."""
    return read.choice(LOG_LEVEL_ENV, "INFO", LOG_LEVELS)


def configure_logging() -> None:
    """Once per process, before anything logs (and before the program's settings are read: this
    reads the few variables it needs itself); BYOC_LOG_LEVEL sets the level (INFO)."""
    read = Environment()
    try:
        level = log_level(read)
    except SettingError:  # the program's settings stop it with the message, once logging can say it
        level = "INFO"
    try:
        world = read.integer("WORLD_SIZE", 1, 1)
    except SettingError:  # likewise (byoc.launch.settings.RankSettings)
        world = 1
    # Ranks of a launched job say who they are; rank 0 alone logs at INFO unless BYOC_LOG_LEVEL says otherwise.
    rank = read.text("RANK") if world > 1 else None
    if rank not in (None, "0") and not read.is_set(LOG_LEVEL_ENV):
        level = "WARNING"
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # one copy of transformers' reports, from rank 0
    who = f" rank{rank}" if rank is not None else ""
    logging.basicConfig(level=level, stream=sys.stdout, force=True)
    formatter = _MaskingFormatter(f"%(asctime)s{who} %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Progress bars are carriage-return noise in CloudWatch; byoc logs progress as lines instead.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


MASK = "***"
# A hyperparameter named with one of these words holds a credential: its value never reaches the logs.
SECRET_WORDS = frozenset(
    "token secret password passwd passphrase pwd pat bearer key apikey credential credentials auth oauth "
    "authorization".split()
)
# Names glued without a case change (HFTOKEN, dbpassword, SECRETKEY, openaikey) count when they end with
# one of these (not a bare "key" or "auth": monkey, hockey, author).
_SECRET_ENDINGS = (
    "token", "secret", "password", "passwd", "pwd", "credential", "credentials",
    "apikey", "accesskey", "secretkey", "privatekey", "aikey",
)  # fmt: skip
# camelCase and PascalCase words: awsSecretAccessKey -> aws Secret Access Key; APIKey -> API Key.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# A URL's password (postgres://user:PASSWORD@host), whatever the hyperparameter holding it is called.
# The scheme is bounded (32 characters, none before it): unbounded, a long run of letters (a hostile
# 200 KB model name in a log line) made the search quadratic, minutes on the event loop.
_URL_PASSWORD = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<head>[a-zA-Z][a-zA-Z0-9+.-]{0,31}://[^\s:/@]*:)(?P<password>[^\s/@]+)@"
)
# Values remembered as secret in this process (remember_secrets): masked in every log line and failure.
_KNOWN: set[str] = set()
_NOT_SECRET = {"true", "false", "none", "null", ""}


def is_secret(name: str) -> bool:
    """hf_token, hfToken, HF-TOKEN, WANDB_API_KEY, awsSecretAccessKey, apiKey, APIKEY, db-password,
    dbPwd, githubPAT, SECRETKEY, openaikey... (whole words of the name, in any case or style, or the
    glued name's ending, so "keyword", "monkey" or "max_tokens" are not)."""
    words = [word.lower() for word in _WORD.findall(name)]
    glued = "".join(words)
    return any(word in SECRET_WORDS or word.endswith(_SECRET_ENDINGS) for word in words) or glued.endswith(
        _SECRET_ENDINGS
    )


def remember_secrets(hyperparameters: Mapping[str, Any]) -> None:
    """Remember the values of `hyperparameters` that are secret (by their name, or a URL's password):
    from then on this process masks them wherever they appear, in its log lines (configure_logging)
    and in the failure text it writes (`mask_text`), an argparse error quoting them included."""
    for name, value in hyperparameters.items():
        text = value if isinstance(value, str) else str(value)
        if is_secret(name):
            value_text = text.strip('"')  # as the SDK's JSON string decodes (masking it masks the quoted too)
            if value_text.lower() not in _NOT_SECRET and len(value_text) >= 3:
                _KNOWN.add(value_text)
        _KNOWN.update(m["password"] for m in _URL_PASSWORD.finditer(text))


def mask_text(text: str) -> str:
    """`text` with every remembered secret value and every URL's password replaced by ***."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    for secret in sorted(_KNOWN, key=len, reverse=True):  # the longest first: one may contain another
        text = text.replace(secret, MASK)
    return text


def cut_secret_start(text: str) -> int:
    """Where a remembered secret may begin at the end of `text`, cut off by it (`len(text)`: nowhere), in
    `text` as written (unmasked). A stream masked piece by piece masks `text` up to there and holds the rest
    until the next piece (byoc.launch.script_rank); the cut never falls inside a whole secret either."""
    start = len(text)
    for secret in _KNOWN:
        # A proper prefix of a secret (a whole one that is the start of a longer one, "hf_X" of "hf_X123",
        # included: masked now, the longer one's end would pass unmasked).
        at = max(0, len(text) - len(secret) + 1)
        while (at := text.find(secret[0], at, start)) != -1:  # only before `start`: the longest cut wins
            if secret.startswith(text[at:]):
                start = at
                break
            at += 1
    moved = True
    while moved:  # a whole secret across the cut moves it to the secret's start: masked once it is passed on
        moved = False
        for secret in _KNOWN:
            at = text.find(secret, max(0, start - len(secret) + 1), start + len(secret) - 1)
            if at != -1 and at < start:
                start, moved = at, True
    return start


class _MaskingFormatter(logging.Formatter):
    """Every line byoc's process logs (a traceback included) with the secrets masked (mask_text)."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_text(super().format(record))


def mask_secrets(args: list[str]) -> list[str]:
    """Command-line arguments with the value of each secret-looking option masked, whatever that value
    looks like (empty, or starting with "--"): `--hfToken X`, `-k X` and `--password=X` alike."""
    out, hide_next = [], False
    for arg in args:
        name, equals, _ = arg.partition("=")
        if hide_next:
            out.append(MASK)
        elif arg.startswith("-") and is_secret(name):
            out.append(f"{name}={MASK}" if equals else arg)
        else:
            out.append(arg)
        hide_next = not hide_next and arg.startswith("-") and not equals and is_secret(name)
    return out


def mask_hyperparameters(hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameters with each secret-looking one's value masked (and a URL's password), for a log line."""
    return {
        name: MASK if is_secret(name) else mask_text(value) if isinstance(value, str) else value
        for name, value in hyperparameters.items()
    }
