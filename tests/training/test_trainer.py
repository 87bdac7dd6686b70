"""Pieces of the trainer: the length-bucket sampler, freezing, precision flags, model resolution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from byoc.training.hyperparameters import parse_hyperparameters
from byoc.training.model import ModelError, freeze_bottom, own_learning_rates
from byoc.training.samplers import LengthBucketSampler, length_order


def test_length_buckets_cover_every_row_once_with_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 80, size=1000).tolist()
    sampler = LengthBucketSampler(lengths, batch_size=16, seed=1)
    order = list(sampler)
    assert sorted(order) == list(range(1000)) and len(sampler) == 1000
    batches = [order[i : i + 16] for i in range(0, 1000, 16)]
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded / sum(lengths) < 1.05  # a global sort pads almost nothing
    assert len(batches[-1]) == 1000 % 16  # the partial batch stays last, so batch boundaries hold


def test_length_buckets_are_seeded_and_change_every_epoch():
    lengths = list(range(100)) * 3
    first, second = list(LengthBucketSampler(lengths, 8, 3)), list(LengthBucketSampler(lengths, 8, 3))
    assert first == second
    sampler = LengthBucketSampler(lengths, 8, 3)
    assert list(sampler) != list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_rows_of_two_texts_batch_rows_alike_in_both_lengths():
    """An embedding model's rows (a text and its pair, lengths unrelated): each text pads to its own longest in
    the batch, so sorting by the row's longest text alone pads both texts to about it."""
    rng = np.random.default_rng(0)
    pairs = rng.integers(5, 80, size=(1024, 2))

    def padded(sampler: LengthBucketSampler) -> int:
        order = list(sampler)
        assert sorted(order) == list(range(1024))
        batches = [order[i : i + 16] for i in range(0, 1024, 16)]
        return sum(len(b) * (pairs[b, 0].max() + pairs[b, 1].max()) for b in batches)

    by_both = padded(LengthBucketSampler(pairs.tolist(), batch_size=16, seed=1))
    by_longest = padded(LengthBucketSampler(pairs.max(axis=1).tolist(), batch_size=16, seed=1))
    assert by_both / pairs.sum() < 1.15 < by_longest / pairs.sum()
    # Two ranks still deal their parts of the same global batches.
    one = list(LengthBucketSampler(pairs.tolist(), batch_size=16, seed=1))
    two = list(LengthBucketSampler(pairs.tolist(), batch_size=8, seed=1, world_size=2))
    assert two == one


def test_length_order():
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [1], [1, 2]]})
    assert length_order(ds) == [1, 2, 0]


def test_freezing(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    freeze_bottom(model, embeddings=True, layers=1)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert all(n.startswith(("bert.embeddings.", "bert.encoder.layer.0.")) for n in frozen)
    assert any(n.startswith("bert.embeddings.word_embeddings") for n in frozen)
    assert any(n.startswith("bert.encoder.layer.0.") for n in frozen)
    assert all(
        p.requires_grad for n, p in model.named_parameters() if n.startswith(("bert.encoder.layer.1.", "classifier"))
    )
    with pytest.raises(ModelError, match="at most 1"):
        freeze_bottom(model, embeddings=True, layers=2)


def test_weights_with_a_learning_rate_of_their_own_get_groups_of_their_own_keeping_their_decay():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model.learning_rates = {"1.weight": 1e-3}
    decayed, plain = [model[0].weight, model[1].weight], [model[0].bias, model[1].bias]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": 0.01}, {"params": plain, "weight_decay": 0.0}], lr=5e-5
    )
    own_learning_rates(optimizer, model)
    groups = [([id(w) for w in g["params"]], g["lr"], g["weight_decay"]) for g in optimizer.param_groups]
    assert groups == [
        ([id(model[0].weight)], 5e-5, 0.01),
        ([id(model[0].bias), id(model[1].bias)], 5e-5, 0.0),
        ([id(model[1].weight)], 1e-3, 0.01),
    ]
    model.learning_rates = {}
    own_learning_rates(optimizer, model)  # (none: nothing moves)
    assert len(optimizer.param_groups) == 3


def test_cpu_jobs_tell_the_trainer_they_are_cpu_ones():
    from byoc.training.trainer import device_arguments

    auto, cpu = parse_hyperparameters({}), parse_hyperparameters({"device": "cpu"})
    assert device_arguments(auto, use_xla=False, cuda=False) == {"use_cpu": True}  # even with torch-xla installed
    on_gpu = device_arguments(auto, use_xla=False, cuda=True)
    assert on_gpu == {"use_cpu": False, "accelerator_config": {"non_blocking": True}}
    assert device_arguments(cpu, use_xla=False, cuda=True) == {"use_cpu": True}
    assert "use_cpu" not in device_arguments(auto, use_xla=True, cuda=False)


def test_precision_flags_reach_the_trainer_arguments():
    """TF32 is a CUDA setting: never passed on CPU (transformers raises for tf32=true without an Ampere GPU)."""
    from byoc.training.precision import Precision
    from byoc.training.trainer import precision_arguments

    tf32 = Precision("tf32", False, "auto", tf32=True)
    assert precision_arguments(tf32, cuda=True) == {"bf16": False, "fp16": False, "tf32": True}
    assert precision_arguments(Precision("fp32", False, "a CPU"), cuda=False) == {"bf16": False, "fp16": False}
    bf16 = Precision("bf16", True, "requested", tf32=True)
    assert precision_arguments(bf16, cuda=True) == {"bf16": True, "fp16": False, "tf32": True}
    assert precision_arguments(Precision("fp16", True, "t4"), cuda=True) == {"bf16": False, "fp16": True, "tf32": False}


