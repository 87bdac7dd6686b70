"""A train channel split across hosts (ShardedByS3Key): each host trains on its own files, and the
hosts agree on one label map and one number of rows before training."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from byoc.contract import TrainingContract
from byoc.launch import distributed
from byoc.training.data import DataError, TaskData

logger = logging.getLogger(__name__)


def agree_on_shards(contract: TrainingContract, data: TaskData, tokenized: dict[str, Any]) -> list[int] | None:
    """With a ShardedByS3Key train channel and several hosts, each host trains on its own files.

    The hosts agree on one label map (the union of what each shard holds) and on a common number
    of rows (the smallest shard's), so every rank runs the same number of steps. Returns the
    ranks that read this host's shard, or None when every host holds the same data.
    """
    channel = contract.channels.get("train") or contract.channels.get("training")
    if channel is None or channel.distribution != "ShardedByS3Key" or len(contract.hosts) == 1:
        return None
    for name in ("eval", "test", "validation", "testing"):
        other = contract.channels.get(name)
        if other is not None and other.distribution == "ShardedByS3Key":
            raise DataError(
                f"channel {name!r} is ShardedByS3Key, but evaluation needs the whole set on every host: "
                f"use FullyReplicated for the {name!r} channel (only 'train' may be sharded)"
            )
    per_rank = distributed.all_gather((data.label_names, len(tokenized["train"])))
    labels = sorted({name for names, _ in per_rank for name in names}, key=_label_sort_key)
    if labels != data.label_names:
        remap = np.asarray([labels.index(name) for name in data.label_names])
        for split, ds in tokenized.items():
            tokenized[split] = ds.map(lambda b: {"labels": _remapped(b["labels"], remap, len(labels))}, batched=True)
        data.label_names[:] = labels
    rows = min(n for _, n in per_rank)
    if rows < len(tokenized["train"]):
        tokenized["train"] = tokenized["train"].select(range(rows))
    logger.info(
        "train channel is ShardedByS3Key: host %s trains on its own shard (%d rows used; shards hold %s)",
        contract.current_host,
        rows,
        sorted({n for _, n in per_rank}),
    )
    return distributed.host_ranks()


def _remapped(labels: list, remap: np.ndarray, count: int) -> list:
    """A batch's labels in the shared label map: class ids renumbered, each row's ids renumbered (multi-label's
    label ids, a tag id per token), or 0/1 vectors widened."""
    if labels and isinstance(labels[0], list) and (not labels[0] or isinstance(labels[0][0], int)):
        return [[int(remap[t]) if t >= 0 else t for t in tags] for tags in labels]  # label or tag ids
    values = np.asarray(labels)
    if values.ndim == 1:
        return remap[values].tolist()
    out = np.zeros((len(values), count), dtype=np.float32)
    out[:, remap] = values
    return out.tolist()


def _label_sort_key(name: str) -> tuple:
    return (0, int(name), "") if name.lstrip("-").isdigit() else (1, 0, name)
