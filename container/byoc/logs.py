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
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s{who} %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
        force=True,
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Progress bars are carriage-return noise in CloudWatch; byoc logs progress as lines instead.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


MASK = "***"
# A hyperparameter named with one of these words holds a credential: its value never reaches the logs.
SECRET_WORDS = frozenset(
    "token secret password passwd passphrase key apikey credential credentials auth oauth authorization".split()
)
# Words glued without a case change (HFTOKEN, dbpassword) count when they end with one of these
# (not "key" or "auth": monkey, author).
_SECRET_ENDINGS = ("token", "secret", "password", "passwd", "credential", "credentials", "apikey", "accesskey")
# camelCase and PascalCase words: awsSecretAccessKey -> aws Secret Access Key; APIKey -> API Key.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def is_secret(name: str) -> bool:
    """hf_token, hfToken, HF-TOKEN, WANDB_API_KEY, awsSecretAccessKey, apiKey, APIKEY, db-password...
    (whole words of the name, in any case or style, so "keyword", "monkey" or "max_tokens" are not)."""
    words = [word.lower() for word in _WORD.findall(name)]
    return any(word in SECRET_WORDS or word.endswith(_SECRET_ENDINGS) for word in words)


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
    """The hyperparameters with each secret-looking one's value masked, for a log line."""
    return {name: MASK if is_secret(name) else value for name, value in hyperparameters.items()}
