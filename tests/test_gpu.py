"""The CUDA path on a real GPU: training (fp32, bf16, fp16; bf16 with compiled layers; a whole step compiled
with CUDA graphs; packed), a job through the launcher with NCCL, SIGTERM and exact resume on cuda, serving on
cuda; an embedding model trained on cuda (eager and compiled) and served there as sentence-transformers encodes
it; TEI's rerank on cuda; a job of each retrieval family (mined negatives, the cached loss, a BEIR test set) on
cuda.

`make test-gpu` runs these on a machine with an NVIDIA GPU (BYOC_REQUIRE_GPU=1 makes a missing GPU
a failure there), several at once (pytest-xdist). Everywhere else they skip, with that reason; the rest of the
suite says which tests mean the CPU. Only the tiny BERT is used: nothing to download, nothing large to carry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import (
    GPU_HP,
    Job,
    build_job,
    learned,
    losses,
    run_train_process,
    start_train,
    topic_rows,
    write_jsonl,
)

if not torch.cuda.is_available():
    if os.environ.get("BYOC_REQUIRE_GPU") == "1":
        raise RuntimeError("BYOC_REQUIRE_GPU=1 but torch sees no CUDA GPU")
    pytest.skip("needs a CUDA GPU (make test-gpu on a GPU machine)", allow_module_level=True)

pytestmark = pytest.mark.gpu

HP = GPU_HP


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_on_cuda_in_each_precision(tmp_path, tiny_model_dir, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (T4, V100)")
    # Eager here (the compiled path has its own test below): every precision trains the same job.
    hyperparameters = {**HP, "precision": precision, "torch_compile": "false"}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, hyperparameters, test=32)
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = job.metrics
    assert (metrics["device"], metrics["precision"]) == ("cuda", precision)
    steps = losses(job)
    assert sorted(steps) == list(range(1, 161))
    # It learns in every precision: over 20 seeds of the tiny model (scripts/seed_margins.py --gpu, one
    # H100) the last 5 steps' mean loss over the first 5's was at worst 0.052 in each precision.
    assert learned(steps, 1, 160) < 0.5
    assert (job.model_dir / "model.safetensors").exists() and (job.model_dir / "model.onnx").exists()


def test_a_packed_job_on_cuda_learns_as_the_padded_one(tmp_path, tiny_model_dir):
    """packing=true on a GPU (auto packs on a CPU only), batches not grouped by length: the job packs, and its
    losses follow the padded job's."""
    from helpers import sentiment_rows, write_csv

    runs = {}
    for mode in ("true", "false"):
        # full fp32 (tf32=false): TF32's rounding would differ between the packed and the padded products
        hyperparameters = {**HP, "max_steps": "40", "group_by_length": "false", "packing": mode, "tf32": "false"}
        job = build_job(tmp_path / mode / "opt-ml", tiny_model_dir, hyperparameters)
        mixed = [(" ".join([text] * (1 + i % 4)), label) for i, (text, label) in enumerate(sentiment_rows(64))]
        write_csv(job.channel("train") / "t.csv", mixed)
        done = run_train_process(job.root)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[mode] = job
    assert runs["true"].metrics["device"] == "cuda" and runs["true"].metrics["packed_forwards"] > 0.5
    packed, padded = losses(runs["true"]), losses(runs["false"])
    assert packed.keys() == padded.keys()
    for step, loss in padded.items():
        assert packed[step] == pytest.approx(loss, rel=1e-2, abs=1e-3), step


