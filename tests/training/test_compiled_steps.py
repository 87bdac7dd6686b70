"""The compiled path off XLA (torch_compile=true): fixed-shape length buckets and one static graph
per bucket, so nothing compiles after the first epoch. On CUDA each step also replays as a CUDA
graph; that part needs a GPU (tests/test_gpu.py), the rest runs here on CPU."""

from __future__ import annotations

import os
import shutil

import pytest

from byoc.training.compiled_steps import compile_arguments, compile_mode, wants_buckets
from byoc.training.hyperparameters import parse_hyperparameters
from helpers import CPU_ONLY, Job, run_train_process, sentiment_rows, write_csv


def test_compile_settings_follow_the_hardware():
    """The Trainer compiles the whole step where compile_scope=model; with compile_scope=layers (the default) the job
    compiles the layers itself and the Trainer nothing."""
    assert compile_arguments(parse_hyperparameters({}), True, use_xla=False, cuda=True) == {"torch_compile": False}
    args = parse_hyperparameters({"compile_scope": "model"})
    no_graphs = parse_hyperparameters({"compile_scope": "model", "cuda_graphs": "false"})
    assert compile_arguments(args, True, use_xla=False, cuda=True) == {
        "torch_compile": True,
        "torch_compile_mode": "reduce-overhead",
    }  # CUDA graphs
    assert compile_arguments(no_graphs, True, use_xla=False, cuda=True)["torch_compile_mode"] == "default"
    assert compile_arguments(args, True, use_xla=False, cuda=False)["torch_compile_mode"] == "default"  # CPU
    assert compile_arguments(args, True, use_xla=True, cuda=False) == {"torch_compile": False}  # XLA compiles itself
    assert compile_arguments(args, False, use_xla=False, cuda=True) == {"torch_compile": False}
    assert wants_buckets(True, use_xla=False) and wants_buckets(False, use_xla=True)
    assert not wants_buckets(False, use_xla=False)  # dynamic padding stays the default


def test_compiled_layers_never_replay_as_cuda_graphs():
    """CUDA graph trees cannot hand one compiled layer's output to the next in training (pytorch/pytorch#152887:
    bf16=true failed in its first steps on an H200): layers compile in default mode on CUDA too, cuda_graphs or
    not; only a whole-model step replays as a CUDA graph."""
    for given in ({}, {"cuda_graphs": "true"}, {"compile_scope": "layers", "torch_compile": "true"}):
        assert compile_mode(parse_hyperparameters(given), cuda=True) == "default", given
    assert compile_mode(parse_hyperparameters({"compile_scope": "model"}), cuda=True) == "reduce-overhead"
    assert compile_mode(parse_hyperparameters({"compile_scope": "model"}), cuda=False) == "default"


def test_compiled_layers_compile_once_for_every_length_and_answer_as_eager(tmp_path, tiny_model_dir):
    """compile_scope=layers: each transformer layer compiled with its lengths dynamic; the layers share one compiled
    forward, a second length compiles nothing more, and the logits and gradients are eager's."""
    import copy

    import torch
    import transformers

    from byoc.training.compiled_steps import compile_layers, dynamo_graphs

    torch._dynamo.reset()
    eager = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled, "default") == eager.config.num_hidden_layers
    graphs = []
    for length in (8, 24):
        ids = torch.randint(1000, 2000, (4, length))
        mask = torch.ones_like(ids)
        mask[1, length // 2 :] = 0
        outputs = [model(input_ids=ids, attention_mask=mask).logits for model in (eager, compiled)]
        for output in outputs:
            output.sum().backward()
        torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
        grads = [
            dict(m.named_parameters())["bert.encoder.layer.0.attention.self.query.weight"].grad
            for m in (eager, compiled)
        ]
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)
        graphs.append(dynamo_graphs())
    assert graphs[0] >= 1 and graphs[1] == graphs[0], graphs  # one compilation, every length


def test_the_compile_cache_goes_with_the_checkpoints_unless_the_user_placed_it(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from byoc.training.compiled_steps import persistent_cache
    from byoc.training.settings import INDUCTOR_CACHE_ENV, TrainingSettings

    # persistent_cache writes the variable, which inductor reads: monkeypatch restores it, unset included.
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "set first, so that monkeypatch restores the real value")
    given = lambda env: TrainingSettings.from_env(env).compile_cache
    ours = tmp_path / "torch-compile-cache"
    assert persistent_cache(tmp_path, given({})) == ours
    # What torch writes there the first time it looks is not the user's.
    assert persistent_cache(tmp_path, given({INDUCTOR_CACHE_ENV: default_cache_dir()})) == ours
    assert persistent_cache(tmp_path, given({INDUCTOR_CACHE_ENV: str(tmp_path / "mine")})) == tmp_path / "mine"
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "mine")


