"""Embedding models trained end to end: the real `byoc train` on scored pairs (CoSENT) and on (anchor,
positive[, negative]) rows (in-batch negatives), from the bundled sentence-transformers folder and from a
plain encoder; the folder it writes loads in sentence-transformers, which embeds exactly as `byoc serve`
does (on torch and on the exported graph)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from byoc import compat, sentence_folder, tasks
from byoc.tasks import EMBEDDING
from byoc.tasks.embedding import model as embedding
from byoc.tasks.regression import regression_metrics
from byoc.training import entry
from byoc.training.arguments import HyperparameterError
from byoc.training.data import DataError, TaskData
from byoc.training.job import check_in_batch_negatives
from byoc.training.metrics import write_report
from byoc.training.model import bundled_model_dir
from helpers import (
    CPU_ONLY,
    Job,
    assert_same_losses,
    losses,
    own_inference,
    rerun,
    run_until,
    score_rows,
    stopped_step,
    topic_rows,
    write_jsonl,
    write_pairs,
)
from tasks.test_embedding import THEIR_NAMES, TIES, information_retrieval_evaluator, shared_header_rows

pytestmark = pytest.mark.integration  # real jobs: not in make test-fast

QUICK = {"max_steps": "6", "logging_steps": "2", "per_device_train_batch_size": "8"}


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


def served_vectors(model_dir, monkeypatch, backend: str, texts: list[str]) -> np.ndarray:
    inference, model = own_inference(model_dir, monkeypatch, backend)
    data = inference.input_fn(json.dumps({"inputs": texts}), "application/json")
    answer = inference.output_fn(inference.predict_fn(data, model), "application/json")[0]
    return np.asarray(json.loads(answer), dtype=np.float32)


def sentence_transformers_vectors(model_dir, texts: list[str], max_seq_length: int = 256) -> np.ndarray:
    from byoc import compat

    SentenceTransformer, _, _, _ = compat.sentence_transformers_api()
    model = SentenceTransformer(str(model_dir), device="cpu")
    assert model.max_seq_length == max_seq_length  # the job's max_length, saved as each version saves it
    return model.encode(texts, normalize_embeddings=True)


def test_scored_pairs_train_with_cosent_into_a_folder_sentence_transformers_loads(job, monkeypatch):
    job.hyperparameters({**QUICK, "task": "embedding", "do_predict": "true"})
    write_pairs(job.channel("train") / "train.tsv", score_rows(48))
    write_pairs(job.channel("test") / "test.tsv", score_rows(16, seed=1))
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    assert metrics["task"] == EMBEDDING and metrics["labels"] == ["relatedness_score"]
    assert "metric_notes" not in metrics  # no mrr_at_10 to note
    # The test split is the only evaluation data: its figures are the eval_ ones.
    assert -1 <= metrics["eval_spearman_cosine"] <= 1 and -1 <= metrics["eval_pearson_cosine"] <= 1
    folder = job.model_dir
    assert (folder / "modules.json").is_file() and (folder / "1_Pooling/config.json").is_file()
    lines = [json.loads(line) for line in (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 16 and all(-1.0001 <= line["cosine"] <= 1.0001 for line in lines)
    assert [line["label"] for line in lines] == [score for _, _, score in score_rows(16, seed=1)]

    texts = ["red cat sits", "blue dog runs and eats", "a sentence longer than the others by a few words"]
    reference = sentence_transformers_vectors(folder, texts)
    for backend in ("onnxruntime", "torch"):
        served = served_vectors(folder, monkeypatch, backend, texts)
        assert (served * reference).sum(axis=1).min() >= 0.9999, backend
    # Trained: the vectors moved from the pretrained model's.
    pretrained = sentence_transformers_vectors(bundled_model_dir(), texts)
    assert (pretrained * reference).sum(axis=1).min() < 0.99999
    # Served as the job scored it: the test pairs sent as raw text, the Spearman of the answers' cosines.
    pairs = score_rows(16, seed=1)
    first = served_vectors(folder, monkeypatch, "onnxruntime", [a for a, _, _ in pairs])
    second = served_vectors(folder, monkeypatch, "onnxruntime", [b for _, b, _ in pairs])
    served = regression_metrics((first * second).sum(axis=1), np.array([score for _, _, score in pairs]))
    assert served["spearmanr"] == pytest.approx(metrics["eval_spearman_cosine"], abs=0.01)


def test_anchor_positive_negative_rows_train_with_in_batch_negatives(job, tiny_model_dir, caplog):
    """A plain encoder (no sentence-transformers modules) gets mean pooling; a negative column is used."""
    job.hyperparameters({**QUICK, "learning_rate": "1e-3", "do_predict": "true"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(48, negatives=True))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(24, seed=1, negatives=True))
    write_pairs(job.channel("test") / "test.tsv", score_rows(12, seed=2))  # the other layout: scored pairs
    with caplog.at_level("INFO", logger="byoc.training.data"):
        assert entry.train() == 0, job.failure
    ready = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("data ready"))
    assert ready.endswith("; sentence embeddings, (anchor, positive) rows"), ready  # it ended in ": " and nothing

    metrics = job.metrics
    assert metrics["task"] == EMBEDDING and metrics["labels"] == []
    for key in ("mrr_at_10", "ndcg_at_10", "recall_at_1", "recall_at_10"):
        assert 0 <= metrics[f"eval_{key}"] <= 1, key
    assert metrics["eval_recall_at_1"] <= metrics["eval_mrr_at_10"] <= 1
    assert -1 <= metrics["test_spearman_cosine"] <= 1 and "test_mrr_at_10" not in metrics
    lines = [json.loads(line) for line in (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()]
    assert [line["label"] for line in lines] == [score for _, _, score in score_rows(12, seed=2)]
    modules = json.loads((job.model_dir / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
    pooling = json.loads((job.model_dir / "1_Pooling/config.json").read_text())
    assert pooling.get("pooling_mode_mean_tokens") or pooling.get("pooling_mode") == "mean"


@pytest.mark.parametrize("scored", [True, False], ids=["cosent", "in-batch-negatives"])
def test_each_loss_keeps_its_gradient_when_compiled(tiny_model_dir, scored):
    """sentence-transformers' similarity functions end in `.to_dense()`, whose output torch.compile before
    torch 2.13 left without a grad_fn: a compiled embedding job (torch_compile=true; bf16 on one GPU) failed in
    its first backward (found on an H100 with torch 2.11; the torch-2.9 tier fails here without the fix)."""
    model = embedding.build(str(tiny_model_dir), scored=scored, max_length=32, model_kwargs={}, config_kwargs={})
    torch.manual_seed(0)
    vectors = [torch.randn(4, 32, requires_grad=True) for _ in range(2)]
    labels = torch.tensor([0.1, 0.9, 0.4, 0.6])  # scores for CoSENT; in-batch negatives read no labels
    eager = model.loss(vectors, labels)
    compiled = torch.compile(model.loss)(vectors, labels)
    assert compiled.grad_fn is not None
    assert compiled.item() == pytest.approx(eager.item(), rel=1e-5)
    compiled.backward()
    assert all(v.grad is not None and bool(v.grad.abs().sum() > 0) for v in vectors)


# --- what a job refuses at start, and how it evaluates ----------------------------------------------------

# Imported by loading the folder: it writes the marker (any code a model folder names could run in the job).
EVIL_POOL = """import pathlib

