"""Padding-free steps (`packing`): the plan, the packed forward equal to the padded one in every family that packs
(outputs and gradients), the families that do not, the choice per device, and a real job that packs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from architectures import ARCHITECTURES, config_of

from byoc.training import packing
from byoc.training.arguments import HyperparameterError
from helpers import (
    CPU_ONLY,
    build_job,
    losses,
    run_train_process,
    sentiment_rows,
    topic_rows,
    write_csv,
    write_jsonl,
)

# The families whose packed forward equals the padded one, by transformers' major version: DistilBERT in 4.55 takes
# no position ids; DeBERTa multiplies its embeddings by the mask; ModernBERT's local layers build their window from
# it; Qwen3 is causal.
PACKS = {"bert", "electra", "roberta", "xlm-roberta"} | (
    {"distilbert"} if int(transformers.__version__.split(".")[0]) >= 5 else set()
)


def test_a_plan_puts_short_texts_together_and_restarts_their_positions():
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=bool)  # lengths 4, 2, 3
    layout = packing.plan(mask)
    assert layout is not None and (layout.rows, layout.length) == (2, 5)
    segment, position = layout.segment.reshape(2, 5), layout.position.reshape(2, 5)
    assert segment[0].tolist()[:4] == [0, 0, 0, 0] and segment[0, 4] < 0  # the longest alone, one pad
    assert segment[1].tolist() == [2, 2, 2, 1, 1]  # 3 then 2 tokens: full
    assert position[1].tolist() == [0, 1, 2, 0, 1]
    # every real token comes back to its own padded slot, every pad to the zero slot
    slots = np.arange(15)  # the padded batch's
    assert (layout.source[layout.back[mask.reshape(-1)]] == slots[mask.reshape(-1)]).all()
    assert (layout.back[~mask.reshape(-1)] == 10).all()  # 2 rows x 5: slot 10 is the zero slot


def test_no_plan_where_no_two_texts_fit_one_row():
    """Length-grouped batches (texts of nearly one length) run the plain forward: nothing to gain."""
    assert packing.plan(np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=bool)) is None


def test_left_padded_texts_pack_by_their_real_tokens():
    mask = np.array([[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], dtype=bool)
    layout = packing.plan(mask)
    assert layout is not None and layout.rows == 3  # 4 | 3 + 1 | 2
    ids = torch.arange(16).view(4, 4)
    packed = packing.pack(ids, layout, torch.from_numpy(layout.source), fill=-1)
    assert sorted(packed[packed >= 0].tolist()) == sorted(ids[torch.from_numpy(mask)].tolist())
    back = packing.unpack(packed.view(3, 4, 1).float(), torch.from_numpy(layout.back), 4)[..., 0]
    assert torch.equal(back[torch.from_numpy(mask)], ids[torch.from_numpy(mask)].float())
    assert (back[~torch.from_numpy(mask)] == 0).all()


def _batch(vocab: int, types: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Eight texts of 2 to 12 tokens, padded to 12: packs into fewer rows."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [12, 3, 7, 2, 5, 9, 4, 6]
    mask = torch.tensor([[1] * n + [0] * (12 - n) for n in lengths])
    batch = {"input_ids": torch.randint(10, vocab, (8, 12), generator=generator) * mask, "attention_mask": mask}
    if types:
        batch["token_type_ids"] = (torch.arange(12) >= 2).long().expand(8, 12) * mask
    return batch


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("head", ["sequence", "token"])
def test_a_packed_step_equals_the_padded_one(name, head):
    """Logits at every real token and every weight's gradient, packed against padded, in training mode (dropout
    off, so that both draw nothing); the families that do not pack are found so and keep their own forward."""
    config = config_of(name, 400, 0)
    for attribute, value in config.to_dict().items():  # (4.55's attention takes its dropout from the config)
        if "dropout" in attribute and isinstance(value, float):
            setattr(config, attribute, 0.0)
    config.num_labels = 3
    kind = (
        transformers.AutoModelForSequenceClassification
        if head == "sequence"
        else transformers.AutoModelForTokenClassification
    )
    torch.manual_seed(0)
    padded = kind.from_config(config).train()
    packed = kind.from_config(config).train()
    packed.load_state_dict(padded.state_dict())
    for module in (*padded.modules(), *packed.modules()):
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # (both models train, drawing nothing)
    installed = packing.attach(packed, "auto")
    if name not in PACKS:
        assert installed is None and "forward" not in packing.base_of(packed).__dict__
        return
    assert installed is not None
    batch = _batch(400, types=getattr(config, "type_vocab_size", 0) > 1)
    with torch.autocast("cpu", enabled=False):
        outputs = [model(**batch).logits for model in (padded, packed)]
    assert installed.packed_steps == 1
    real = batch["attention_mask"].bool()
    if head == "token":
        outputs = [output[real] for output in outputs]
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
    for output in outputs:
        output.square().sum().backward()
    grads = [dict(model.named_parameters()) for model in (padded, packed)]
    for weight, parameter in grads[0].items():
        if parameter.grad is not None:
            torch.testing.assert_close(grads[1][weight].grad, parameter.grad, rtol=1e-3, atol=1e-5, msg=weight)
    packed.eval()
    with torch.no_grad():
        evaluated = packed(**batch).logits
    assert installed.steps == 1, "an evaluation runs the model's own forward"
    assert evaluated.shape[0] == 8
    packing.detach(installed)
    assert "forward" not in packing.base_of(packed).__dict__


def test_packing_true_on_a_model_that_does_not_pack_is_refused_by_name():
    model = transformers.AutoModel.from_config(config_of("qwen3", 400, 0))
    with pytest.raises(HyperparameterError, match="packing=true: Qwen3Model does not pack.*packing=false"):
        packing.attach(model, "true")


def test_auto_packs_eager_steps_on_a_cpu_only():
    assert packing.choose("auto", use_xla=False, cuda=False, compile_scope=None) == "auto"
    assert packing.choose("auto", use_xla=False, cuda=True, compile_scope=None) == "false"  # unmeasured on a GPU
    assert packing.choose("auto", use_xla=True, cuda=False, compile_scope=None) == "false"
    assert packing.choose("auto", use_xla=False, cuda=False, compile_scope="layers") == "false"
    assert packing.choose("true", use_xla=False, cuda=True, compile_scope="layers") == "true"
    assert packing.choose("false", use_xla=False, cuda=False, compile_scope=None) == "false"
    with pytest.raises(HyperparameterError, match="XLA"):
        packing.choose("true", use_xla=True, cuda=False, compile_scope=None)
    with pytest.raises(HyperparameterError, match="compile_scope=layers"):
        packing.choose("true", use_xla=False, cuda=False, compile_scope="model")


@pytest.mark.integration
@pytest.mark.cpu
def test_a_job_on_batches_of_mixed_lengths_packs_and_learns_as_a_padded_one(tmp_path, tiny_model_dir):
    """The real entry point, batches not grouped by length: metrics.json says the job packed, and its losses are
    the padded job's (the same batches, the same sums: only their order differs)."""
    hp = {"max_steps": "12", "per_device_train_batch_size": "8", "group_by_length": "false", "logging_steps": "1"}
    jobs = {}
    for mode in ("true", "false"):
        job = build_job(tmp_path / mode, tiny_model_dir, {**hp, "packing": mode}, train=64, test=16)
        mixed = [(" ".join([text] * (1 + i % 4)), label) for i, (text, label) in enumerate(sentiment_rows(64))]
        write_csv(job.channel("train") / "t.csv", mixed)  # texts of one to four sentences
        result = run_train_process(job.root, env=CPU_ONLY)  # (auto packs on a CPU)
        assert result.returncode == 0, result.stderr[-3000:]
        jobs[mode] = job
    packed, padded = jobs["true"].metrics, jobs["false"].metrics
    assert packed["packing"] is True and packed["packed_forwards"] > 0.5
    assert 0.3 < packed["packed_token_share"] < 0.9  # texts of one to four sentences: most of a batch was padding
    assert padded["packing"] is False
    steps = [losses(job) for job in (jobs["true"], jobs["false"])]
    assert len(steps[0]) == 12 and steps[0].keys() == steps[1].keys()
    for step, loss in steps[1].items():
        assert steps[0][step] == pytest.approx(loss, rel=1e-4, abs=1e-5), step
    _same_weights(jobs["true"].model_dir, jobs["false"].model_dir)


