"""A merged batch's forward passes in the default predict_fn: how it is cut, and padded to which shapes.

A batch is sorted by length and cut into forward passes of a bounded padded size. On the CPU each
pass pads exactly to its longest text, in passes of at most 256 padded tokens: small passes pad
least, and the CPU's time grows with every padded token.

On a GPU a pass costs about the same for 16 tokens as for 64 (it is bound by kernel launches, not
arithmetic), so passes are larger (up to 128 rows, 16384 padded tokens) and padded to a few shapes:
the length up to the next of 16, 32, 48, 64, 96, 128, 192, 256, 384, 512 (then multiples of 256,
never past the model's limit), the rows up to the next power of two. Kernels (and cuBLAS's choices,
ONNX Runtime's memory blocks) are reused across batches, and each shape can be one captured CUDA
graph (BYOC_INFERENCE_COMPILE=1 on torch). Filler rows are one padding token each, attended to, so
that no row is fully masked; their answers are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class PassPlan:
    """How one merged batch becomes forward passes."""

    token_budget: int = 256  # padded tokens per pass (rows x padded length)
    max_rows: int = 64
    bucketed: bool = False  # pad to the few shapes above (GPU), or exactly (CPU)
    max_length: int = 512  # the model's limit: no bucket is longer

    def length(self, n: int) -> int:
        """The padded length of a pass whose longest row has n tokens."""
        if not self.bucketed:
            return n
        limit = max(n, self.max_length)
        bucket = next((b for b in LENGTHS if b >= n), -(-n // 256) * 256)
        return min(bucket, limit)

    def rows(self, n: int) -> int:
        """The padded row count of a pass of n rows."""
        if not self.bucketed:
            return n
        return min(1 << max(0, n - 1).bit_length(), max(n, self.max_rows))

    def all(self) -> list[tuple[int, int]]:
        """Every (rows, length) a bucketed pass can take, smallest first."""
        lengths = sorted({self.length(n) for n in range(1, self.max_length + 1)})
        rows = sorted({self.rows(n) for n in range(1, self.max_rows + 1)})
        return [(r, w) for w in lengths for r in rows if r * w <= max(self.token_budget, w)]


CPU = PassPlan()


def gpu(max_length: int) -> PassPlan:
    return PassPlan(token_budget=16384, max_rows=128, bucketed=True, max_length=max_length)


def batches(order: list[int], encoded: list[dict[str, list[int]]], plan: PassPlan = CPU) -> list[list[int]]:
    """Consecutive (length-sorted) rows while rows x padded longest stays within the token budget."""
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:
        length = plan.length(len(encoded[i]["input_ids"]))
        if current and (plan.rows(len(current) + 1) * length > plan.token_budget or len(current) >= plan.max_rows):
            out.append(current)
            current = []
        current.append(i)
    return out + ([current] if current else [])


def pad(
    rows: list[int], encoded: list[dict[str, list[int]]], pad_id: int, plan: PassPlan = CPU
) -> dict[str, np.ndarray]:
    """One pass's arrays: rows in order, then filler rows, padded to the pass's (bucketed) shape."""
    width = plan.length(max(len(encoded[i]["input_ids"]) for i in rows))
    height = plan.rows(len(rows))
    batch = {
        key: np.full((height, width), pad_id if key == "input_ids" else 0, dtype=np.int64) for key in encoded[rows[0]]
    }
    for row, i in enumerate(rows):
        for key, values in encoded[i].items():
            batch[key][row, : len(values)] = values
    if height > len(rows) and "attention_mask" in batch:
        batch["attention_mask"][len(rows) :, 0] = 1  # a filler row attends to its one token: never all masked
    return batch


def run(encoded: list[dict[str, list[int]]], model: Mapping[str, Any], transform: Any) -> list[np.ndarray]:
    """Each input's output, in input order: the inputs sorted by length, cut into passes (`model["passes"]`,
    the CPU's plan by default), each pass padded, run (`model["logits"]`) and its output put through
    `transform` (a task's `scores`: a softmax...). An output with a row per token is cut to its input's
    tokens."""
    plan = model.get("passes", CPU)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["input_ids"]))
    out: list[Any] = [None] * len(encoded)
    for chunk in batches(order, encoded, plan):
        result = transform(model["logits"](pad(chunk, encoded, model["pad_id"], plan)))
        for n, i in enumerate(chunk):
            out[i] = result[n] if result.ndim < 3 else result[n, : len(encoded[i]["input_ids"])]
    return out
