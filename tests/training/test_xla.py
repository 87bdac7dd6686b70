"""The XLA (Trainium) training path, run on torch-xla's CPU backend (`PJRT_DEVICE=CPU`).

These tests need torch-xla: they run in the XLA tier's own venv (`make test-xla`: torch 2.9 +
torch-xla 2.9 + transformers 4.55, as in the Neuron images) and skip elsewhere, unless
BYOC_REQUIRE_XLA=1 (CI) makes a missing torch-xla a failure instead.
"""

from __future__ import annotations

import json
import os

import pytest

from helpers import (
    CLASSIFICATION_HP,
    RESUME_HP,
    assert_same_losses,
    build_job,
    losses,
    rerun,
    run_train_process,
    run_until,
    stopped_step,
)

pytestmark = pytest.mark.integration  # real jobs in processes: not in make test-fast

try:
    import torch_xla  # noqa: F401
except ImportError:
    if os.environ.get("BYOC_REQUIRE_XLA") == "1":
        raise
    pytest.skip("torch-xla is not installed (the XLA tier runs in .venv-xla: make test-xla)", allow_module_level=True)

XLA = {"device": "xla"}


@pytest.fixture(autouse=True)
def cpu_backend(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")


def test_xla_job_matches_the_cpu_path_and_compiles_nothing_after_epoch_one(tmp_path, tiny_model_dir):
    results = {}
    for device in ("cpu", "xla"):
        job = build_job(
            tmp_path / device / "opt-ml", tiny_model_dir, {**CLASSIFICATION_HP, "device": device}, train=96, test=40
        )
        done = run_train_process(job.root)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "Joining rendezvous" not in done.stdout  # torch-xla's line at every logging step stays out
        results[device] = job.metrics
    cpu, xla = results["cpu"], results["xla"]
    # Margins over 20 seeds of the tiny model (scripts/seed_margins.py, torch 2.9 + torch-xla 2.9):
    # CPU accuracy worst 0.9 (so >= 0.9 was a coin toss once numerics moved); |XLA - CPU| worst 0.1
    # (0 for 15 seeds; the gap shows on seeds whose CPU run is least trained).
    assert cpu["eval_accuracy"] >= 0.8
    assert abs(xla["eval_accuracy"] - cpu["eval_accuracy"]) <= 0.15
    # bounded graphs: new ones only in epoch 1 and in the first evaluation
    assert xla["xla_graphs_per_epoch"][0] > 0 and xla["xla_graphs_per_epoch"][1:] == [0, 0, 0]
    assert xla["xla_graphs_per_evaluation"][1:] == [0, 0, 0]
    assert xla["padding_efficiency"] > 0.5 and xla["buckets"] == sorted(xla["buckets"])


def test_xla_artifact_serves_on_cpu(tmp_path, tiny_model_dir):
    job = build_job(
        tmp_path / "opt-ml",
        tiny_model_dir,
        {**CLASSIFICATION_HP, **XLA, "epochs": "1", "do_predict": "true"},
        train=96,
        test=40,
    )
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:]
    predictions = [
        json.loads(line) for line in (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()
    ]
    assert sorted(p["index"] for p in predictions) == list(range(40))  # each test row once, no filler rows
    import importlib.util

    from byoc.training.artifact import default_code_dir

    spec = importlib.util.spec_from_file_location("inference", default_code_dir() / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    model = inference.model_fn(str(job.model_dir))  # the serving graph, exported from the XLA-trained weights
    assert model["backend"] == "onnxruntime" and (job.model_dir / "model.onnx").exists()
    answer = inference.predict_fn({"inputs": ["i love this so much"], "parameters": {}}, model)
    assert answer[0]["label"] in ("positive", "negative")
    os.environ["BYOC_INFERENCE_BACKEND"] = "torch"
    try:
        on_torch = inference.model_fn(str(job.model_dir))
    finally:
        del os.environ["BYOC_INFERENCE_BACKEND"]
    assert next(on_torch["model"].parameters()).device.type == "cpu"
    again = inference.predict_fn({"inputs": ["i love this so much"], "parameters": {}}, on_torch)
    assert again[0]["label"] == answer[0]["label"] and again[0]["score"] == pytest.approx(answer[0]["score"], abs=1e-5)


def test_xla_sigterm_checkpoints_and_the_rerun_resumes_at_the_exact_step(tmp_path, tiny_model_dir):
    extra = {**XLA, "max_steps": "40", "buckets": "16,32"}
    reference = build_job(tmp_path / "reference" / "opt-ml", tiny_model_dir, {**RESUME_HP, **extra})
    rerun(reference)
    job = build_job(tmp_path / "stopped" / "opt-ml", tiny_model_dir, {**RESUME_HP, **extra})
    code, log = run_until(job, "[metrics] step=13 ")
    assert code == 143, log[-3000:]
    step = stopped_step(job)
    assert 13 <= step < 40
    checkpoint = job.root / "checkpoints" / f"checkpoint-{step}"
    assert (checkpoint / "byoc-complete.json").exists() and (checkpoint / "optimizer.pt").exists()
    log = rerun(job)
    assert f"resuming from {checkpoint}" in log
    assert sorted(losses(job)) == list(range(1, 41))
    assert_same_losses(job, reference, after=step)
    # the compile cache lives with the checkpoints (synced to S3), so a restart reuses its graphs
    assert any((job.root / "checkpoints" / "neuron-compile-cache").iterdir())


def test_bad_xla_settings_fail_with_a_clear_message(tmp_path, tiny_model_dir):
    job = build_job(
        tmp_path / "opt-ml", tiny_model_dir, {**CLASSIFICATION_HP, **XLA, "buckets": "16,x"}, train=96, test=40
    )
    done = run_train_process(job.root)
    assert done.returncode == 1
    assert job.failure.startswith("hyperparameter buckets must be auto or a list of positive sizes"), job.failure


def fake_neuron_parallel_compile(folder):
    """A stand-in for the Neuron SDK's tool: says it ran, then runs the command as the tool does."""
    tool = folder / "neuron_parallel_compile"
    tool.write_text('#!/bin/sh\necho "fake neuron_parallel_compile: $*"\nNEURON_EXTRACT_GRAPHS_ONLY=1 exec "$@"\n')
    tool.chmod(0o755)
    return folder


def test_neuron_precompile_compiles_every_shape_under_the_tool_and_writes_no_model(tmp_path, tiny_model_dir):
    job = build_job(
        tmp_path / "opt-ml", tiny_model_dir, {**CLASSIFICATION_HP, "neuron_precompile": "true"}, train=96, test=40
    )
    tools = fake_neuron_parallel_compile(tmp_path)
    # one NeuronCore, as the runtime reports it; the graphs still compile on torch-xla's CPU backend
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "NEURON_RT_NUM_CORES": "1", "PJRT_DEVICE": "CPU"}
    done = run_train_process(job.root, env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (
        "fake neuron_parallel_compile: " in done.stdout
        and "precompiling: one training batch of each shape" in done.stdout
    )
    metrics = job.metrics
    assert metrics["xla_graphs_compiled"] > 0
    assert 1 <= max(h["step"] for h in metrics["history"]) <= len(metrics["buckets"])  # one step per training shape
    assert not (job.model_dir / "model.safetensors").exists()
    assert any((job.root / "checkpoints" / "neuron-compile-cache").iterdir())


def test_neuron_precompile_without_the_tool_says_what_is_missing(tmp_path, tiny_model_dir):
    job = build_job(
        tmp_path / "opt-ml", tiny_model_dir, {**CLASSIFICATION_HP, "neuron_precompile": "true"}, train=96, test=40
    )
    done = run_train_process(job.root, env={"NEURON_RT_NUM_CORES": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert job.failure.startswith("neuron_precompile=true needs the Neuron SDK's neuron_parallel_compile"), job.failure


@pytest.mark.parametrize("task", ["multi_label", "regression", "ner", "embedding"])
def test_every_task_trains_on_xla_with_fixed_shapes(tmp_path, tiny_model_dir, task):
    """Multi-label, regression, NER and embeddings (three texts a row) on the XLA path: fixed-shape
    batches whose filler rows (the short last evaluation batch) must cost neither the loss nor the
    metrics, few graphs, and the CPU path's evaluation within a margin."""
    from helpers import Job, conll_sentences, emotion_rows, score_rows, topic_rows, write_jsonl, write_pairs

    results = {}
    for device in ("cpu", "xla"):
        job = Job(tmp_path / device / "opt-ml").resources()
        extra = {"label_column": "relatedness_score"} if task == "regression" else {}
        job.hyperparameters({**CLASSIFICATION_HP, "epochs": "2", "device": device, "do_predict": "true", **extra})
        job.model_channel(tiny_model_dir)
        if task == "multi_label":
            write_jsonl(job.channel("train") / "t.jsonl", emotion_rows(64))
            write_jsonl(job.channel("test") / "t.jsonl", emotion_rows(20, seed=1))
        elif task == "embedding":
            write_jsonl(job.channel("train") / "t.jsonl", topic_rows(64, negatives=True))
            write_jsonl(job.channel("test") / "t.jsonl", topic_rows(20, seed=1, negatives=True))
        elif task == "regression":
            write_pairs(job.channel("train") / "t.tsv", score_rows(64))
            write_pairs(job.channel("test") / "t.tsv", score_rows(20, seed=1))
        else:
            (job.channel("train") / "t.conll").write_text(conll_sentences(64))
            (job.channel("test") / "t.conll").write_text(conll_sentences(20, seed=1))
        done = run_train_process(job.root)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        predictions = (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()
        assert len(predictions) == 20  # every test row once, no filler row
        results[device] = job.metrics
    cpu, xla = results["cpu"], results["xla"]
    # 20 test rows in batches of 16: the last evaluation batch is 4 rows and 12 filler rows. Their
    # labels (-100) would make a BCE or MSE loss of thousands; masked, the loss stays the CPU path's.
    # (In-batch negatives make an embedding model's loss depend on which rows share a batch: the fixed-shape
    # sampler's batches are not the CPU path's, so only the scale is compared there.)
    margin = 0.5 if task == "embedding" else 0.2
    assert abs(xla["eval_loss"] - cpu["eval_loss"]) <= margin * max(cpu["eval_loss"], 0.1), (cpu, xla)
    headline = {
        "multi_label": "eval_f1_micro",
        "regression": "eval_mse",
        "ner": "eval_accuracy",
        "embedding": "eval_mrr_at_10",
    }[task]
    assert headline in xla and headline in cpu
    assert xla["xla_graphs_per_epoch"][1:] == [0]  # no new graph after the first epoch


def test_an_embedding_model_trained_on_xla_is_evaluated_on_a_retrieval_set_on_the_host(tmp_path, tiny_model_dir):
    """A BEIR set in the test channel: the XLA job's figures are sentence-transformers' own for the folder it
    wrote (encoded on the host, byoc.training.corpus_evaluation), and the model is still saved from the device."""
    from byoc import compat
    from byoc.training import corpus_evaluation
    from byoc.training.data.beir import read_set
    from helpers import Job, topic_rows, write_beir, write_jsonl

    job = Job(tmp_path / "opt-ml").resources()
    job.hyperparameters({**CLASSIFICATION_HP, **XLA, "max_steps": "4"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "t.jsonl", topic_rows(32))
    found = read_set(write_beir(job.channel("test")), "test", "test")
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    scoring = corpus_evaluation.evaluator(found)
    results = scoring(compat.sentence_transformers_api()[0](str(job.model_dir), device="cpu"))
    assert job.metrics["test_corpus_ndcg_at_10"] == pytest.approx(results["corpus_cosine_ndcg@10"], abs=1e-6)
    assert job.metrics["device"] == "xla" and "test_bm25_ndcg_at_10" in job.metrics