@pytest.mark.integration
@pytest.mark.cpu
@pytest.mark.parametrize("recipe", [{}, {"lora_r": "4", "mini_batch_size": "4"}], ids=["whole", "lora-cached"])
def test_an_embedding_job_packs_its_positives_and_negatives_and_learns_as_a_padded_one(
    tmp_path, tiny_model_dir, recipe
):
    """In-batch negatives: each token group (anchors, positives, hard negatives) packs apart, under LoRA's wrapper
    and in the cached loss's mini-batches too; the losses and the saved model are the padded job's."""
    rows = [
        {**row, "positive": " ".join([row["positive"]] * (1 + i % 3))}
        for i, row in enumerate(topic_rows(48, negatives=True))
    ]
    hp = {"max_steps": "6", "per_device_train_batch_size": "8", "logging_steps": "1", "task": "embedding"}
    hp.update(group_by_length="false", dropout="0")  # (random batches; no dropout, whose draws follow the shapes)
    hp.update(recipe)
    jobs = {}
    for mode in ("true", "false"):
        job = build_job(tmp_path / mode, tiny_model_dir, {**hp, "packing": mode}, train=0)
        (job.channel("train") / "t.csv").unlink()
        write_jsonl(job.channel("train") / "train.jsonl", rows)
        result = run_train_process(job.root, env=CPU_ONLY)
        assert result.returncode == 0, result.stderr[-3000:]
        jobs[mode] = job
    assert (
        jobs["true"].metrics["packing"] is True and jobs["true"].metrics["packed_forwards"] > 0.1
    )  # (mini-batches of 4 pack less often)
    steps = [losses(job) for job in (jobs["true"], jobs["false"])]
    assert len(steps[0]) == 6
    for step, loss in steps[1].items():
        assert steps[0][step] == pytest.approx(loss, rel=1e-4, abs=1e-5), step
    assert (jobs["true"].model_dir / "modules.json").exists()
    _same_weights(jobs["true"].model_dir, jobs["false"].model_dir)


