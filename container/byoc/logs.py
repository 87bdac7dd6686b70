"""Logging set-up for every byoc process (`byoc train`, its ranks, `byoc serve`): readable lines on
stdout (CloudWatch), one copy of each report from a multi-process job, no progress bars."""

from __future__ import annotations

import logging
import os
import sys


def configure_logging() -> None:
    """Once per process, before anything logs; BYOC_LOG_LEVEL sets the level (INFO)."""
    level = os.environ.get("BYOC_LOG_LEVEL", "INFO").upper()
    # Ranks of a launched job say who they are; rank 0 alone logs at INFO unless BYOC_LOG_LEVEL says otherwise.
    rank = os.environ.get("RANK") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    if rank not in (None, "0") and "BYOC_LOG_LEVEL" not in os.environ:
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
