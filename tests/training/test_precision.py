"""The precision and compile decision (byoc.training.precision), per hardware description: H100/A100/A10G
(Ampere and later), T4/V100 (before Ampere), CPU, Trainium. Runs anywhere: no GPU is needed to
test what a GPU job would choose."""

from __future__ import annotations

import pytest

from byoc.training.arguments import HyperparameterError
from byoc.training.hyperparameters import parse_hyperparameters
from byoc.training.precision import Hardware, choose, requested

H100 = Hardware("cuda", (9, 0), name="NVIDIA H100 80GB HBM3")
A10G = Hardware("cuda", (8, 6), name="NVIDIA A10G")
T4 = Hardware("cuda", (7, 5), name="Tesla T4")
V100 = Hardware("cuda", (7, 0), name="Tesla V100-SXM2-16GB")
CPU = Hardware("cpu")
TRAINIUM = Hardware("xla")


def decide(hardware: Hardware, **hyperparameters: str) -> tuple[str, bool, bool]:
    chosen = choose(parse_hyperparameters(hyperparameters), hardware)
    return chosen.name, chosen.compile, chosen.tf32


@pytest.mark.parametrize("gpu", [H100, A10G])
def test_auto_on_ampere_and_later(gpu):
    assert decide(gpu) == ("tf32", False, True)  # eager: TF32 (eager bf16 measured slower than TF32)
    assert decide(gpu, torch_compile="true") == ("bf16", True, True)  # compiled: where bf16 pays
    assert decide(gpu, torch_compile="true", cuda_graphs="false") == ("bf16", True, True)
    assert decide(gpu, torch_compile="false") == ("tf32", False, True)
    assert decide(gpu, tf32="false") == ("fp32", False, False)  # full precision, as asked
    assert decide(gpu, tf32="false", torch_compile="true") == ("fp32", True, False)


@pytest.mark.parametrize("gpu", [T4, V100])
def test_auto_before_ampere(gpu):
    assert decide(gpu) == ("fp32", False, False)  # no TF32 there (transformers would refuse it)
    assert decide(gpu, torch_compile="true") == ("fp16", True, False)  # tensor cores: fp16 only
    assert decide(gpu, fp16="true") == ("fp16", True, False)


def test_half_precision_compiles_on_one_gpu_unless_told_not_to(caplog):
    """(The job's length unknown, as for a code/train.py's own Trainer: half precision as asked.)"""
    assert decide(H100, bf16="true") == ("bf16", True, True)
    assert decide(H100, precision="bf16") == ("bf16", True, True)
    assert decide(H100, precision="fp16") == ("fp16", True, True)
    assert decide(H100, bf16="true", tf32="false") == ("bf16", True, False)
    caplog.clear()
    assert decide(H100, bf16="true", torch_compile="false") == ("bf16", False, True)
    assert "eager autocast is usually slower than tf32" in caplog.text
    # several processes: compile stays the user's call (not measured there yet), and the default (TF32 eagerly)
    # is the faster whole job; the log says how to insist
    several = Hardware("cuda", (9, 0), processes=8)
    caplog.clear()
    assert decide(several, bf16="true") == ("tf32", False, True)
    assert "with 8 processes the step is compiled only when asked" in caplog.text
    assert "torch_compile=true" in caplog.text
    assert decide(several, bf16="true", torch_compile="false") == ("bf16", False, True)
    assert decide(several, bf16="true", torch_compile="true") == ("bf16", True, True)


def test_what_the_hardware_lacks_falls_back_to_fp32_with_a_warning(caplog):
    assert decide(T4, bf16="true") == ("fp32", False, False)
    assert "has no bf16; training runs in fp32 (try fp16=true)" in caplog.text
    caplog.clear()
    assert decide(V100, precision="tf32") == ("fp32", False, False)
    assert "TF32 needs a GPU from Ampere on" in caplog.text
    caplog.clear()
    assert decide(CPU, fp16="true") == ("fp32", False, False)
    assert "fp16 needs a CUDA GPU; none here, so training runs in fp32" in caplog.text


def test_cpu_and_trainium():
    assert decide(CPU) == ("fp32", False, False)
    assert decide(CPU, bf16="true") == ("bf16", False, False)  # correct, slower without AMX: not compiled for you
    assert decide(CPU, torch_compile="true") == ("fp32", True, False)
    assert decide(TRAINIUM) == ("fp32", False, False)  # XLA compiles by itself: never torch.compile
    assert decide(TRAINIUM, bf16="true") == ("bf16", False, False)
    assert decide(TRAINIUM, fp16="true") == ("fp32", False, False)
    assert not Hardware("cpu", (9, 0)).ampere and Hardware("cuda", (8, 0)).ampere


def test_the_tutorials_switches_mean_a_precision():
    assert requested(parse_hyperparameters({})) == "auto"
    assert requested(parse_hyperparameters({"bf16": "True"})) == "bf16"
    assert requested(parse_hyperparameters({"fp16": "true"})) == "fp16"
    assert requested(parse_hyperparameters({"tf32": "true"})) == "tf32"
    assert requested(parse_hyperparameters({"tf32": "false"})) == "fp32"
    assert requested(parse_hyperparameters({"precision": "bf16", "bf16": "true"})) == "bf16"


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {"bf16": "true", "fp16": "true"},
        {"precision": "fp32", "bf16": "true"},
        {"precision": "fp16", "bf16": "true"},
        {"precision": "fp32", "tf32": "true"},
        {"precision": "tf32", "tf32": "false"},
    ],
)
def test_contradicting_precision_settings_are_refused(hyperparameters):
    with pytest.raises(HyperparameterError, match="disagree .*set precision alone"):
        parse_hyperparameters(hyperparameters)