def test_precision_auto_and_bf16_choose_from_this_gpu(tmp_path, tiny_model_dir):
    """precision=auto: TF32 eagerly from Ampere on, fp32 before. bf16=true alone in a job too short to repay
    compiling (160 steps) trains as the default does, never in eager bf16 (slower), and its log says why."""
    ampere = torch.cuda.get_device_capability() >= (8, 0)
    job = build_job(tmp_path / "auto" / "opt-ml", tiny_model_dir, HP, test=32)
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        job.metrics["precision"] == ("tf32" if ampere else "fp32")
        and "torch_compile_graphs_compiled" not in job.metrics
    )
    if not ampere:
        return
    job = build_job(tmp_path / "bf16" / "opt-ml", tiny_model_dir, {**HP, "bf16": "true"}, test=32)
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reason = job.metrics["precision_reason"]  # (with several GPUs, one process each: not compiled by itself)
    assert job.metrics["precision"] == "tf32" and ("steps are too few" in reason or "processes" in reason), reason
    assert "torch_compile=true compiles anyway" in done.stdout + done.stderr
    assert learned(losses(job), 1, 160) < 0.5


def test_bf16_with_compiled_layers_trains_on_cuda_as_eager_bf16_does(tmp_path, tiny_model_dir):
    """bf16 with each layer compiled (the default compile scope), the recipe that failed on an H200 in its first
    steps when the layers replayed as CUDA graphs (pytorch/pytorch#152887): it runs, compiles nothing after epoch
    one, and its losses follow the eager bf16 job's."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (T4, V100)")
    runs = {}
    for compiled in ("true", "false"):
        hyperparameters = {**HP, "bf16": "true", "torch_compile": compiled}
        job = build_job(tmp_path / compiled / "opt-ml", tiny_model_dir, hyperparameters, test=32)
        done = run_train_process(job.root)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[compiled] = job
    metrics = runs["true"].metrics
    assert (metrics["device"], metrics["precision"]) == ("cuda", "bf16")
    per_epoch = metrics["torch_compile_graphs_per_epoch"]
    assert per_epoch[0] > 0 and not any(per_epoch[1:]), per_epoch
    compiled, eager = losses(runs["true"]), losses(runs["false"])
    assert compiled.keys() == eager.keys()
    # The compiled job takes fixed-shape length buckets, the eager one length-grouped dynamic batches: the same
    # rows in another order, so step by step the losses differ; over the run they follow each other.
    mean = {name: sum(steps.values()) / len(steps) for name, steps in (("compiled", compiled), ("eager", eager))}
    assert mean["compiled"] == pytest.approx(mean["eager"], rel=0.3, abs=0.05), mean
    assert learned(compiled, 1, 160) < 0.5 and learned(eager, 1, 160) < 0.5


def test_a_whole_step_compiled_with_cuda_graphs_replays_and_compiles_nothing_after_epoch_one(tmp_path, tiny_model_dir):
    """compile_scope=model on a GPU: fixed-shape buckets, one static graph each, replayed as CUDA graphs
    (mode reduce-overhead), in bf16 (fp16 before Ampere); it still learns."""
    hyperparameters = {**HP, "torch_compile": "true", "compile_scope": "model", "max_buckets": "2"}
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, hyperparameters, test=32)
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = job.metrics
    assert metrics["device"] == "cuda" and len(metrics["buckets"]) <= 2
    assert metrics["precision"] == ("bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16")
    per_epoch = metrics["torch_compile_graphs_per_epoch"]
    assert per_epoch[0] > 0 and not any(per_epoch[1:]), per_epoch
    # The same job and threshold as the eager test above (same arithmetic up to kernel choice).
    assert learned(losses(job), 1, 160) < 0.5


NCCL_SCRIPT = """
import json, os
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
value = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(value)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "nccl.json"), "w") as f:
    json.dump({"sum": value.item(), "world": dist.get_world_size(), "backend": os.environ.get("BYOC_BACKEND"),
               "cuda_devices": torch.cuda.device_count()}, f)