pathlib.Path({marker!r}).write_text("ran")

try:
    from sentence_transformers.sentence_transformer.modules import Pooling
except ImportError:
    from sentence_transformers.models import Pooling
"""


def folder_naming_its_own_code(tiny_model_dir, root: Path, marker: Path) -> Path:
    """A sentence-transformers folder whose modules.json names `evil_pool.Pooling`, with evil_pool.py beside it."""
    folder = root / "evil-st"
    model = embedding.build(str(tiny_model_dir), scored=False, max_length=32, model_kwargs={}, config_kwargs={})
    model.save_pretrained(folder)
    modules = json.loads((folder / "modules.json").read_text())
    assert modules[1]["type"].endswith(".Pooling")
    modules[1]["type"] = "evil_pool.Pooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "evil_pool.py").write_text(EVIL_POOL.format(marker=str(marker)))
    return folder


@pytest.fixture
def local_module_code_imported(monkeypatch):
    """sentence-transformers as 5.x loads a folder (the Neuron image's 5.1.2; requirements allow >=5.1): a local
    folder's module types are imported from the folder itself without trust_remote_code. (6.x refuses them.)"""
    from sentence_transformers.util import import_from_string

    def load_class(self, class_ref, model_name_or_path, *args, **kwargs):
        if class_ref.startswith("sentence_transformers."):
            return import_from_string(class_ref)
        module, name = class_ref.rsplit(".", 1)
        spec = importlib.util.spec_from_file_location(module, Path(model_name_or_path) / f"{module}.py")
        assert spec is not None and spec.loader is not None
        code = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(code)
        return getattr(code, name)

    SentenceTransformer = compat.sentence_transformers_api()[0]
    monkeypatch.setattr(SentenceTransformer, "_load_module_class_from_ref", load_class)


def test_a_model_folder_naming_its_own_module_code_is_refused_unless_trusted(
    tmp_path, tiny_model_dir, local_module_code_imported
):
    marker = tmp_path / "marker"
    folder = folder_naming_its_own_code(tiny_model_dir, tmp_path, marker)
    with pytest.raises(sentence_folder.FolderError, match=r"trust_remote_code=true.* names: 'evil_pool.Pooling'"):
        embedding.build(str(folder), scored=False, max_length=32, model_kwargs={}, config_kwargs={})
    assert not marker.exists()  # refused before sentence-transformers saw the folder
    # Trusted, it loads as sentence-transformers loads it: running the folder's code.
    model = embedding.build(
        str(folder), scored=False, max_length=32, model_kwargs={}, config_kwargs={}, trust_remote_code=True
    )
    assert marker.read_text() == "ran" and type(model.model[1]).__name__ == "Pooling"


def test_an_embedding_job_on_such_a_folder_fails_at_start_naming_the_module_and_the_fix(
    job, tmp_path, tiny_model_dir, local_module_code_imported
):
    marker = tmp_path / "marker"
    job.hyperparameters(QUICK)
    job.model_channel(folder_naming_its_own_code(tiny_model_dir, tmp_path, marker))
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(16))
    assert entry.train() != 0
    assert job.failure is not None and "'evil_pool.Pooling'" in job.failure, job.failure
    assert "set it if you trust the code" in job.failure and "trust_remote_code=true" in job.failure
    assert not marker.exists() and not job.model_dir.joinpath("modules.json").exists()


