"""Fixed-shape buckets (for XLA/Neuron): exact bucket choice, bounded shapes, padding efficiency."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from byoc.training.buckets import bucket_batches, bucket_of, choose_buckets, padding_efficiency
from helpers import shared_data


def padded_tokens(lengths, buckets):
    return sum(bucket_of(n, buckets) for n in lengths)


def test_the_chosen_buckets_are_the_best_possible():
    rng = np.random.default_rng(0)
    lengths = list(rng.integers(3, 120, size=300))
    sizes = sorted({-(-n // 8) * 8 for n in lengths})
    for k in (1, 2, 3):
        best = min(padded_tokens(lengths, list(c) + [sizes[-1]]) for c in itertools.combinations(sizes[:-1], k - 1))
        chosen = choose_buckets(lengths, max_buckets=k, max_length=512)
        assert len(chosen) <= k and chosen[-1] == sizes[-1]
        assert padded_tokens(lengths, chosen) == best


def test_buckets_respect_max_length_and_bad_input_is_refused():
    assert choose_buckets([10, 300, 700], max_buckets=3, max_length=512)[-1] == 512
    assert bucket_of(900, [32, 512]) == 512  # longer rows are truncated to the largest bucket
    with pytest.raises(ValueError, match="at least one length"):
        choose_buckets([])


def test_batches_have_one_size_and_few_shapes():
    rng = np.random.default_rng(1)
    lengths = list(rng.integers(3, 200, size=1003))
    buckets = choose_buckets(lengths, max_buckets=4)
    batches = bucket_batches(lengths, buckets, batch_size=16, seed=42, epoch=0)
    assert all(len(b) == 16 for b in batches)
    shapes = {bucket_of(max(lengths[i] for i in b), buckets) for b in batches}
    assert shapes <= set(buckets)
    seen = [i for b in batches for i in b]
    assert len(seen) == len(set(seen)) and len(lengths) - len(seen) < 16  # at most one partial batch dropped
    everything = bucket_batches(lengths, buckets, batch_size=16, seed=42, epoch=0, drop_last=False)
    assert sorted(i for b in everything for i in b) == list(range(len(lengths)))
    assert bucket_batches(lengths, buckets, 16, 42, 1) != batches  # a new order each epoch
    assert bucket_batches(lengths, buckets, 16, 42, 0) == batches  # and the same order on resume


def test_padding_efficiency_on_emotion_beats_the_tutorial_recipes():
    from transformers import AutoTokenizer

    from byoc.training.model import bundled_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_dir()))
    lines = (shared_data.folder("emotion") / "train.txt").read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.rsplit(";", 1)[0] for line in lines if line.strip()]
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=512)["input_ids"]]
    buckets = choose_buckets(lengths, max_buckets=5)
    ours = padding_efficiency(lengths, buckets)
    assert ours >= 0.75, (buckets, ours)
    assert padding_efficiency(lengths, [128]) < 0.25 and padding_efficiency(lengths, [512]) < 0.06


# --- the fixed-shape sampler and collator (the XLA path's batches) -------------------------------


def test_fixed_shape_sampler_gives_full_batches_within_one_bucket():
    from byoc.training.samplers import FixedShapeSampler

    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.integers(4, 70, size=203)]
    buckets = choose_buckets(lengths, max_buckets=3)
    for world_size in (1, 2):
        sampler = FixedShapeSampler(lengths, buckets, batch_size=8, seed=1, world_size=world_size)
        epochs = [list(sampler) for _ in range(2)]
        for order in epochs:
            assert len(order) == len(sampler) == 203 // (8 * world_size) * 8 * world_size
            global_batches = [order[i : i + 8 * world_size] for i in range(0, len(order), 8 * world_size)]
            for batch in global_batches:
                # the whole global batch pads to one bucket, so every rank's part shares a shape set
                assert len({bucket_of(max(lengths[i] for i in batch), buckets)}) == 1
                assert all(
                    bucket_of(lengths[i], buckets) <= bucket_of(max(lengths[j] for j in batch), buckets) for i in batch
                )
            assert len(set(order)) == len(order)  # no row twice in an epoch
        assert epochs[0] != epochs[1]  # a new order every epoch
        # every epoch starts on the commonest shape (the optimizer-state step) and ends on the same
        # (largest) one (the epoch-end graph): both compile once
        shape_of = [
            bucket_of(max(lengths[i] for i in order[k : k + 8 * world_size]), buckets)
            for order in epochs[:1]
            for k in range(0, len(order), 8 * world_size)
        ]
        assert shape_of[0] == max(set(shape_of), key=shape_of.count)
        last = [bucket_of(max(lengths[i] for i in order[-8 * world_size :]), buckets) for order in epochs]
        assert (
            last[0]
            == last[1]
            == max(
                bucket_of(max(lengths[i] for i in order[k : k + 8 * world_size]), buckets)
                for order in epochs
                for k in range(0, len(order), 8 * world_size)
            )
        )
        again = FixedShapeSampler(lengths, buckets, batch_size=8, seed=1, world_size=world_size)
        assert list(again) == epochs[0]  # reproducible from the seed


def test_fixed_shape_collator_pads_to_the_bucket_and_fills_short_batches():
    import torch

    from byoc.tasks import IGNORE_LABEL
    from byoc.training.buckets import FixedShapeCollator

    collate = FixedShapeCollator(pad_token_id=0, buckets=[8, 16, 32], batch_rows=4)
    rows = [
        {
            "input_ids": [101] + [5] * n + [102],
            "attention_mask": [1] * (n + 2),
            "token_type_ids": [0] * (n + 2),
            "labels": n % 3,
        }
        for n in (3, 9)
    ]
    batch = collate(rows)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (4, 16),
        "attention_mask": (4, 16),
        "token_type_ids": (4, 16),
        "labels": (4,),
    }
    assert batch["labels"].tolist() == [0, 0, IGNORE_LABEL, IGNORE_LABEL]
    assert batch["attention_mask"][1].sum() == 11 and batch["attention_mask"][2].tolist() == [1] + [0] * 15
    assert batch["input_ids"][0, :5].tolist() == [101, 5, 5, 5, 102] and batch["input_ids"][0, 5:].eq(0).all()
    # a full batch keeps its rows; a row longer than the last bucket is cut to it
    full = collate(rows * 2)
    assert full["input_ids"].shape == (4, 16)
    long = collate([{"input_ids": list(range(40)), "attention_mask": [1] * 40, "labels": 1}])
    assert long["input_ids"].shape == (4, 32) and long["input_ids"][0].tolist() == list(range(32))
    assert torch.equal(long["labels"], torch.tensor([1, IGNORE_LABEL, IGNORE_LABEL, IGNORE_LABEL]))


def test_float_labels_fill_up_with_the_ignore_label():
    """Multi-label vectors and regression targets stay floats; filler rows are IGNORE_LABEL (-100)."""
    from byoc.tasks import IGNORE_LABEL
    from byoc.training.buckets import FixedShapeCollator

    collate = FixedShapeCollator(0, [8], batch_rows=3)
    rows = [{"input_ids": [1, 2], "attention_mask": [1, 1], "labels": [1.0, 0.0]}]
    batch = collate(rows)
    assert batch["labels"].tolist() == [[1.0, 0.0], [IGNORE_LABEL, IGNORE_LABEL], [IGNORE_LABEL, IGNORE_LABEL]]
    target = collate([{"input_ids": [1], "attention_mask": [1], "labels": 2.5}])["labels"]
    assert target.dtype.is_floating_point and target.tolist() == [2.5, IGNORE_LABEL, IGNORE_LABEL]


def test_token_labels_pad_to_the_bucket_with_the_ignore_label():
    from byoc.tasks import IGNORE_LABEL
    from byoc.training.buckets import FixedShapeCollator

    collate = FixedShapeCollator(0, [4, 8], batch_rows=2)
    batch = collate([{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "labels": [IGNORE_LABEL, 3, IGNORE_LABEL]}])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 4)
    assert batch["labels"].tolist() == [[IGNORE_LABEL, 3, IGNORE_LABEL, IGNORE_LABEL], [IGNORE_LABEL] * 4]


def test_multi_label_ids_become_0_1_rows_batch_by_batch():
    """The data holds each row's label ids (memory as the positive labels, not rows x labels); a batch's
    rows become 0/1 vectors here, filler rows of a fixed-shape batch IGNORE_LABEL, under either collator."""
    from transformers import AutoTokenizer, DataCollatorWithPadding

    from byoc.tasks import IGNORE_LABEL
    from byoc.tasks.multi_label import MultiHot
    from byoc.training.buckets import FixedShapeCollator

    rows = [
        {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "labels": [0, 4]},
        {"input_ids": [1, 2], "attention_mask": [1, 1], "labels": []},
    ]
    fixed = MultiHot(FixedShapeCollator(0, [8], batch_rows=3), num_labels=5)(rows)
    assert fixed["input_ids"].shape == (3, 8)
    assert fixed["labels"].tolist() == [[1, 0, 0, 0, 1], [0] * 5, [IGNORE_LABEL] * 5]
    assert rows[0]["labels"] == [0, 4]  # the dataset's rows are left as they were
    tokenizer = AutoTokenizer.from_pretrained(str(shared_tokenizer()))
    padded = MultiHot(DataCollatorWithPadding(tokenizer), num_labels=5)(rows)
    assert padded["input_ids"].shape == (2, 3) and padded["labels"].tolist() == [[1, 0, 0, 0, 1], [0] * 5]


def shared_tokenizer():
    from byoc.training.model import bundled_model_dir

    return bundled_model_dir()


def test_rows_of_several_texts_pad_every_text_to_the_bucket_of_the_longest():
    """An embedding model's rows (a text and its pair): one shape for both, filler rows in each group."""
    import torch

    from byoc.tasks import IGNORE_LABEL
    from byoc.training.buckets import FixedShapeCollator

    collate = FixedShapeCollator(pad_token_id=0, buckets=[4, 8], batch_rows=3)
    rows = [
        {
            "input_ids": [5, 6],
            "attention_mask": [1, 1],
            "pair_input_ids": [7, 8, 9, 10, 11],
            "pair_attention_mask": [1] * 5,
            "labels": float("nan"),
        },
        {
            "input_ids": [5],
            "attention_mask": [1],
            "pair_input_ids": [7, 8],
            "pair_attention_mask": [1, 1],
            "labels": float("nan"),
        },
    ]
    batch = collate(rows)
    assert batch["input_ids"].shape == batch["pair_input_ids"].shape == (3, 8)  # the pair's 5 tokens: bucket 8
    assert batch["pair_input_ids"][0, :5].tolist() == [7, 8, 9, 10, 11] and batch["input_ids"][0, 2:].sum() == 0
    for key in ("attention_mask", "pair_attention_mask"):
        assert batch[key][2].tolist() == [1, 0, 0, 0, 0, 0, 0, 0]  # the filler row attends to one token
    assert batch["labels"][2] == IGNORE_LABEL and torch.isnan(batch["labels"][:2]).all()