def _same_weights(folder: Path, other: Path) -> None:
    """The two jobs saved the same weights (and the same serving graphs' files, exported from them): packing
    changes how a step computes, not what."""
    from safetensors.torch import load_file

    weights = [load_file(next(f.rglob("model.safetensors"))) for f in (folder, other)]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[1].items():
        torch.testing.assert_close(weights[0][name], tensor, rtol=1e-3, atol=1e-5, msg=name)
    assert sorted(p.name for p in folder.rglob("*.onnx")) == sorted(p.name for p in other.rglob("*.onnx"))


def _bert() -> torch.nn.Module:
    return transformers.AutoModel.from_config(config_of("bert", 400, 0)).train()


def test_what_a_packed_forward_cannot_give_runs_the_plain_one():
    """Every layer's states or attentions (asked for, or set in the config), a head mask given as a tensor, a
    left-padded batch: the model's own forward, not an error or a packed layout."""
    installed = packing.attach(_bert(), "true")
    assert installed is not None
    batch = _batch(400, types=True)
    assert installed.forward(**batch) is not None
    assert installed.forward(**batch, output_hidden_states=True) is None
    assert installed.forward(**batch, head_mask=torch.ones(2, 2)) is None  # (a tensor's truth was asked before)
    left = {name: value.flip(1) for name, value in batch.items()}
    assert installed.forward(**left) is None
    installed.encoder.config.output_hidden_states = True
    assert installed.forward(**batch) is None
    out = installed.encoder(**batch)  # through the model's call, as a head makes it
    assert len(out.hidden_states) == 3 and out.hidden_states[0].shape[:2] == (8, 12)


def test_detaching_puts_back_a_forward_that_was_there_before():
    model = _bert()
    hooked = model.forward  # (an instance forward, as accelerate's hooks install)
    model.forward = hooked
    installed = packing.attach(model, "true")
    assert installed is not None and model.forward is installed
    packing.detach(installed)
    assert model.forward is hooked


def test_the_check_at_start_runs_before_the_layers_compile(job, tiny_model_dir):
    """packing=true beside compiled layers: the start-up check runs the model eagerly, before any layer compiles;
    through compiled layers it compiled inference graphs of its own, which training never reuses."""
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from byoc.contract import read_training_contract
    from byoc.training.compiled_steps import dynamo_graphs
    from byoc.training.hyperparameters import parse_hyperparameters
    from byoc.training.trainer import build_trainer

    torch._dynamo.reset()
    job.resources().hyperparameters({})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    encoded = tokenizer([f"row {i} " + "word " * (i % 5) for i in range(16)])
    train = Dataset.from_dict({**encoded, "labels": [i % 2 for i in range(16)]})
    args = parse_hyperparameters({"device": "cpu", "torch_compile": "true", "packing": "true"})
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    before = dynamo_graphs()
    trainer = build_trainer(model, tokenizer, {"train": train}, args, read_training_contract(), ["a", "b"])
    assert dynamo_graphs() == before
    assert packing.summary(trainer)["packing"] is True
