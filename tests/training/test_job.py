"""The real `byoc train` on temporary /opt/ml trees: layouts, outputs, failures, the toolkit hook."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import datasets
import pytest
import torch

from byoc.training import entry
from helpers import run_train_process, sentiment_rows, shared_data, write_csv

pytestmark = pytest.mark.integration  # real jobs in processes: not in make test-fast

QUICK = {"max_steps": "8", "logging_steps": "4", "learning_rate": "5e-3", "per_device_train_batch_size": "8"}


def train_in_process(job) -> int:
    """`byoc train` in this process (same code path as the command, without a 5 s interpreter start)."""
    return entry.train()


def assert_deployable_model(model_dir: Path, labels: list[str]) -> None:
    files = {p.name for p in model_dir.iterdir()}
    assert "model.safetensors" in files and "config.json" in files and "tokenizer.json" in files
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in files)
    assert (model_dir / "code" / "inference.py").exists() and (model_dir / "code" / "requirements.txt").exists()
    config = json.loads((model_dir / "config.json").read_text())
    assert [config["id2label"][str(i)] for i in range(len(labels))] == labels
    assert config["label2id"] == {name: i for i, name in enumerate(labels)}


def test_csv_channels_end_to_end(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "do_predict": "true"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "train.csv", sentiment_rows(64))
    write_csv(job.channel("validation") / "val.csv", sentiment_rows(16))
    write_csv(job.channel("test") / "test.csv", sentiment_rows(12))
    assert train_in_process(job) == 0, job.failure
    assert_deployable_model(job.model_dir, ["negative", "positive"])
    metrics = job.metrics
    for key in (
        "train_runtime",
        "train_samples_per_second",
        "train_loss",
        "epoch",
        "eval_loss",
        "eval_accuracy",
        "eval_f1",
        "test_accuracy",
        "test_f1",
    ):
        assert isinstance(metrics[key], float), key
    assert any("loss" in h for h in metrics["history"]) and metrics["labels"] == ["negative", "positive"]
    assert (job.root / "output/data/metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert list((job.root / "output/tensorboard").glob("events.out.tfevents.*"))
    predictions = (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 12 and {"label", "predicted", "score"} <= set(json.loads(predictions[0]))
    # In the test file's order (evaluation itself runs sorted by length).
    assert [json.loads(p)["label"] for p in predictions] == [label for _, label in sentiment_rows(12)]
    assert [json.loads(p)["index"] for p in predictions] == list(range(12))
    assert job.failure is None


def test_texts_longer_than_the_model_positions(job, tiny_model_dir):
    """The tiny model has 128 positions while its tokenizer claims 512: texts are cut to 128."""
    job.hyperparameters({**QUICK, "max_length": "512"})
    job.model_channel(tiny_model_dir)
    long_text = "this is a very long review " * 60
    write_csv(job.channel("train") / "t.csv", sentiment_rows(16) + [(long_text, "positive")])
    assert train_in_process(job) == 0, job.failure
    assert json.loads((job.model_dir / "tokenizer_config.json").read_text())["model_max_length"] == 128


def test_saved_datasetdict_with_classlabel_and_pretrained_model(job, tiny_model_dir):
    """The tutorials' layout: one train channel holding a save_to_disk DatasetDict."""
    rows = sentiment_rows(48)
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    make = lambda rs: datasets.Dataset.from_dict(
        {"sentence": [t for t, _ in rs], "label": [1 if lab == "positive" else 0 for _, lab in rs]}, features=features
    )
    datasets.DatasetDict({"train": make(rows), "test": make(rows[:10])}).save_to_disk(str(job.channel("train")))
    job.hyperparameters({**QUICK, "model_name_or_path": str(tiny_model_dir)})  # a path, no model channel
    assert train_in_process(job) == 0, job.failure
    assert_deployable_model(job.model_dir, ["neg", "pos"])
    assert "eval_accuracy" in job.metrics  # evaluated on the test split, as the tutorials do


