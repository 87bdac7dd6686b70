"""Batch samplers: length-bucketed dynamic batches (CPU, CUDA) and fixed-shape batches (XLA), both
dealing each rank its part of the same global batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import datasets
import numpy as np
import torch

from byoc.training.buckets import bucket_batches, bucket_of


def length_order(dataset: datasets.Dataset) -> list[int]:
    """Row indices, shortest text first: evaluation batches then pad little (metrics ignore order)."""
    lengths = [len(ids) for ids in dataset["input_ids"]]
    return sorted(range(len(lengths)), key=lengths.__getitem__)


class LengthBucketSampler(torch.utils.data.Sampler):
    """Batches of (nearly) equal length in random order: the least padding dynamic batches can have.

    Each epoch, rows are sorted by length with random tie-breaking and cut into global batches
    (`batch_size` per consuming rank), and the global batches are shuffled. Indices come out
    rank-batch after rank-batch, so the DataLoader's consecutive slicing yields exactly these
    batches, and accelerate's sharding (rank r takes every world_size-th batch) hands rank r its
    part of each global batch: N ranks with batch B train on the same global batches as one
    process with batch N*B. Compared with transformers' `LengthGroupedSampler` (sorted only within
    mega-batches of 50 batches) it feeds about 8% fewer padding tokens on tweets.

    `consumers` are the global ranks reading this data: all of them, unless each host holds its
    own shard (ShardedByS3Key), when only this host's ranks do; the other ranks' slots are filled
    with a copy that they never read. With one rank the final partial batch is kept; with more it
    is dropped, as every rank must run the same number of equal steps.
    """

    def __init__(
        self,
        lengths: Sequence[Any],
        batch_size: int,
        seed: int,
        world_size: int = 1,
        consumers: list[int] | None = None,
    ) -> None:
        given = np.asarray(lengths, dtype=np.float64)
        # Rows of several texts (an embedding model's: a text, its pair...) give a length per text; each text
        # pads to its own longest in the batch, so batches group rows alike in every text's length.
        self.groups = given if given.ndim == 2 and given.shape[1] > 1 else None
        self.lengths = given.max(axis=1) if given.ndim == 2 else given  # a row's longest text
        self.batch_size, self.seed, self.epoch = batch_size, seed, 0
        self.world_size = world_size
        self.consumers = list(consumers) if consumers is not None else list(range(world_size))
        self.global_batch = batch_size * len(self.consumers)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.world_size == 1:
            return len(self.lengths)
        return len(self.lengths) // self.global_batch * self.batch_size * self.world_size

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng((self.seed, self.epoch))
        batches, leftover = self._global_batches(rng)
        self.epoch += 1
        if self.world_size == 1:
            return iter([int(i) for i in np.concatenate([batches.reshape(-1), leftover])])
        out: list[int] = []
        for batch in batches:
            parts = batch.reshape(len(self.consumers), self.batch_size)
            for r in range(self.world_size):
                part = parts[self.consumers.index(r)] if r in self.consumers else parts[0]
                out.extend(int(i) for i in part)
        return iter(out)

    def _global_batches(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's global batches (rows of `global_batch` indices) and the rows left over."""
        if self.groups is not None:
            order = self._order_of_groups(rng)
        else:
            order = np.argsort(self.lengths + rng.random(len(self.lengths)), kind="stable")
        full = len(order) // self.global_batch * self.global_batch
        batches = order[:full].reshape(-1, self.global_batch)[rng.permutation(full // self.global_batch)]
        return batches, order[full:]

    def _order_of_groups(self, rng: np.random.Generator) -> np.ndarray:
        """Rows by their first text's length, then, within runs of GROUP_RUN global batches, by their other
        texts' longest: every text of a batch close in length to the others' (sorting by a row's longest text
        alone left a fifth more padding on pairs of tweets: docs/benchmarks.md)."""
        assert self.groups is not None
        order = np.argsort(self.groups[:, 0] + rng.random(len(self.groups)), kind="stable")
        others = self.groups[:, 1:].max(axis=1)
        run = self.global_batch * GROUP_RUN
        for start in range(0, len(order), run):
            part = order[start : start + run]
            order[start : start + run] = part[np.argsort(others[part] + rng.random(len(part)), kind="stable")]
        return order


GROUP_RUN = 8  # global batches whose rows are sorted again by their other texts' lengths


class FixedShapeSampler(LengthBucketSampler):
    """Batches for compiled backends (XLA / NeuronCores): every global batch lies within one of a
    few bucket sizes and holds exactly `batch_size` rows per rank, so each batch pads to a bucket
    and the shapes a compiler sees are at most the buckets. Leftover rows move up to the next
    bucket; the last bucket's leftovers (fewer than one global batch) sit out that epoch."""

    def __init__(
        self,
        lengths: Sequence[Any],
        buckets: list[int],
        batch_size: int,
        seed: int,
        world_size: int = 1,
        consumers: list[int] | None = None,
        one_per_shape: bool = False,
    ) -> None:
        super().__init__(lengths, batch_size, seed, world_size, consumers)
        self.buckets = list(buckets)
        self.one_per_shape = one_per_shape  # precompiling: one batch of each shape is all the compiler needs

    def __len__(self) -> int:
        batches = len(self.shapes()) if self.one_per_shape else len(self.lengths) // self.global_batch
        return batches * self.batch_size * self.world_size

    def shapes(self) -> list[int]:
        """The bucket sizes training batches take (the same every epoch: leftovers always move up)."""
        lengths = self.lengths.astype(int).tolist()
        batches = bucket_batches(lengths, self.buckets, self.global_batch, self.seed, 0)
        return sorted({bucket_of(max(lengths[i] for i in batch), self.buckets) for batch in batches})

    def _global_batches(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        lengths = self.lengths.astype(int).tolist()
        batches = bucket_batches(lengths, self.buckets, self.global_batch, self.seed, self.epoch)
        if batches:
            # The epoch's last step compiles together with the epoch-end work into a graph of its own:
            # ending every epoch on the same (largest) bucket keeps that graph the same epoch after epoch.
            shapes = [bucket_of(max(lengths[i] for i in batch), self.buckets) for batch in batches]
            if self.one_per_shape:
                batches = [batches[shapes.index(size)] for size in sorted(set(shapes))]
            else:
                # The first step also creates the optimizer state (a graph of its own): taking it from
                # the commonest shape leaves every shape's ordinary step to compile in epoch 1.
                first = shapes.index(max(set(shapes), key=shapes.count))
                last = max(range(len(shapes)), key=lambda i: (shapes[i], i != first))
                rest = [b for i, b in enumerate(batches) if i not in (first, last)]
                batches = [batches[first], *rest, batches[last]] if first != last else [batches[first], *rest]
        return np.asarray(batches, dtype=np.int64).reshape(-1, self.global_batch), np.zeros(0, dtype=np.int64)
