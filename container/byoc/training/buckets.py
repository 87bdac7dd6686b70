"""Fixed-shape buckets for compiled backends (XLA / Neuron): few shapes, little padding.

A compiler such as Neuron's builds one graph per input shape, in minutes each; the tutorials
therefore pad every example to 128 or 512 tokens, and on tweets (~25 tokens) most of the compute
is padding. Here the sequence lengths are padded up to one of a few bucket sizes, chosen from the
data's own length distribution to waste as little as possible, and every batch has the same
number of rows: the number of distinct shapes is at most the number of buckets.

- `choose_buckets`: the bucket sizes that minimise padded tokens (exact, by dynamic programming
  over lengths rounded up to a multiple of 8).
- `bucket_batches`: fixed-size batches, each within one bucket; a bucket's leftover rows move up
  to the next bucket (shorter rows pad fine to a longer size) and the last leftovers are dropped
  (training) or kept as a final short batch the caller pads (evaluation).
- `padding_efficiency`: real tokens / padded tokens, the figure to report.
- `FixedShapeCollator`: pads each batch to its bucket, and a short (last evaluation) batch to
  the full batch size with rows labelled -100 that the loss and the metrics ignore.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from byoc.tasks import IGNORE_LABEL
from byoc.training.arguments import TrainArguments, bucket_sizes

logger = logging.getLogger(__name__)

MULTIPLE = 8  # compilers and matrix units like sizes in multiples of 8


def _round_up(n: int, multiple: int = MULTIPLE) -> int:
    return max(multiple, -(-int(n) // multiple) * multiple)


def choose_buckets(lengths: Sequence[int], max_buckets: int = 5, max_length: int = 512) -> list[int]:
    """At most `max_buckets` sizes (ascending, the last covering the longest row, none above
    `max_length`) that minimise the total number of padded tokens."""
    if not len(lengths):
        raise ValueError("choose_buckets needs at least one length")
    if max_buckets < 1:
        raise ValueError("max_buckets must be at least 1")
    rounded = np.minimum([_round_up(n) for n in lengths], max_length)
    sizes, counts = np.unique(rounded, return_counts=True)
    n, k = len(sizes), min(max_buckets, len(sizes))
    # cost[i][j]: padded tokens when sizes[i..j] all pad to sizes[j]
    prefix = np.concatenate([[0], np.cumsum(counts)])
    best = np.full((k + 1, n), np.inf)
    choice = np.zeros((k + 1, n), dtype=int)
    for j in range(n):  # one bucket covering sizes[0..j]
        best[1][j] = sizes[j] * prefix[j + 1]
    for b in range(2, k + 1):
        for j in range(n):
            for i in range(j):  # the last bucket covers sizes[i+1..j]
                cost = best[b - 1][i] + sizes[j] * (prefix[j + 1] - prefix[i + 1])
                if cost < best[b][j]:
                    best[b][j], choice[b][j] = cost, i
    b = int(np.argmin(best[1:, n - 1])) + 1
    out, j = [], n - 1
    while b >= 1:
        out.append(int(sizes[j]))
        if b == 1:
            break
        j, b = choice[b][j], b - 1
    return sorted(out)


def bucket_of(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `length` (the largest one truncates longer rows)."""
    i = bisect.bisect_left(buckets, length)
    return buckets[min(i, len(buckets) - 1)]


def padding_efficiency(lengths: Sequence[int], buckets: Sequence[int]) -> float:
    """Real tokens / padded tokens when every row is padded to its bucket."""
    real = sum(min(n, buckets[-1]) for n in lengths)
    return real / sum(bucket_of(n, buckets) for n in lengths)


def bucket_batches(
    lengths: Sequence[int], buckets: Sequence[int], batch_size: int, seed: int, epoch: int, drop_last: bool = True
) -> list[list[int]]:
    """Batches of exactly `batch_size` row indices, each batch within one bucket, in random order.

    Rows are shuffled within their bucket; each bucket's leftovers join the next larger bucket.
    The largest bucket's leftovers are dropped when `drop_last`, else returned as a final short
    batch (evaluation must see every row; the caller pads that batch to the full size).
    """
    rng = np.random.default_rng((seed, epoch))
    by_bucket: dict[int, list[int]] = {b: [] for b in buckets}
    for index, n in enumerate(lengths):
        by_bucket[bucket_of(n, buckets)].append(index)
    batches: list[list[int]] = []
    carry: list[int] = []
    for size in buckets:
        rows = carry + [int(i) for i in rng.permutation(by_bucket[size])]
        full = len(rows) // batch_size * batch_size
        batches += [rows[i : i + batch_size] for i in range(0, full, batch_size)]
        carry = rows[full:]
    order = rng.permutation(len(batches))
    batches = [batches[i] for i in order]
    if carry and not drop_last:
        batches.append(carry)
    return batches