@pytest.mark.integration  # a real job in a process of its own
def test_a_compiled_job_uses_buckets_and_compiles_nothing_after_epoch_one(tmp_path, tiny_model_dir):
    job = Job(tmp_path / "opt-ml").resources()
    hyperparameters = {
        "torch_compile": "true",
        "max_buckets": "2",
        "epochs": "2",  # the second epoch and evaluation compile nothing: what the test is about
        "eval_strategy": "epoch",
        "per_device_train_batch_size": "8",
        "per_device_eval_batch_size": "8",
        "learning_rate": "5e-3",
        "device": "cpu",
        "logging_steps": "4",
    }
    job.hyperparameters(hyperparameters)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(64))
    write_csv(job.channel("validation") / "v.csv", sentiment_rows(20))  # a short last evaluation batch
    done = run_train_process(job.root, env=CPU_ONLY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = job.metrics
    assert len(metrics["buckets"]) <= 2 and "torch.compile: sequence buckets" in done.stdout
    assert "torch.compile: each of the 2 transformer layers" in done.stdout  # (compile_scope=layers, the default)
    per_epoch, per_evaluation = (
        metrics["torch_compile_graphs_per_epoch"],
        metrics["torch_compile_graphs_per_evaluation"],
    )
    assert per_epoch[0] > 0 and per_epoch[1:] == [0], per_epoch
    # (Evaluation runs the model uncompiled on transformers 5; whatever it compiles, it compiles once.)
    assert per_evaluation[1:] == [0], per_evaluation
    assert 0 <= metrics["eval_accuracy"] <= 1 and (job.model_dir / "model.safetensors").exists()

    # The compiled steps are kept with the checkpoints (synced to S3): a spot restart on a new
    # instance, which gets the checkpoint folder back, loads them instead of compiling again.
    cache = job.root / "checkpoints" / "torch-compile-cache"
    assert metrics["torch_compile_cache_misses"] > 0 and any(p.is_file() for p in cache.rglob("*"))
    restarted = Job(tmp_path / "new-instance").resources()
    restarted.hyperparameters({**hyperparameters, "epochs": "1", "eval_strategy": "no"})
    restarted.model_channel(tiny_model_dir)
    shutil.copytree(job.channel("train"), restarted.channel("train"), dirs_exist_ok=True)
    shutil.copytree(cache, restarted.root / "checkpoints" / "torch-compile-cache")
    done = run_train_process(restarted.root, env=CPU_ONLY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert restarted.metrics["torch_compile_cache_hits"] > 0
    assert restarted.metrics["torch_compile_cache_misses"] == 0, restarted.metrics  # nothing compiled again

    # A second job of the same model, its cache given as the compile_cache channel (the first job's checkpoint
    # folder's, from S3) and trusted (its pickles run code): it compiles nothing either.
    second = Job(tmp_path / "second-job").resources()
    second.hyperparameters({**hyperparameters, "epochs": "1", "eval_strategy": "no", "trust_remote_code": "true"})
    second.model_channel(tiny_model_dir)
    shutil.copytree(job.channel("train"), second.channel("train"), dirs_exist_ok=True)
    shutil.copytree(cache, second.channel("compile_cache"), dirs_exist_ok=True)
    done = run_train_process(second.root, env=CPU_ONLY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "torch.compile cache seeded from" in done.stdout
    assert second.metrics["torch_compile_cache_hits"] > 0 and second.metrics["torch_compile_cache_misses"] == 0


def test_a_compile_cache_that_comes_with_the_inputs_is_code_used_only_when_trusted(tmp_path, monkeypatch, caplog):
    """inductor's cache entries are pickles: a crafted one in a model folder or the compile_cache channel ran code in
    a second job. A seed from the inputs is copied in only with trust_remote_code=true, and the log says why not;
    the job's own checkpoint folder (its spot restarts') is its own."""
    from byoc.training.compiled_steps import COMPILE_CACHE_DIR, persistent_cache
    from byoc.training.settings import INDUCTOR_CACHE_ENV

    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    seed = tmp_path / "model" / COMPILE_CACHE_DIR / "fxgraph" / "xy"
    seed.mkdir(parents=True)
    (seed / "entry").write_bytes(b"a pickle that runs code")
    for trusted in (False, True):
        checkpoints = tmp_path / f"checkpoints-{trusted}"
        cache = persistent_cache(checkpoints, None, (tmp_path / "model" / COMPILE_CACHE_DIR,), trusted=trusted)
        assert cache == checkpoints / COMPILE_CACHE_DIR
        assert (cache / "fxgraph" / "xy" / "entry").exists() is trusted
    assert "not used: its entries are pickles" in caplog.text and "trust_remote_code=true" in caplog.text
    own = tmp_path / "checkpoints-False" / COMPILE_CACHE_DIR / "own"
    own.mkdir(parents=True)
    (own / "entry").write_bytes(b"the job's own")
    assert persistent_cache(tmp_path / "checkpoints-False", None, ()) / "own" / "entry" == own / "entry"