dist.destroy_process_group()
"""


def test_a_one_gpu_job_through_the_launcher_runs_nccl(tmp_path):
    # Script mode runs the user's script through the sagemaker-training toolkit, which the images install; a
    # bare GPU machine may lack it (it has no wheel, and cannot be built without a network).
    pytest.importorskip("sagemaker_training", reason="script mode needs the sagemaker-training toolkit")
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(NCCL_SCRIPT)
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "train.py", arcname="train.py")
    job = Job(tmp_path / "opt-ml").resources()
    (job.channel("train") / "data.csv").write_text("text,label\nhi,1\n")
    job.hyperparameters(
        {"sagemaker_program": json.dumps("train.py"), "sagemaker_submit_directory": json.dumps(str(archive))}
    )
    done = run_train_process(job.root, env={"BYOC_PROCESSES_PER_HOST": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "launching 1 process(es) on host 1 of 1 (cuda, backend nccl" in done.stdout + done.stderr
    result = json.loads((job.model_dir / "nccl.json").read_text())
    assert result["sum"] == 1.0 and result["world"] == 1 and result["backend"] == "nccl"


def test_sigterm_on_cuda_checkpoints_and_the_rerun_resumes_exactly(tmp_path, tiny_model_dir):
    extra = {"max_steps": "80", "save_strategy": "steps", "save_steps": "10"}
    reference = build_job(tmp_path / "reference" / "opt-ml", tiny_model_dir, {**HP, **extra}, test=32)
    done = run_train_process(reference.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    job = build_job(tmp_path / "stopped" / "opt-ml", tiny_model_dir, {**HP, **extra}, test=32)
    proc = start_train(job.root)
    for line in proc.stdout:
        if "[metrics] step=25 " in line:
            proc.send_signal(signal.SIGTERM)
            break
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:]
    step = int(job.failure.split("at step ")[1].split()[0])
    (job.root / "output" / "failure").unlink()
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"resuming from {job.root / 'checkpoints' / f'checkpoint-{step}'}" in done.stdout + done.stderr
    ours, theirs = losses(job), losses(reference)
    assert set(ours) == set(theirs) == set(range(1, 81))
    for s in range(step + 1, 81):  # cuBLAS may pick other kernels in another process: near, not bitwise
        assert ours[s] == pytest.approx(theirs[s], rel=1e-3, abs=1e-4), s


SERVED_TEXTS = ["i love this so much", "rude people and cold food", "what a great day it was"] * 3


def _onnx_cuda_provider() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.fixture(scope="module")
def served_on_cuda(tmp_path_factory, tiny_model_dir) -> tuple[Path, list]:
    """A job trained on cuda, and torch fp32's answers on cuda: the reference each backend is held to (once a
    pytest-xdist worker: make test-gpu spreads the backends over workers)."""
    from serve_helpers import Server

    job = build_job(tmp_path_factory.mktemp("served") / "opt-ml", tiny_model_dir, HP, test=32)
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    server = Server(job.model_dir, env={"BYOC_INFERENCE_BACKEND": "torch", "BYOC_INFERENCE_PRECISION": "fp32"})
    try:
        server.wait_ready()
        return job.model_dir, server.invoke({"inputs": SERVED_TEXTS}).json()
    finally:
        server.stop()


@pytest.mark.parametrize("variant", ["auto", "torch-half", "ort-fp32", "ort-fp16"])
def test_serving_on_cuda_each_backend_answers_as_torch_fp32(served_on_cuda, variant):
    """auto (ONNX Runtime's CUDA provider with onnxruntime-gpu, else torch in half precision), ONNX Runtime fp32
    and fp16 (where the CUDA provider is installed), torch half: the same labels as torch fp32 on the GPU, scores
    close. One server a test, so the backends start side by side."""
    from serve_helpers import Server

    cuda_ep = _onnx_cuda_provider()
    if variant.startswith("ort") and not cuda_ep:
        pytest.skip("onnxruntime here has no CUDAExecutionProvider (onnxruntime-gpu serves with it)")
    env = {
        "auto": {},
        "torch-half": {"BYOC_INFERENCE_BACKEND": "torch"},
        "ort-fp32": {"BYOC_INFERENCE_BACKEND": "onnxruntime"},
        "ort-fp16": {"BYOC_INFERENCE_PRECISION": "fp16"},
    }[variant]
    model_dir, expected = served_on_cuda
    server = Server(model_dir, env=env)
    answers = []
    try:
        server.wait_ready()
        answers.append(server.invoke({"inputs": SERVED_TEXTS}).json())
        if variant == "auto" and not cuda_ep:  # ONNX Runtime on the CPU answers until torch has loaded on CUDA
            assert "answering on ONNX Runtime on the CPU until torch has loaded" in server.log(), server.log()[-2000:]
            deadline = time.monotonic() + 180  # (a bound on the wait, not a timing: it ends at the swap)
            while "now serving on torch (cuda)" not in server.log():
                assert time.monotonic() < deadline, server.log()[-2000:]
                time.sleep(0.2)
                answers.append(server.invoke({"inputs": SERVED_TEXTS}).json())  # (the swap comes with a batch)
    finally:
        log = server.stop()
    if variant == "auto" and cuda_ep:
        assert "CUDAExecutionProvider" in log and "model runs on ONNX Runtime" in log, log[-2000:]
    elif variant == "auto":
        assert "model runs on torch" in log and "(cuda" in log, log[-2000:]
    if variant == "ort-fp16":
        assert "fp16, CUDAExecutionProvider" in log, log[-2000:]
    if variant == "torch-half":
        half = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        assert f"(cuda, {half}" in log, log[-2000:]
    for got in answers:  # (auto on torch: ONNX Runtime's fp32 answer first, then torch's half precision one)
        assert [a["label"] for a in got] == [a["label"] for a in expected], variant
        assert [a["score"] for a in got] == pytest.approx([a["score"] for a in expected], abs=2e-2), variant


# --- embedding models and rerankers ----------------------------------------------------------------------

EMBED_TEXTS = ["a recipe for bread", "the team won the final", "snow storms in the north", "learning the guitar"]


def embedding_job(root, tiny_model_dir, hyperparameters: dict) -> Job:
    """(anchor, positive, negative) rows on the tiny plain encoder: in-batch negatives, mean pooling added."""
    job = Job(root).resources()
    job.hyperparameters({**HP, "task": "embedding", **hyperparameters})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(64, negatives=True))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(24, seed=1))
    return job


def served(model_dir, env: dict, *bodies: dict) -> tuple[list, str]:
    """`byoc serve` on `model_dir` with `env`: its answers to `bodies`, and its log."""
    from serve_helpers import Server

    server = Server(model_dir, env=env)
    try:
        server.wait_ready()
        answers = [server.invoke(body) for body in bodies]
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        return [a.json() for a in answers], server.log()
    finally:
        server.stop()


def unit(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "bf16-compiled"])
def test_an_embedding_job_on_cuda_is_served_there_as_sentence_transformers_encodes(tmp_path, tiny_model_dir, compiled):
    """Trained on cuda (TF32 eagerly; bf16 with its layers compiled), written as a
    sentence-transformers folder; `byoc serve` on cuda in fp32 answers sentence-transformers' own
    vectors (on the CPU), and auto's half precision (or ONNX Runtime's CUDA provider) stays close."""
    from byoc import compat

    extra = {"bf16": "true", "torch_compile": "true"} if compiled else {}
    job = embedding_job(tmp_path / "opt-ml", tiny_model_dir, extra)
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = job.metrics
    assert metrics["device"] == "cuda" and metrics["task"] == "embedding"
    assert metrics["precision"] == (
        "bf16" if compiled else ("tf32" if torch.cuda.get_device_capability() >= (8, 0) else "fp32")
    )
    if compiled:
        assert metrics["torch_compile_graphs_per_epoch"][0] > 0
    assert 0 <= metrics["eval_recall_at_1"] <= metrics["eval_mrr_at_10"] <= 1
    # In-batch negatives cannot bring the loss near 0 here: other rows of the same topic are negatives too. On
    # CPU, this job's last-5 over first-5 loss is 0.48 eager and 0.40 compiled; 0.86-0.875 when filler rows
    # were among the negatives (an H100 and the CPU agreed).
    assert learned(losses(job), 1, 160) < 0.7

    SentenceTransformer, _, _, _ = compat.sentence_transformers_api()
    reference = SentenceTransformer(str(job.model_dir), device="cpu").encode(EMBED_TEXTS, normalize_embeddings=True)
    (fp32,), log = served(
        job.model_dir, {"BYOC_INFERENCE_BACKEND": "torch", "BYOC_INFERENCE_PRECISION": "fp32"}, {"inputs": EMBED_TEXTS}
    )
    assert "(cuda, float32" in log, log[-2000:]
    assert (unit(fp32) * reference).sum(axis=1).min() >= 0.9999
    # (auto waits for torch here: answering on the CPU while it loads is the classifier's serving test's)
    (auto,), log = served(job.model_dir, {"BYOC_CPU_WHILE_LOADING": "0"}, {"inputs": EMBED_TEXTS})
    assert "(cuda" in log or "CUDAExecutionProvider" in log, log[-2000:]
    assert (unit(auto) * reference).sum(axis=1).min() >= 0.99


def test_rerank_on_cuda_ranks_by_the_pairs_scores(tmp_path_factory, tmp_path, tiny_model_dir):
    """TEI's rerank request on a pair model served by torch on cuda: the pairs' own scores, sorted."""
    import serve_helpers

    regression = serve_helpers.task_classifier(tmp_path_factory, tiny_model_dir, "regression")
    model_dir = Path(shutil.copytree(regression, tmp_path / "model"))  # byoc serve reads <base>/model
    env = {"BYOC_INFERENCE_BACKEND": "torch", "BYOC_INFERENCE_PRECISION": "fp32"}
    query, texts = "a cat sat on the mat", ["dogs bark", "a cat is on a mat", "stock prices", "cats"]
    (pairs, ranked), log = served(
        model_dir,
        env,
        {"inputs": [{"text": query, "text_pair": t} for t in texts]},
        {"query": query, "texts": texts, "top_n": 3},
    )
    assert "(cuda, float32" in log, log[-2000:]
    scores = [a["score"] for a in pairs]
    assert [r["index"] for r in ranked] == sorted(range(4), key=lambda i: -scores[i])[:3]
    assert [r["score"] for r in ranked] == pytest.approx(sorted(scores, reverse=True)[:3], abs=1e-5)


# --- retrieval jobs ------------------------------------------------------------------------------------

RETRIEVAL_JOBS = {  # each family as a user starts it on one GPU: negatives mined there, a BEIR test set after
    "embedding": {"mine_hard_negatives": "true", "negatives_range_min": "1", "mini_batch_size": "4"},
    "reranker": {"mine_hard_negatives": "true", "negatives_range_min": "1", "num_negatives": "2"},
    "sparse_embedding": {},
    "multi_vector": {"mine_hard_negatives": "true", "negatives_range_min": "1"},
}


@pytest.mark.parametrize("task", sorted(RETRIEVAL_JOBS))
def test_a_retrieval_job_on_cuda_mines_trains_and_reports_its_figures_on_a_beir_set(tmp_path, tiny_model_dir, task):
    """Mining (the bundled embedding model on cuda), the cached loss, and sentence-transformers' evaluators on a
    BEIR test channel, all on the GPU: the figures written are those of the folder the job wrote, loaded afresh."""
    from byoc import compat
    from byoc.training import corpus_evaluation
    from byoc.training.data.beir import read_set
    from helpers import build_tiny_mlm, write_beir

    if task == "multi_vector":
        pytest.importorskip("sentence_transformers.multi_vector_encoder", reason="multi-vector models: 6.2 on")
    job = Job(tmp_path / "opt-ml").resources()
    job.hyperparameters({**HP, "task": task, "max_steps": "6", "logging_steps": "2", **RETRIEVAL_JOBS[task]})
    sparse = task == "sparse_embedding"  # a SPLADE model starts from a masked-language model
    job.model_channel(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm") if sparse else tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    test_set = write_beir(job.channel("test") / "topics")
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = job.metrics
    assert metrics["device"] == "cuda" and metrics["task"] == task
    assert 0 <= metrics["test_bm25_ndcg_at_10"] <= 1

    kind = {"sparse_embedding": "sparse", "multi_vector": "maxsim"}.get(task, "dense")
    if task == "reranker":  # re-ranks the bundled embedder's top 100: its own figures are checked on the CPU
        assert 0 <= metrics["test_corpus_ndcg_at_10"] <= 1 and "test_retriever_ndcg_at_10" in metrics
        return
    if kind == "maxsim":
        from sentence_transformers import MultiVectorEncoder as model_class
    else:
        model_class = compat.sparse_encoder_api()[0] if kind == "sparse" else compat.sentence_transformers_api()[0]
    found = read_set(test_set, "test", "test")
    scoring = corpus_evaluation.evaluator(found, kind)
    results = scoring(model_class(str(job.model_dir), device="cuda"))
    prefix = scoring.primary_metric.removesuffix("ndcg@10")
    # On cuda in this process (no TF32) against the job's (TF32): a near tie may swap one pair of 15 documents.
    for key, name in corpus_evaluation.REPORTED.items():
        assert metrics[f"test_corpus_{name}"] == pytest.approx(results[prefix + key], abs=0.05), name


@pytest.mark.parametrize("ranks", ["auto", "2"])
def test_byoc_encode_on_cuda_encodes_each_document_once_as_sentence_transformers_does(tmp_path, tiny_model_dir, ranks):
    """`byoc encode` as a job runs it: one rank a GPU by default (auto), or two ranks sharing this machine's GPUs;
    torch on cuda in half precision (serving's choice), each document once, close to sentence-transformers' fp32
    vectors on the CPU."""
    import subprocess
    import sys

    import pyarrow.dataset as ds

    from byoc import compat

    SentenceTransformer, _, _, _ = compat.sentence_transformers_api()
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # (sentence-transformers 5: the images' tier)
        from sentence_transformers.models import Pooling, Transformer
    folder = tmp_path / "embedder"
    encoder = Transformer(str(tiny_model_dir))
    width = getattr(encoder, "get_embedding_dimension", None) or encoder.get_word_embedding_dimension  # (5.x's name)
    SentenceTransformer(modules=[encoder, Pooling(width())]).save(str(folder))
    job = Job(tmp_path / "opt-ml").resources().hyperparameters({"shard_size": "16", "processes_per_host": ranks})
    job.model_channel(folder)
    texts = {f"d{n}": f"{EMBED_TEXTS[n % 4]} number {n}" for n in range(100)}
    write_jsonl(job.channel("corpus") / "c.jsonl", [{"id": k, "text": v} for k, v in texts.items()])
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(job.root)}
    done = subprocess.run(
        [sys.executable, "-m", "byoc.cli", "encode"], env=env, capture_output=True, text=True, timeout=180
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert log.count("with torch on cuda") == (1 if ranks == "auto" else 2), log[-3000:]
    table = ds.dataset(job.model_dir / "shards", format="parquet").to_table()
    ids = table["id"].to_pylist()
    assert sorted(ids) == sorted(texts)
    got = unit(np.stack(table["vector"].to_numpy(zero_copy_only=False)))
    reference = SentenceTransformer(str(folder), device="cpu").encode(
        [texts[i] for i in ids], normalize_embeddings=True
    )
    assert (got * reference).sum(axis=1).min() >= 0.99