def test_weight_decay_as_a_device_tensor_matches_adamw_exactly():
    """The XLA path applies AdamW's decoupled decay itself, with a tensor factor (see byoc.training.xla)."""
    from byoc.training.xla import decay_with_device_tensors

    stock, ours = (torch.nn.Parameter(torch.linspace(-1, 1, 5)) for _ in range(2))
    plain = torch.optim.AdamW([stock], lr=0.1, weight_decay=0.3)
    patched = torch.optim.AdamW([ours], lr=0.1, weight_decay=0.3)
    decay_with_device_tensors(patched)
    scheduler = torch.optim.lr_scheduler.LambdaLR(patched, lambda step: 1 - step / 5)
    reference = torch.optim.lr_scheduler.LambdaLR(plain, lambda step: 1 - step / 5)
    for _ in range(4):
        for optimizer, param, schedule in ((plain, stock, reference), (patched, ours, scheduler)):
            optimizer.zero_grad()
            (param * torch.arange(5.0)).pow(2).sum().backward()
            optimizer.step()
            schedule.step()
    assert torch.equal(stock.data, ours.data)
    assert patched.state_dict()["param_groups"][0]["byoc_weight_decay"] == 0.3


class _SavesFiles:
    """Stands in for a model/tokenizer: save_pretrained writes one named file."""

    def __init__(self, name: str) -> None:
        self.name, self.device = name, torch.device("cpu")
        self.model_max_length = 512  # a tokenizer's; the artifact records the length training used

    def save_pretrained(self, folder, **_) -> None:
        (folder / self.name).write_text("new")


def test_publish_replaces_what_a_killed_publish_left(tmp_path):
    from types import SimpleNamespace

    from byoc.training.artifact import publish_model

    code = tmp_path / "code"
    code.mkdir()
    (code / "inference.py").write_text("new")
    model_dir = tmp_path / "model"
    (model_dir / "code").mkdir(parents=True)  # a SIGKILL landed after code/ was moved in
    (model_dir / "code" / "inference.py").write_text("old")
    (model_dir / "config.json").write_text("old")

    publish_model(
        SimpleNamespace(model=_SavesFiles("config.json")),
        _SavesFiles("tokenizer.json"),
        code,
        model_dir,
        serving_graph=False,
    )

    assert sorted(p.name for p in model_dir.iterdir()) == ["code", "config.json", "tokenizer.json"]
    assert sorted(p.name for p in (model_dir / "code").iterdir()) == ["inference.py"]
    assert (model_dir / "code" / "inference.py").read_text() == "new"
    assert (model_dir / "config.json").read_text() == "new"


@pytest.mark.parametrize("task", ["multi_label_classification", "regression"])
def test_the_masked_loss_is_transformers_loss_and_skips_filler_rows(task, tiny_model_dir):
    """Where no row is filler, byoc's loss is the model's own; filler rows (IGNORE_LABEL) change nothing."""
    from transformers import AutoModelForSequenceClassification

    from byoc import tasks
    from byoc.training.trainer import masked_loss

    labels_count = 3 if task == "multi_label_classification" else 1
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=labels_count, problem_type=task
    ).eval()
    ids = torch.randint(5, 50, (4, 6))
    labels = torch.randint(0, 2, (4, 3)).float() if labels_count == 3 else torch.rand(4) * 5
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
        assert float(masked_loss(out.logits, labels, tasks.get(task))) == pytest.approx(float(out.loss), rel=1e-5)
        filler = torch.full_like(labels[:2], -100.0)
        padded_logits = torch.cat([out.logits, torch.full_like(out.logits[:2], 7.0)])
        padded = masked_loss(padded_logits, torch.cat([labels, filler]), tasks.get(task))
        assert float(padded) == pytest.approx(float(out.loss), rel=1e-5)


def test_fixed_shape_training_batches_hold_the_training_batch_size_and_evaluation_fills_up_its_own(job, tiny_model_dir):
    """The compiled path (XLA, torch_compile): each loader pads its batches to its own batch size. Training
    batches used to be filled up to the evaluation's 64 rows: every step paid for 64 rows whatever the batch
    size (2x at the default 32), and an embedding job's in-batch negatives included the filler rows."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from byoc.contract import read_training_contract
    from byoc.training.trainer import build_trainer

    job.resources().hyperparameters({})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = [f"row {i} " + "word " * (i % 5) for i in range(40)]

    def tokenized(n: int) -> Dataset:
        encoded = tokenizer(texts[:n])
        return Dataset.from_dict({**encoded, "labels": [i % 2 for i in range(n)]})

    args = parse_hyperparameters(
        {"per_device_train_batch_size": "4", "per_device_eval_batch_size": "16", "device": "cpu"}
    )
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    trainer = build_trainer(
        model,
        tokenizer,
        {"train": tokenized(40), "eval": tokenized(20)},
        args,
        read_training_contract(),
        ["negative", "positive"],
        buckets=[8, 16],
    )
    assert {batch["input_ids"].shape[0] for batch in trainer.get_train_dataloader()} == {4}
    rows = [batch["input_ids"].shape[0] for batch in trainer.get_eval_dataloader()]
    assert rows == [16, 16]  # 20 rows: the second batch is 4 rows and 12 filler rows
    labels = [batch["labels"] for batch in trainer.get_eval_dataloader()][-1]
    assert int((labels == -100).sum()) == 12