def rows_data(rows: int, negatives: bool = False, labels: list[str] | None = None) -> TaskData:
    columns = {"text": ["a"] * rows, "text_pair": ["b"] * rows}
    if negatives:
        columns["text_negative"] = ["c"] * rows
    return TaskData(datasets.Dataset.from_dict(columns), None, None, labels or [], False, tasks.EMBEDDING)


def test_in_batch_negatives_need_two_rows_a_batch_counted_over_every_rank(tiny_model_dir):
    """Without a negative column an anchor's negatives are the batch's other positives: a batch of one row has
    none, its loss is 0 whatever the model (so such a job trained nothing, exit 0, no warning)."""
    model = embedding.build(str(tiny_model_dir), scored=False, max_length=32, model_kwargs={}, config_kwargs={})
    torch.manual_seed(0)
    anchor, positive, negative = (torch.randn(1, 32) for _ in range(3))
    labels = torch.tensor([float("nan")])
    assert model.loss([anchor, positive], labels).item() == 0.0
    assert model.loss([anchor, positive, negative], labels).item() > 0  # a row's own hard negative
    with pytest.raises(HyperparameterError, match="Set a larger per_device_train_batch_size"):
        check_in_batch_negatives(rows_data(16), batch_size=1, world_size=1)
    with pytest.raises(DataError, match="only 1 \\(anchor, positive\\) row.*Give more rows"):
        check_in_batch_negatives(rows_data(1), batch_size=16, world_size=1)
    check_in_batch_negatives(rows_data(16), batch_size=1, world_size=2)  # the loss gathers both ranks' positives
    check_in_batch_negatives(rows_data(16, negatives=True), batch_size=1, world_size=1)
    check_in_batch_negatives(rows_data(1, labels=["score"]), batch_size=1, world_size=1)  # CoSENT: scored pairs