class FixedShapeCollator:
    """Tokenized rows -> tensors of shape (batch_rows, bucket): few shapes, so few compiled graphs.

    Every batch is padded to the smallest bucket that holds its longest row; a batch shorter than
    `batch_rows` (the last one of an evaluation) is filled up with one-token rows labelled
    `IGNORE_LABEL`, which the loss skips and the metrics drop.
    """

    def __init__(self, pad_token_id: int, buckets: Sequence[int], batch_rows: int) -> None:
        self.pad_token_id, self.buckets, self.batch_rows = pad_token_id, list(buckets), batch_rows

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        # An embedding model's rows hold several texts (token columns prefixed pair_, negative_): all of
        # them padded to the bucket of the longest.
        prefixes = [key.removesuffix("input_ids") for key in features[0] if key.endswith("input_ids")]
        width = bucket_of(max(len(f[p + "input_ids"]) for f in features for p in prefixes), self.buckets)
        rows = max(len(features), self.batch_rows)
        batch: dict[str, torch.Tensor] = {}
        for key in (p + k for p in prefixes for k in ("input_ids", "attention_mask", "token_type_ids")):
            if key not in features[0]:
                continue
            tensor = torch.full((rows, width), self.pad_token_id if key.endswith("input_ids") else 0, dtype=torch.long)
            for i, feature in enumerate(features):
                values = feature[key][:width]
                tensor[i, : len(values)] = torch.as_tensor(values, dtype=torch.long)
            batch[key] = tensor
        for prefix in prefixes:
            if prefix + "attention_mask" in batch:
                batch[prefix + "attention_mask"][len(features) :, 0] = 1  # filler rows attend to their one token
        if "labels" in features[0]:
            batch["labels"] = _labels(features, rows, width)
        return batch


def _labels(features: list[dict[str, Any]], rows: int, width: int) -> torch.Tensor:
    """The batch's labels, filler rows at IGNORE_LABEL: class ids (long); a tag id per token (token
    classification: padded to `width` with IGNORE_LABEL); or float targets and 0/1 vectors (regression,
    multi-label: the masked loss of byoc.training.trainer skips those rows)."""
    first = features[0]["labels"]
    if isinstance(first, list) and (not first or isinstance(first[0], int)):
        tags = torch.full((rows, width), IGNORE_LABEL, dtype=torch.long)
        for i, feature in enumerate(features):
            values = feature["labels"][:width]
            tags[i, : len(values)] = torch.as_tensor(values, dtype=torch.long)
        return tags
    if isinstance(first, int):
        labels = torch.full((rows,), IGNORE_LABEL, dtype=torch.long)
        labels[: len(features)] = torch.as_tensor([int(f["labels"]) for f in features], dtype=torch.long)
        return labels
    values = torch.as_tensor([f["labels"] for f in features], dtype=torch.float32)
    filled = torch.full((rows, *values.shape[1:]), float(IGNORE_LABEL), dtype=torch.float32)
    filled[: len(features)] = values
    return filled


def choose_job_buckets(tokenized: dict[str, Any], args: TrainArguments, use_xla: bool) -> list[int]:
    """The compiled path's sequence-length buckets: as given, or chosen from the training data's lengths."""
    lengths = tokenized["train"]["length"]
    buckets = bucket_sizes(args) or choose_buckets(lengths, args.max_buckets, args.max_length)
    logger.info(
        "%s: sequence buckets %s (padding efficiency %.3f: real tokens / padded tokens; one length of %d "
        "would give %.3f)",
        "XLA" if use_xla else "torch.compile",
        buckets,
        padding_efficiency(lengths, buckets),
        args.max_length,
        padding_efficiency(lengths, [args.max_length]),
    )
    return buckets