def test_agreeing_precision_settings_are_accepted():
    for hyperparameters in (
        {"precision": "bf16", "bf16": "true"},
        {"precision": "tf32", "tf32": "true"},
        {"bf16": "true", "tf32": "false"},  # bf16, with what autocast leaves in fp32 kept at full fp32
        {"precision": "fp32", "tf32": "false"},
    ):
        parse_hyperparameters(hyperparameters)
    with pytest.raises(HyperparameterError, match="must be one of auto, fp32, tf32, bf16, fp16"):
        parse_hyperparameters({"precision": "int8"})


@pytest.mark.parametrize("hardware", [H100, CPU])
def test_the_cached_loss_runs_eager_whatever_would_compile(hardware):
    """mini_batch_size's cached loss embeds the batch itself, a mini-batch at a time, and replays it in the backward
    pass: the step is not compiled (bf16=true on a GPU would compile it)."""
    assert decide(hardware, bf16="true", mini_batch_size="4")[1] is False
    if hardware.device == "cuda":  # and not in eager bf16, slower than the default
        assert decide(hardware, bf16="true", mini_batch_size="4") == ("tf32", False, True)
    assert decide(hardware, torch_compile="true", mini_batch_size="4")[1] is False
    assert decide(hardware, torch_compile="true")[1] is True


@pytest.mark.parametrize("hardware", [H100, CPU])
def test_a_task_whose_loss_runs_the_model_runs_eager_whatever_would_compile(hardware):
    """A multi-vector model's loss (sentence-transformers') embeds the query and document columns itself."""
    assert decide(hardware, bf16="true", task="colbert")[1] is False
    if hardware.device == "cuda":
        assert decide(hardware, bf16="true", task="colbert") == ("tf32", False, True)
    assert decide(hardware, torch_compile="true", task="multi_vector")[1] is False
    assert decide(hardware, torch_compile="true", task="embedding")[1] is True


@pytest.mark.parametrize("gpu", [H100, T4])
def test_half_precision_compiles_only_in_a_job_long_enough_to_repay_it(gpu, caplog):
    """bf16/fp16 asked for, compiling left to byoc: a job shorter than the compilation's break-even trains as the
    default does (eagerly: eager half precision is the slowest whole job), a longer one compiles; asked, it compiles."""
    from byoc.training.precision import PAYS_AFTER_STEPS, pays_after

    half, default = ("bf16", "tf32") if gpu.ampere else ("fp16", "fp32")
    args = parse_hyperparameters({half: "true"})
    assert pays_after(args) == PAYS_AFTER_STEPS["layers"]  # one layer, compiled once for every length
    short = choose(args, gpu, steps=pays_after(args) - 1)
    assert (short.name, short.compile) == (default, False)
    assert f"{pays_after(args) - 1} steps are too few" in short.reason and "torch_compile=true" in caplog.text
    assert (choose(args, gpu, steps=pays_after(args)).name, choose(args, gpu, steps=pays_after(args)).compile) == (
        half,
        True,
    )
    forced = choose(parse_hyperparameters({half: "true", "torch_compile": "true"}), gpu, steps=10)
    assert (forced.name, forced.compile) == (half, True)  # asked: as asked
    whole = parse_hyperparameters({half: "true", "compile_scope": "model", "max_buckets": "5"})
    assert pays_after(whole) == 5 * PAYS_AFTER_STEPS["model"]  # a whole-step graph per bucket
    assert not choose(whole, gpu, steps=pays_after(whole) - 1).compile
    full = choose(parse_hyperparameters({half: "true", "tf32": "false"}), gpu, steps=10)
    assert (full.name, full.compile, full.tf32) == ("fp32", False, False)  # tf32=false: the fallback in full fp32


def test_the_default_compiles_bf16_only_where_the_job_repays_it(caplog):
    """precision=auto picks the shortest whole job from its length: TF32 eagerly, or bf16 with its layers compiled
    in a job long enough; never fp16 by itself (before Ampere: fp32), never for an unknown length."""
    from byoc.training.precision import pays_after

    args = parse_hyperparameters({})
    long, short = pays_after(args), pays_after(args) - 1
    assert (choose(args, H100, steps=short).name, choose(args, H100, steps=short).compile) == ("tf32", False)
    chosen = choose(args, H100, steps=long)
    assert (chosen.name, chosen.compile, chosen.tf32) == ("bf16", True, True)
    assert f"{long} steps repay compiling" in chosen.reason
    assert (choose(args, T4, steps=long).name, choose(args, T4, steps=long).compile) == ("fp32", False)
    assert not choose(args, Hardware("cuda", (9, 0), processes=2), steps=long).compile
    assert not choose(args, H100).compile  # the length unknown
    assert "WARNING" not in [r.levelname for r in caplog.records]  # the default warns of nothing it chose


def test_the_planned_steps_count_epochs_batches_and_processes():
    args = parse_hyperparameters({"epochs": "2", "per_device_train_batch_size": "32"})
    assert args.planned_steps(16_000, 1) == 1000
    assert args.planned_steps(16_000, 4) == 250
    assert args.planned_steps(100, 1) == 8  # a short last batch is a step: 4 an epoch
    assert parse_hyperparameters({"max_steps": "7"}).planned_steps(16_000, 1) == 7
    accumulated = parse_hyperparameters({"per_device_train_batch_size": "8", "gradient_accumulation_steps": "4"})
    assert accumulated.planned_steps(320, 1) == 30  # 3 epochs of 10