@pytest.mark.parametrize(
    ("batch", "rows", "message"),
    [("1", 16, "per_device_train_batch_size=1 on 1 process"), ("8", 1, "only 1 (anchor, positive) row")],
    ids=["batch-of-one", "one-row"],
)
def test_an_embedding_job_whose_batches_hold_one_row_fails_before_training(job, tiny_model_dir, batch, rows, message):
    job.hyperparameters({**QUICK, "per_device_train_batch_size": batch})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(rows))
    assert entry.train() != 0
    assert job.failure is not None and message in job.failure and "negative column" in job.failure, job.failure
    assert not (job.root / "output/data/metrics.json").exists()  # nothing trained


def test_retrieval_metrics_are_sentence_transformers_evaluators_on_texts_identical_after_truncation(
    job, tiny_model_dir
):
    """Eval positives identical once cut at max_length 32 (a shared long header): the job reports what
    sentence-transformers' InformationRetrievalEvaluator reports on the same rows with the model it saved (byoc
    counted every tie a hit at rank 1: recall@1 0.81 where the evaluator gave 0.021)."""
    job.hyperparameters({**QUICK, "max_length": "32"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    rows = shared_header_rows()
    write_jsonl(job.channel("validation") / "dev.jsonl", rows)
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    SentenceTransformer = compat.sentence_transformers_api()[0]
    theirs = information_retrieval_evaluator(rows)(SentenceTransformer(str(job.model_dir), device="cpu"))
    for name, their_name in THEIR_NAMES.items():
        assert metrics[f"eval_{name}"] == pytest.approx(theirs[f"cosine_{their_name}"], abs=TIES), name
    assert metrics["eval_recall_at_1"] <= 25 / 48  # of the 24 tied positives, one at most is a hit at rank 1
    assert metrics["metric_notes"].keys() == {"mrr_at_10"}  # rows: the retrieval note


def test_metrics_json_notes_only_the_metrics_it_reports(tmp_path):
    """An embedding model evaluated on scored pairs reports no mrr_at_10: metrics.json has no note on it."""
    notes = dict(tasks.get(tasks.EMBEDDING).evaluation.metric_notes)
    scored = {"task": EMBEDDING, "metric_notes": notes, "eval_spearman_cosine": 0.5, "eval_pearson_cosine": 0.4}
    assert "metric_notes" not in json.loads(write_report(tmp_path / "a", scored, []).read_text())
    rows = {"task": EMBEDDING, "metric_notes": notes, "test_mrr_at_10": 0.5, "test_recall_at_1": 0.4}
    assert json.loads(write_report(tmp_path / "b", rows, []).read_text())["metric_notes"] == notes


# --- several processes, and a spot interruption ----------------------------------------------------------

ROWS_HP = {  # no dropout: ranks draw their dropout masks apart, so equal losses need none
    "dropout": "0.0",
    "max_steps": "24",
    "logging_steps": "1",
    "learning_rate": "1e-3",
    "freeze_embeddings": "false",
    "freeze_layers": "0",
    "warmup_ratio": "0.1",
    "save_strategy": "steps",
    "save_steps": "8",
}


def rows_job(root, tiny_model_dir, batch: int) -> Job:
    job = Job(root).resources()
    job.hyperparameters({**ROWS_HP, "per_device_train_batch_size": str(batch)})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(64))
    return job


@pytest.fixture(scope="module")
def one_rank_reference(tmp_path_factory, tiny_model_dir) -> Job:
    """An uninterrupted single-process job on (anchor, positive) rows, batch 8."""
    job = rows_job(tmp_path_factory.mktemp("rows") / "opt-ml", tiny_model_dir, 8)
    rerun(job, CPU_ONLY)
    return job


def test_two_ranks_rank_each_anchor_against_the_global_batchs_positives(tmp_path, tiny_model_dir, one_rank_reference):
    """2 processes of batch 4 train the model one process of batch 8 trains: each anchor's negatives are the
    other 7 positives of the global batch, the other rank's included (gathered with their gradients)."""
    job = rows_job(tmp_path / "opt-ml", tiny_model_dir, 4)
    log = rerun(job, {**CPU_ONLY, "BYOC_PROCESSES_PER_HOST": "2"})
    assert job.metrics["world_size"] == 2, log[-2000:]
    ours, theirs = losses(job), losses(one_rank_reference)
    assert set(ours) == set(theirs) == set(range(1, 25))
    # It learned something (from log(8), chance among 8 positives), so equal losses mean something.
    assert np.mean([ours[s] for s in range(19, 25)]) < 0.9 * np.mean([ours[s] for s in range(1, 7)])
    for step in ours:
        assert ours[step] == pytest.approx(theirs[step], rel=1e-4, abs=1e-5), step


def test_sigterm_saves_and_the_rerun_resumes_an_embedding_job_exactly(tmp_path, tiny_model_dir, one_rank_reference):
    job = rows_job(tmp_path / "opt-ml", tiny_model_dir, 8)
    code, log = run_until(job, "[metrics] step=10 ")
    assert code == 143, log[-3000:]
    step = stopped_step(job)
    assert (job.root / "checkpoints" / f"checkpoint-{step}" / "byoc-complete.json").exists()
    log = rerun(job, CPU_ONLY)
    assert f"resuming from {job.root / 'checkpoints' / f'checkpoint-{step}'}" in log
    assert (job.model_dir / "modules.json").exists()
    assert_same_losses(job, one_rank_reference, after=step)


# --- Matryoshka: leading dimensions trained to stand alone ------------------------------------------------


@pytest.mark.parametrize("scored", [True, False], ids=["cosent", "in-batch-negatives"])
def test_matryoshka_loss_is_sentence_transformers_matryoshka_loss(tiny_model_dir, scored):
    model = embedding.build(str(tiny_model_dir), scored=scored, max_length=32, model_kwargs={}, config_kwargs={})
    embedding.train_leading_dimensions(model, [32, 16, 4])
    model.eval()  # no dropout: the two computations draw none
    tokenizer = model.model.tokenizer
    first = tokenizer([r["anchor"] for r in topic_rows(6)], padding=True, return_tensors="pt")
    second = tokenizer([r["positive"] for r in topic_rows(6)], padding=True, return_tensors="pt")
    labels = torch.tensor([0.1, 0.9, 0.4, 0.6, 0.2, 0.8])
    ours = model(
        **first, pair_input_ids=second["input_ids"], pair_attention_mask=second["attention_mask"], labels=labels
    )["loss"]
    losses_module = compat.sentence_transformers_api()[3]
    base = model.make_objective(model.model, scored, 1)
    theirs = losses_module.MatryoshkaLoss(model.model, base, matryoshka_dims=[32, 16, 4])(
        [dict(first), dict(second)], labels
    )
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    full_size_only = base([dict(first), dict(second)], labels)
    assert ours.item() != pytest.approx(full_size_only.item(), rel=1e-3)  # the sum over the three sizes


def test_matryoshka_sizes_above_the_models_are_refused(tiny_model_dir):
    model = embedding.build(str(tiny_model_dir), scored=False, max_length=32, model_kwargs={}, config_kwargs={})
    with pytest.raises(tasks.BadParameter, match="matryoshka_dims has 64, above the model's 32 dimensions"):
        embedding.train_leading_dimensions(model, [64, 8])


def test_a_matryoshka_job_trains_and_its_cut_vectors_serve_as_sentence_transformers_cuts_them(
    job, tiny_model_dir, monkeypatch, caplog
):
    job.hyperparameters({**QUICK, "matryoshka_dims": "8,32,16"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert any("Matryoshka: the loss over the leading 32, 16, 8 of 32" in r.getMessage() for r in caplog.records)
    texts = ["a recipe for bread", "snow storms in the north"]
    SentenceTransformer = compat.sentence_transformers_api()[0]
    expected = SentenceTransformer(str(job.model_dir), device="cpu").encode(
        texts, truncate_dim=8, normalize_embeddings=True
    )
    monkeypatch.setenv("BYOC_PRECISION", "fp32")
    monkeypatch.setattr("byoc.serving.default_pipeline.nvidia_gpu", lambda: False)
    monkeypatch.syspath_prepend(str(job.model_dir / "code"))
    inference = importlib.reload(importlib.import_module("inference"))
    model = inference.model_fn(str(job.model_dir))
    data = inference.input_fn(json.dumps({"inputs": texts, "dimensions": 8}), "application/json")
    served = np.asarray(json.loads(inference.output_fn(inference.predict_fn(data, model), "application/json")[0]))
    assert served.shape == (2, 8)
    np.testing.assert_allclose(served, expected, atol=1e-5)


@pytest.mark.parametrize("task", ["single_label_classification", "sparse_embedding"])
def test_matryoshka_dims_for_a_task_without_it_fails_at_start_naming_who_takes_it(job, tiny_model_dir, tmp_path, task):
    from helpers import build_tiny_mlm

    job.hyperparameters({**QUICK, "task": task, "matryoshka_dims": "16"})
    sparse = task == "sparse_embedding"
    job.model_channel(build_tiny_mlm(tiny_model_dir, tmp_path / "mlm") if sparse else tiny_model_dir)
    rows = topic_rows(16) if sparse else [{"text": f"text {i}", "label": i % 2} for i in range(16)]
    write_jsonl(job.channel("train") / "train.jsonl", rows)
    assert entry.train() != 0
    assert "hyperparameter matryoshka_dims is a setting of an embedding model; this job trains" in job.failure


# --- cached in-batch negatives: any batch in a mini-batch's memory --------------------------------------------

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def gradients_of(tiny_model_dir, rows, matryoshka: tuple[int, ...] = (), mini_batch_size: int | None = None):
    """(loss, each weight's gradient) of one training step over `rows`, built as a job builds the model."""
    model = embedding.build(str(tiny_model_dir), False, 32, model_kwargs={}, config_kwargs=NO_DROPOUT)
    if matryoshka:
        embedding.train_leading_dimensions(model, list(matryoshka))
    if mini_batch_size:
        embedding.cache_negatives(model, mini_batch_size)
    model.train()
    tokenizer = model.model.tokenizer
    batch = {}
    for prefix, column in (("", "anchor"), ("pair_", "positive"), ("negative_", "negative")):
        encoded = tokenizer([r[column] for r in rows], padding=True, return_tensors="pt")
        batch.update({prefix + key: value for key, value in encoded.items()})
    loss = model(**batch, labels=torch.full((len(rows),), float("nan")))["loss"]
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("matryoshka", [(), (32, 16, 8)], ids=["plain", "matryoshka"])
def test_the_cached_loss_gives_the_uncached_losss_gradients(tiny_model_dir, matryoshka):
    """GradCache: the batch of 8 rows embedded 3 rows at a time, the loss's gradients at the vectors replayed a
    mini-batch at a time, end in the gradients of the uncached loss over the whole batch; with matryoshka_dims,
    of the uncached loss summed over each size's leading dimensions."""
    rows = topic_rows(8, negatives=True)
    plain_loss, plain = gradients_of(tiny_model_dir, rows, matryoshka)
    cached_loss, cached = gradients_of(tiny_model_dir, rows, matryoshka, mini_batch_size=3)
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain.keys() == cached.keys() and plain
    for name, grad in plain.items():
        torch.testing.assert_close(cached[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    if matryoshka:  # the sizes count: the sum is not the full vectors' loss alone
        assert plain_loss != pytest.approx(gradients_of(tiny_model_dir, rows)[0], rel=1e-3)


@pytest.mark.parametrize("extra", [{}, {"matryoshka_dims": "32,16", "max_steps": "2"}], ids=["plain", "matryoshka"])
def test_a_job_with_cached_negatives_trains_and_evaluates(job, tiny_model_dir, caplog, extra):
    job.hyperparameters({**QUICK, "per_device_train_batch_size": "16", "mini_batch_size": "4", **extra})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(48))
    write_jsonl(job.channel("validation") / "dev.jsonl", topic_rows(16, seed=1))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    assert any(r.getMessage().startswith("cached in-batch negatives: 4 rows a pass") for r in caplog.records)
    assert 0 <= job.metrics["eval_mrr_at_10"] <= 1 and job.metrics["hyperparameters"]["mini_batch_size"] == 4
    if extra:
        assert any(r.getMessage().startswith("Matryoshka: the loss over the leading 32, 16") for r in caplog.records)


@pytest.mark.parametrize(
    "hyperparameters, message",
    [
        ({"task": "embedding"}, "these are scored pairs, trained with CoSENT: drop mini_batch_size"),
    ],
    ids=["scored-pairs"],
)
def test_cached_negatives_where_they_do_not_apply_fail_at_start(job, tiny_model_dir, hyperparameters, message):
    job.hyperparameters({**QUICK, "mini_batch_size": "4", **hyperparameters})
    job.model_channel(tiny_model_dir)
    if "task" in hyperparameters:
        write_pairs(job.channel("train") / "train.tsv", score_rows(16))
    else:
        write_jsonl(job.channel("train") / "train.jsonl", topic_rows(16))
    assert entry.train() != 0
    assert message in job.failure


def test_cached_negatives_on_xla_or_several_processes_are_refused_by_name():
    from byoc.training.hyperparameters import parse_hyperparameters
    from byoc.training.model import recipe_settings

    args = parse_hyperparameters({"mini_batch_size": "4"})
    assert recipe_settings(args, tasks.get(EMBEDDING)) == {"mini_batch_size": 4}
    with pytest.raises(HyperparameterError, match="one process on a CPU or a GPU for now, not on XLA"):
        recipe_settings(args, tasks.get(EMBEDDING), use_xla=True)


# --- LoRA (lora_r): adapters trained, merged into the folder the job writes ---------------------------------


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_a_lora_job_trains_adapters_alone_and_writes_a_plain_folder_that_serves_as_sentence_transformers(
    job, tmp_path, caplog, monkeypatch, arch
):
    """Every linear layer's adapters trained (a decoder embedder's, Qwen3's, as an encoder's), the rest frozen;
    the folder holds the merged weights (no adapter files, no peft needed to load it) and the folder's own code
    serves it as sentence-transformers encodes it."""
    import architectures
    from safetensors.torch import load_file

    base = architectures.build(arch, tmp_path / arch)
    job.hyperparameters({**QUICK, "lora_r": "4", "learning_rate": "1e-2"})
    job.model_channel(base)
    write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
    with caplog.at_level("INFO"):
        assert entry.train() == 0, job.failure
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("LoRA: rank 4 on every linear layer") for m in messages)
    folder = job.model_dir
    assert not list(folder.rglob("adapter_config.json")) and not list(folder.rglob("adapter_model.safetensors"))
    before, after = load_file(str(base / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    assert before.keys() == after.keys()  # the base's own weights, no adapter keys
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    linear = {name for name, value in before.items() if value.dim() == 2 and "embed" not in name}
    assert changed and set(changed) <= linear  # the merged linear layers alone: embeddings, norms, biases frozen

    from sentence_transformers import SentenceTransformer

    texts = [row["anchor"] for row in topic_rows(4, seed=5)]
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts)
    inference, model = own_inference(folder, monkeypatch, "onnxruntime")
    data = inference.input_fn(json.dumps({"inputs": texts}), "application/json")
    served = np.asarray(json.loads(inference.output_fn(inference.predict_fn(data, model), "application/json")[0]))
    sys.modules.pop("inference", None)
    cosine = (served * expected).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999