def test_pretokenized_dataset_is_used_as_it_is(job, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = sentiment_rows(32)
    enc = tokenizer([t for t, _ in rows], truncation=True, max_length=16, padding="max_length")
    ds = datasets.Dataset.from_dict({**enc, "labels": [int(lab == "positive") for _, lab in rows]})
    ds.save_to_disk(str(job.channel("train")))
    job.model_channel(tiny_model_dir)
    job.hyperparameters(QUICK)
    assert train_in_process(job) == 0, job.failure
    assert_deployable_model(job.model_dir, ["0", "1"])


def test_validation_split_and_model_tarball(job, tiny_model_dir, tmp_path):
    """A model channel holding an earlier job's model.tar.gz; eval held out from train."""
    import tarfile

    with tarfile.open(job.channel("model") / "model.tar.gz", "w:gz") as tar:
        for item in tiny_model_dir.iterdir():
            tar.add(item, arcname=item.name)
    write_csv(job.channel("train") / "data.csv", sentiment_rows(60), header=("review", "sentiment"))
    job.hyperparameters({**QUICK, "validation_split": "0.2", "text_column": "review"})
    assert train_in_process(job) == 0, job.failure
    assert "eval_accuracy" in job.metrics
    assert not list((job.root / "input/data/model").glob("config.json"))  # unpacked elsewhere
    assert (job.model_dir / "model.onnx").exists()  # the serving graph, by default


def test_int8_serving_graph_on_request(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "max_steps": "2", "serving_int8": "true"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "train.csv", sentiment_rows(32))
    assert train_in_process(job) == 0, job.failure
    assert (job.model_dir / "model.onnx").exists() and (job.model_dir / "model.int8.onnx").exists()
    assert not (job.model_dir.parent / "model" / "int8.onnx").exists()


def test_serving_graph_can_be_left_out(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "max_steps": "2", "serving_graph": "false"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "train.csv", sentiment_rows(32))
    assert train_in_process(job) == 0, job.failure
    assert (job.model_dir / "model.safetensors").exists() and not (job.model_dir / "model.onnx").exists()


def test_the_model_folder_records_the_length_training_used_and_serving_truncates_there(job, tiny_model_dir):
    """Training truncated at max_length: the saved tokenizer says so, and the default handlers cut
    there too, instead of at the pretrained model's 512 (positions fine-tuning never saw, at several
    times the cost of a forward pass)."""
    from byoc.serving import default_pipeline

    job.hyperparameters({**QUICK, "max_steps": "3", "max_length": "24"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "train.csv", sentiment_rows(24))
    assert train_in_process(job) == 0, job.failure
    saved = json.loads((job.model_dir / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == 24
    model = default_pipeline.model_fn(str(job.model_dir))
    assert model["max_length"] == 24
    (encoded,) = model["encode"](["word " * 200])
    assert len(encoded["input_ids"]) == 24


def test_trained_model_serves_through_the_default_handlers(job, tiny_model_dir, monkeypatch):
    job.hyperparameters({**QUICK, "max_steps": "30"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "train.csv", sentiment_rows(64))
    assert train_in_process(job) == 0, job.failure
    # The CPU default: ONNX Runtime (on a GPU, auto picks torch).
    monkeypatch.setattr("byoc.serving.default_pipeline.nvidia_gpu", lambda: False)
    sys.path.insert(0, str(job.model_dir / "code"))
    try:
        import importlib

        inference = importlib.import_module("inference")
        importlib.reload(inference)
        model = inference.model_fn(str(job.model_dir))
        texts = [POS, NEG] = ["i love this so much number 1000", "i hate this a lot number 1001"]
        data = inference.input_fn(json.dumps({"inputs": texts, "parameters": {"top_k": 2}}), "application/json")
        answer = json.loads(inference.output_fn(inference.predict_fn(data, model), "application/json")[0])
        assert [len(a) for a in answer] == [2, 2]
        # The handlers' answer (ONNX Runtime on the graph training wrote) equals running the model directly.
        assert model["backend"] == "onnxruntime" and (job.model_dir / "model.onnx").exists()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        direct_model = AutoModelForSequenceClassification.from_pretrained(job.model_dir).eval()
        enc = AutoTokenizer.from_pretrained(job.model_dir)(texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            direct = direct_model(**enc).logits.softmax(-1)
        id2label = direct_model.config.id2label
        for row, probs in zip(answer, direct):
            assert row[0]["label"] == id2label[int(probs.argmax())]
            assert row[0]["score"] == pytest.approx(float(probs.max()), abs=1e-5)
        csv_body, kind = inference.output_fn(
            inference.predict_fn(inference.input_fn(POS + "\n", "text/csv"), model), "text/csv"
        )
        assert kind == "text/csv" and csv_body.split(",")[0] == answer[0][0]["label"]
    finally:
        sys.path.remove(str(job.model_dir / "code"))
        sys.modules.pop("inference", None)  # a later test's server imports its own inference.py


# --- failures: non-zero exit, a one-line failure file that says how to fix it, no model ---------


def assert_failed(job, code: int, *words: str) -> None:
    assert code != 0
    failure = job.failure
    assert failure is not None and failure.count("\n") == 1, failure
    for word in words:
        assert word in failure, failure
    assert "Traceback" not in failure
    assert not (job.model_dir / "model.safetensors").exists() and not (job.model_dir / "config.json").exists()


def test_bad_hyperparameter(job, tiny_model_dir):
    job.hyperparameters({"learnin_rate": "0.1"})
    assert_failed(job, train_in_process(job), "learnin_rate", "learning_rate")


def test_a_negative_seed_is_refused_when_read(job, tiny_model_dir):
    """Issue 21: seed=-1 passed validation and failed 14 s later as "unexpected error: ValueError"."""
    job.hyperparameters({**QUICK, "seed": "-1"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(8))
    assert_failed(job, train_in_process(job), "hyperparameter seed must be from 0 to 4294967295, got -1")


def test_missing_train_channel(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("test") / "t.csv", sentiment_rows(8))
    assert_failed(job, train_in_process(job), "train")


def test_missing_column(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "label_column": "stars"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(8))
    assert_failed(job, train_in_process(job), "stars", "label_column")


def test_empty_data(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    (job.channel("train") / "train.csv").write_text("text,label\n")
    assert_failed(job, train_in_process(job), "train")


def test_unreadable_model(job):
    job.hyperparameters(QUICK)
    (job.channel("model") / "config.json").write_text("{ broken")
    write_csv(job.channel("train") / "t.csv", sentiment_rows(8))
    assert_failed(job, train_in_process(job), "model")


def test_model_channel_without_a_model(job):
    job.hyperparameters(QUICK)
    (job.channel("model") / "notes.txt").write_text("nothing here")
    write_csv(job.channel("train") / "t.csv", sentiment_rows(8))
    assert_failed(job, train_in_process(job), "no model", "config.json")


def test_unknown_eval_label(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(8))
    write_csv(job.channel("validation") / "v.csv", [("so so", "neutral")])
    assert_failed(job, train_in_process(job), "neutral")


def test_pipe_mode(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    write_csv(job.channel("train", mode="Pipe") / "t.csv", sentiment_rows(8))
    assert_failed(job, train_in_process(job), "Pipe")


def test_out_of_memory_is_reported_as_such(job, tiny_model_dir, monkeypatch):
    """A real torch.OutOfMemoryError raised inside the training step (CUDA cannot run here)."""
    from byoc.training.trainer import TaskTrainer

    def exhausted(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(TaskTrainer, "training_step", exhausted)
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(16))
    assert_failed(job, train_in_process(job), "out of memory", "per_device_train_batch_size")


def test_a_hundred_thousand_labels_train_evaluate_and_save(job, tiny_model_dir):
    """Issue 21: the final evaluation built a 100,000 x 100,000 confusion matrix (74.5 GiB): MemoryError
    after training, no model, and a failure blaming the batch size. (Label ids 0..99,999: "0".."99999".)"""
    rows = [{"input_ids": [101, 2000 + i % 50, 102], "labels": (i * 1_563) % 100_000} for i in range(64)]
    rows[0]["labels"] = 99_999
    write_jsonl(job.channel("train") / "train.jsonl", rows)
    write_jsonl(job.channel("test") / "test.jsonl", rows[:16])
    job.model_channel(tiny_model_dir)
    job.hyperparameters({**QUICK, "max_steps": "2", "do_predict": "true", "serving_graph": "false"})
    assert train_in_process(job) == 0, job.failure
    metrics = job.metrics
    assert metrics["num_labels"] == 100_000 and 0 <= metrics["eval_accuracy"] <= 1 and "eval_f1" in metrics
    assert len((job.root / "output/data/test_predictions.jsonl").read_text().splitlines()) == 16
    assert json.loads((job.model_dir / "config.json").read_text())["id2label"]["99999"] == "99999"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_label_id_of_a_trillion_is_refused_before_any_work(job, tiny_model_dir):
    """Issue 21: it built 10^12 label names (MemoryError after 27 s, blamed on the batch size)."""
    write_jsonl(
        job.channel("train") / "train.jsonl",
        [{"input_ids": [101, 102], "labels": 10**12 if i == 5 else i % 2} for i in range(16)],
    )
    job.model_channel(tiny_model_dir)
    job.hyperparameters(QUICK)
    assert_failed(job, train_in_process(job), "label id 1000000000000", "column 'labels'", "999999", "row 6")
    assert "batch" not in job.failure


def test_a_failed_final_evaluation_still_saves_the_trained_model(job, tiny_model_dir, monkeypatch):
    """Issue 21: a failure after training (here memory, while computing the metrics) cost the model;
    now the model is published and then the job fails, saying so and why, without blaming the batch size."""
    import byoc.tasks.single_label

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(byoc.tasks.single_label, "classification_metrics", exhausted)
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(32))
    write_csv(job.channel("test") / "t.csv", sentiment_rows(8))
    assert train_in_process(job) == 1
    assert_deployable_model(job.model_dir, ["negative", "positive"])
    failure = job.failure
    assert failure.startswith(
        f"training finished and the model was saved to {job.model_dir}, but the final "
        "evaluation failed: out of memory while computing the evaluation metrics"
    ), failure
    assert "per_device_train_batch_size" not in failure and "Traceback" not in failure
    assert "train_loss" in job.metrics and "out of memory" in job.metrics["evaluation_failure"]


def test_failed_test_predictions_fail_the_job_after_the_model_is_saved(job, tiny_model_dir, monkeypatch):
    from byoc.training import job as job_module

    def broken(*args, **kwargs):
        raise KeyError("label 7")

    monkeypatch.setattr(job_module, "write_predictions", broken)
    job.hyperparameters({**QUICK, "do_predict": "true"})
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(32))
    write_csv(job.channel("test") / "t.csv", sentiment_rows(8))
    assert train_in_process(job) == 1
    assert (job.model_dir / "model.safetensors").exists() and "eval_accuracy" in job.metrics
    assert "but writing the test predictions failed: unexpected error: KeyError: 'label 7'" in job.failure


def test_failure_while_saving_leaves_no_model(job, tiny_model_dir, monkeypatch):
    from transformers import PreTrainedTokenizerBase

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", disk_full)
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(16))
    assert_failed(job, train_in_process(job), "No space left on device")
    assert not job.model_dir.exists() or not any(job.model_dir.iterdir())


# --- the command itself, and the sagemaker-training toolkit's `train` -----------------------


def test_byoc_command_in_its_own_process(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(32))
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "[metrics]" in done.stdout and "training finished" in done.stdout
    assert (job.model_dir / "model.safetensors").exists()


def test_toolkit_train_keeps_the_failure_and_exit_code(job, tiny_model_dir):
    """The toolkit's `train` turns SystemExit into 0; the hook must still exit non-zero."""
    job.hyperparameters({"epochz": "1"})
    write_csv(job.channel("train") / "t.csv", sentiment_rows(8))  # the toolkit needs inputdataconfig.json
    toolkit = str(Path(sys.executable).parent / "train")
    done = run_train_process(job.root, toolkit, env={"SAGEMAKER_TRAINING_MODULE": "byoc.cli:toolkit_train"})
    assert done.returncode == 1, done.stdout[-2000:]
    assert "'epochz'" in job.failure and "'epochs'" in job.failure


def test_toolkit_train_runs_the_job(job, tiny_model_dir):
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(32))
    toolkit = str(Path(sys.executable).parent / "train")
    done = run_train_process(job.root, toolkit, env={"SAGEMAKER_TRAINING_MODULE": "byoc.cli:toolkit_train"})
    assert done.returncode == 0, done.stdout[-3000:]
    assert (job.model_dir / "model.safetensors").exists() and (job.root / "output/success").exists()


def test_real_uci_files_with_the_bundled_minilm(job):
    """Headerless `sentence<TAB>label` files, the pretrained MiniLM, a read-only-style channel."""
    train = job.channel("train")
    for name in ("yelp_labelled.txt", "amazon_cells_labelled.txt"):
        shutil.copy(shared_data.folder("uci-sentiment") / name, train / name)
    before = sorted((p.name, p.stat().st_mtime) for p in train.iterdir())
    job.hyperparameters(
        {"max_steps": "10", "logging_steps": "5", "validation_split": "0.1", "per_device_train_batch_size": "16"}
    )
    assert train_in_process(job) == 0, job.failure
    assert sorted((p.name, p.stat().st_mtime) for p in train.iterdir()) == before
    assert job.metrics["train_samples"] == 1800 and job.metrics["labels"] == ["0", "1"]


def test_user_script_code_train_py(job, tiny_model_dir):
    """code/train.py, the script users copy, runs the same job on the same contract."""
    job.hyperparameters(QUICK)
    job.model_channel(tiny_model_dir)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(32))
    write_csv(job.channel("test") / "t.csv", sentiment_rows(8))
    script = Path(__file__).resolve().parents[2] / "code" / "train.py"
    done = run_train_process(job.root, sys.executable, str(script))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_deployable_model(job.model_dir, ["negative", "positive"])
    assert "eval_accuracy" in done.stdout


def test_user_script_reports_failures(job):
    job.hyperparameters({"epochz": "1"})
    script = Path(__file__).resolve().parents[2] / "code" / "train.py"
    done = run_train_process(job.root, sys.executable, str(script))
    assert done.returncode == 1 and "'epochs'" in job.failure


def test_pretokenized_right_padding_is_trimmed():
    from byoc.training.tokenization import with_length

    ds = datasets.Dataset.from_dict(
        {
            "input_ids": [[101, 7, 102, 0, 0], [0, 0, 101, 8, 102]],
            "attention_mask": [[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]],  # right-padded, then left-padded
            "labels": [0, 1],
        }
    )
    out = with_length(ds)
    assert out["input_ids"] == [[101, 7, 102], [0, 0, 101, 8, 102]]
    assert out["attention_mask"] == [[1, 1, 1], [0, 0, 1, 1, 1]]
    assert out["length"] == [3, 5] and out["labels"] == [0, 1]


def test_tutorial_layout_torch_formatted_padded_datasets(job, tiny_model_dir):
    """The HF SageMaker getting-started layout: tokenized, padded to max_length, set_format("torch"),
    saved with save_to_disk into separate train and test channels."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for channel, rows in (("train", sentiment_rows(48)), ("test", sentiment_rows(12))):
        ds = datasets.Dataset.from_dict(
            {"text": [t for t, _ in rows], "label": [int(lab == "positive") for _, lab in rows]}
        )
        ds = ds.map(lambda b: tokenizer(b["text"], padding="max_length", truncation=True, max_length=64), batched=True)
        ds = ds.rename_column("label", "labels")
        ds.set_format("torch", columns=["input_ids", "attention_mask", "labels"])
        ds.save_to_disk(str(job.channel(channel)))
    job.hyperparameters(
        {
            "epochs": "1",
            "train_batch_size": "8",
            "model_id": str(tiny_model_dir),
            "learning_rate": "5e-3",
            "max_steps": "8",
        }
    )
    assert train_in_process(job) == 0, job.failure
    assert "eval_accuracy" in job.metrics and job.metrics["train_samples"] == 48


def test_shards_labels_move_into_the_shared_label_map():
    """Hosts training on their own shards agree on the union of labels: each host's class ids, label ids
    and 0/1 vectors (multi-label) and tag ids per token (NER, -100 kept) are renumbered into it."""
    import numpy as np

    from byoc.training.shards import _remapped

    remap = np.array([0, 2])  # this shard's labels a, c in the shared map a, b, c
    assert _remapped([1, 0], remap, 3) == [2, 0]
    assert _remapped([[1.0, 1.0], [0.0, 1.0]], remap, 3) == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
    assert _remapped([[-100, 1, 0, -100]], remap, 3) == [[-100, 2, 0, -100]]
    assert _remapped([[0, 1], [], [1]], remap, 3) == [[0, 2], [], [2]]  # multi-label: each row's label ids
