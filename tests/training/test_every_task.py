"""Multi-label, regression and token classification jobs end to end: the real `byoc train` on small
data, its metrics and predictions, the model folder (config.json's problem_type and threshold,
model.onnx), and the default handlers serving it on ONNX Runtime and on torch with the same answers
(for NER: the transformers pipeline's)."""

from __future__ import annotations

import importlib
import json
import re
import sys

import numpy as np
import pytest
import torch

from byoc.tasks import MULTI_LABEL, REGRESSION, TOKEN_CLASSIFICATION
from byoc.training import entry
from helpers import conll_sentences, emotion_rows, score_rows, write_jsonl, write_pairs

# Real jobs (not in make test-fast); each job's served answers compared with transformers' on the CPU.
pytestmark = [pytest.mark.integration, pytest.mark.cpu]

QUICK = {"max_steps": "30", "logging_steps": "10", "learning_rate": "5e-3", "per_device_train_batch_size": "8"}


def serve(model_dir, monkeypatch, backend: str):
    """The model's own code/inference.py handlers, on the given backend."""
    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", backend)
    monkeypatch.setattr("byoc.serving.default_pipeline.nvidia_gpu", lambda: False)
    monkeypatch.syspath_prepend(str(model_dir / "code"))
    inference = importlib.reload(importlib.import_module("inference"))
    return inference, inference.model_fn(str(model_dir))


def ask(inference, model, body, content_type="application/json", accept="application/json"):
    data = inference.input_fn(json.dumps(body) if isinstance(body, dict) else body, content_type)
    return inference.output_fn(inference.predict_fn(data, model), accept)


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


def test_multi_label_from_label_lists(job, tiny_model_dir, monkeypatch):
    job.hyperparameters({**QUICK, "do_predict": "true", "threshold": "0.4"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", emotion_rows(96))
    write_jsonl(job.channel("test") / "test.jsonl", emotion_rows(20, seed=1))
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    assert metrics["task"] == MULTI_LABEL and metrics["labels"] == ["anger", "fear", "joy"]
    assert "SemEval" in metrics["metric_notes"]["f1_samples"]  # the convention, said where the figure is
    for key in ("f1_micro", "f1_macro", "f1_samples", "exact_match", "jaccard"):
        assert 0 <= metrics[f"eval_{key}"] <= 1, key
    assert set(metrics["eval_f1_per_label"]) == {"anger", "fear", "joy"}
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["problem_type"] == MULTI_LABEL and config["byoc_threshold"] == 0.4
    assert "byoc_thresholds" not in config and "decision_thresholds" not in metrics  # given: not chosen
    predictions = [
        json.loads(line) for line in (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()
    ]
    assert [p["labels"] for p in predictions] == [sorted(r["labels"]) for r in emotion_rows(20, seed=1)]
    assert all(set(p["scores"]) == {"anger", "fear", "joy"} for p in predictions)

    texts = ["happy glad number 1", "angry mad scared afraid number 2", "plain words"]
    inference, model = serve(job.model_dir, monkeypatch, "onnxruntime")
    answer = json.loads(ask(inference, model, {"inputs": texts})[0])
    # Every label at or above the saved threshold, best first, from the sigmoid of torch's logits.
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    direct = AutoModelForSequenceClassification.from_pretrained(job.model_dir).eval()
    encoded = AutoTokenizer.from_pretrained(job.model_dir)(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        probs = direct(**encoded).logits.sigmoid().numpy()
    for row, expected in zip(answer, probs):
        chosen = [j for j in np.argsort(-expected) if expected[j] >= 0.4]
        assert [e["label"] for e in row] == [direct.config.id2label[int(j)] for j in chosen]
        assert [e["score"] for e in row] == pytest.approx([float(expected[j]) for j in chosen], abs=1e-4)
    everything = json.loads(ask(inference, model, {"inputs": texts, "parameters": {"threshold": 0}})[0])
    assert [len(row) for row in everything] == [3, 3, 3]
    top = json.loads(ask(inference, model, {"inputs": texts, "parameters": {"top_k": 1}})[0])
    assert [len(row) for row in top] == [1, 1, 1]
    nothing = json.loads(ask(inference, model, {"inputs": texts, "parameters": {"threshold": 1}})[0])
    assert nothing == [[], [], []]
    # CSV: one line per input, also for an input with no label.
    csv_body, kind = ask(inference, model, "\n".join(texts), "text/csv", "text/csv")
    assert kind == "text/csv" and len(csv_body.splitlines()) == 3
    csv_none, _ = ask(inference, model, {"inputs": texts, "parameters": {"threshold": 1}}, accept="text/csv")
    assert csv_none.splitlines() == ['""', '""', '""']

    torch_inference, torch_model = serve(job.model_dir, monkeypatch, "torch")
    assert torch_model["backend"] == "torch"
    again = json.loads(ask(torch_inference, torch_model, {"inputs": texts})[0])
    assert [[e["label"] for e in row] for row in again] == [[e["label"] for e in row] for row in answer]


def test_multi_label_thresholds_are_chosen_on_the_validation_data(job, tiny_model_dir):
    """No threshold given and a validation channel: the job chooses the thresholds there, saves them in
    config.json for serving, scores eval and test at them too, and predicts the test rows with them."""
    from byoc.tasks.thresholds import GRID

    job.hyperparameters({**QUICK, "do_predict": "true"})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", emotion_rows(96))
    write_jsonl(job.channel("validation") / "validation.jsonl", emotion_rows(48, seed=2))
    write_jsonl(job.channel("test") / "test.jsonl", emotion_rows(20, seed=1))
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    chosen = metrics["decision_thresholds"]
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["byoc_threshold"] == chosen["threshold"] and chosen["threshold"] in GRID
    assert config["byoc_thresholds"] == chosen["thresholds"] and set(chosen["thresholds"]) <= {"anger", "fear", "joy"}
    for split in ("eval", "test"):  # at 0.5 (as before) and at the chosen thresholds
        for key in ("f1_micro", "f1_macro", "f1_micro_tuned", "f1_macro_tuned"):
            assert 0 <= metrics[f"{split}_{key}"] <= 1, (split, key)
        assert set(metrics[f"{split}_tuned"]) == {"f1_samples", "exact_match", "jaccard", "f1_per_label"}
    own = {name: chosen["thresholds"].get(name, chosen["threshold"]) for name in ("anger", "fear", "joy")}
    for line in (job.root / "output/data/test_predictions.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert set(row["predicted"]) == {name for name, score in row["scores"].items() if score >= own[name]}


def test_multi_label_from_binary_columns_with_an_id_column(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "max_steps": "4", "validation_split": "0.25"})
    job.model_channel(tiny_model_dir)
    rows = emotion_rows(48)
    lines = ["ID\tTweet\tanger\tfear\tjoy"]
    lines += [
        f"2017-{i}\t{r['text']}\t" + "\t".join(str(int(e in r["labels"])) for e in ("anger", "fear", "joy"))
        for i, r in enumerate(rows)
    ]
    (job.channel("train") / "train.txt").write_text("\r\n".join(lines) + "\r\n")
    assert entry.train() == 0, job.failure
    metrics = job.metrics
    assert metrics["task"] == MULTI_LABEL and metrics["labels"] == ["anger", "fear", "joy"]
    assert "eval_f1_micro" in metrics and 30 <= metrics["train_samples"] <= 40  # about a quarter held out


def test_regression_of_sentence_pairs(job, tiny_model_dir, monkeypatch):
    job.hyperparameters({**QUICK, "label_column": "relatedness_score", "do_predict": "true"})
    job.model_channel(tiny_model_dir)
    write_pairs(job.channel("train") / "train.tsv", score_rows(96))
    write_pairs(job.channel("test") / "test.tsv", score_rows(16, seed=1))
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    assert metrics["task"] == REGRESSION and metrics["labels"] == ["relatedness_score"]
    for key in ("eval_pearson", "eval_spearmanr", "eval_mse", "eval_mae"):
        assert isinstance(metrics[key], float), key
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["problem_type"] == REGRESSION and config["id2label"] == {"0": "relatedness_score"}
    predictions = [
        json.loads(line) for line in (job.root / "output/data/test_predictions.jsonl").read_text().split("\n") if line
    ]
    assert [p["label"] for p in predictions] == pytest.approx([s for _, _, s in score_rows(16, seed=1)], abs=1e-5)

    pairs = [{"text": a, "text_pair": b} for a, b, _ in score_rows(3, seed=2)]
    inference, model = serve(job.model_dir, monkeypatch, "onnxruntime")
    answer = json.loads(ask(inference, model, {"inputs": pairs})[0])
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    direct = AutoModelForSequenceClassification.from_pretrained(job.model_dir).eval()
    encoded = AutoTokenizer.from_pretrained(job.model_dir)(
        [p["text"] for p in pairs], [p["text_pair"] for p in pairs], padding=True, return_tensors="pt"
    )
    with torch.inference_mode():
        values = direct(**encoded).logits.reshape(-1).tolist()
    assert [a["label"] for a in answer] == ["relatedness_score"] * 3
    assert [a["score"] for a in answer] == pytest.approx(values, abs=1e-4)
    csv_body, _ = ask(inference, model, {"inputs": pairs}, accept="text/csv")
    assert [line.split(",")[0] for line in csv_body.splitlines()] == ["relatedness_score"] * 3
    lines, kind = ask(inference, model, {"inputs": pairs}, accept="application/jsonlines")
    assert [json.loads(line)["score"] for line in lines.splitlines()] == pytest.approx(values, abs=1e-4)


def test_regression_with_whole_number_scores_on_request(job, tiny_model_dir):
    job.hyperparameters({**QUICK, "max_steps": "4", "task": "regression"})
    job.model_channel(tiny_model_dir)
    (job.channel("train") / "train.csv").write_text(
        "text,rating\n" + "".join(f"text {i},{i % 5 + 1}\n" for i in range(40))
    )
    assert entry.train() == 0, job.failure
    assert job.metrics["task"] == REGRESSION and "eval_pearson" not in job.metrics  # no eval data: no eval


@pytest.mark.parametrize(
    "hyperparameters,content,words",
    [
        ({"task": "regression"}, "text,label\na,pos\nb,neg\n", ["task=regression", "'pos'"]),
        ({}, '{"text": "a", "label": 1}\n{"text": "b", "label": "neg"}\n', ["mixes label kinds", "row 2"]),
        ({}, '{"text": "a", "label": 1.5}\n{"text": "b", "label": Infinity}\n', ["finite", "row 2"]),
        ({}, '{"text": "a", "label": 1.5}\n{"text": "b", "label": 1e39}\n', ["float32", "row 2", "1e+39"]),
        ({"task": "regression"}, "text,label\na,1\nb," + "9" * 400 + "\n", ["float32", "row 2"]),
        ({"task": "single_label"}, '{"text": "a", "labels": ["x"]}\n', ["multi_label"]),
        (
            {"label_smoothing": "0.1"},
            '{"text": "a", "labels": ["x"]}\n{"text": "b", "labels": []}\n',
            ["label_smoothing"],
        ),
        ({"task": "ner"}, "text,label\na,pos\n", ["needs token data"]),
        ({"task": "regression"}, "a\tB-X\nb\tO\n", ["token data"]),
        ({}, "a B-X\nb\n", ["line 2", "token without its tag"]),
        ({}, "a B-X x\nb O\n", ["line 2", "the lines before have 3"]),
        ({"task": "clustering"}, "text,label\na,pos\n", ["task must be"]),
        ({}, "text,toxic,insult\na,0,0\nb,0,0\n", ["no labels at all", "toxic, insult"]),
        ({"label_columns": "toxic,insult,text"}, "text,toxic,insult\na,1,0\n", ["label_columns names 'text'"]),
        ({"task": "multi_label", "label_delimiter": ""}, 'text,label\na,"x,y"\n', ["label_delimiter is empty"]),
    ],
)
def test_bad_task_data_fails_clearly(job, tiny_model_dir, hyperparameters, content, words):
    job.hyperparameters({**QUICK, "max_steps": "2", **hyperparameters})
    job.model_channel(tiny_model_dir)
    name = "train.jsonl" if content.startswith("{") else "train.csv" if "," in content else "train.conll"
    (job.channel("train") / name).write_text(content)
    assert entry.train() != 0
    failure = job.failure
    assert failure is not None and "Traceback" not in failure
    for word in words:
        assert word in failure, failure
    assert not (job.model_dir / "model.safetensors").exists()


# --------------------------------------------------------------------------- token classification (NER)


def test_token_classification_from_conll_files(job, tiny_model_dir, monkeypatch):
    job.hyperparameters({**QUICK, "max_steps": "40", "do_predict": "true"})
    job.model_channel(tiny_model_dir)
    (job.channel("train") / "train.conll").write_text(conll_sentences(64, iob1=True))  # IOB1: converted
    (job.channel("test") / "test.txt").write_text(conll_sentences(12, seed=1))  # a .txt that reads as CoNLL
    assert entry.train() == 0, job.failure

    metrics = job.metrics
    assert metrics["task"] == TOKEN_CLASSIFICATION and metrics["labels"] == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    for key in ("precision", "recall", "f1", "accuracy"):
        assert 0 <= metrics[f"eval_{key}"] <= 1, key
    assert set(metrics["eval_f1_per_type"]) <= {"LOC", "PER"}
    config = json.loads((job.model_dir / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"] and (job.model_dir / "model.onnx").exists()
    assert config["byoc_word_tags"] == "first"  # each word's tag on its first sub-token: serving's default words
    written = (job.root / "output/data/test_predictions.jsonl").read_text().splitlines()
    first = json.loads(written[0])
    assert first["index"] == 0 and first["tags"] == ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]
    assert len(first["predicted"]) == 6

    texts = ["John Smith lives in Paris now", "mary smith lives in oslo now and ahmed smith lives in lima"]
    from transformers import pipeline

    reference = pipeline("token-classification", model=str(job.model_dir), device="cpu")
    for backend in ("onnxruntime", "torch"):
        inference, model = serve(job.model_dir, monkeypatch, backend)
        assert model["backend"] == backend
        for strategy in ("none", "simple", "first", "average", "max"):
            body = {"inputs": texts, "parameters": {"aggregation_strategy": strategy}}
            answer = json.loads(ask(inference, model, body)[0])
            expected = reference(texts, aggregation_strategy=strategy)
            assert sum(len(entities) for entities in answer) >= 3, answer  # the trained model finds entities
            for got, want, text in zip(answer, expected, texts):
                key = "entity" if strategy == "none" else "entity_group"
                assert [(e[key], e["start"], e["end"]) for e in got] == [(e[key], e["start"], e["end"]) for e in want]
                assert [e["score"] for e in got] == pytest.approx([float(e["score"]) for e in want], abs=1e-4)
                assert all(e["word"] == text[e["start"] : e["end"]] for e in got)  # the text as sent
        # No strategy: the words and tags the job trained on, each whitespace-separated word (whole, with the
        # punctuation in it) tagged by its first sub-token.
        raw = [*texts, "John Smith-Jones lives in U.S.-Paris, now", "mary o'smith lives in st.oslo now"]
        answer = json.loads(ask(inference, model, {"inputs": raw})[0])
        for got, text in zip(answer, raw):
            want = trained_words(reference, text)
            assert [(e["entity_group"], e["start"], e["end"]) for e in got] == [w[:3] for w in want], text
            assert [e["score"] for e in got] == pytest.approx([w[3] for w in want], abs=1e-4)
        with pytest.raises(Exception, match="CSV"):
            ask(inference, model, {"inputs": texts}, accept="text/csv")
        for bad in (
            {"inputs": ["  "]},
            {"inputs": [["a", "b"]]},
            {"inputs": "x", "parameters": {"aggregation_strategy": "all"}},
        ):
            with pytest.raises(Exception, match="empty|pair|aggregation_strategy"):
                ask(inference, model, bad)


def trained_words(reference, text: str) -> list[tuple[str, int, int, float]]:
    """The entities of `text` with each whitespace-separated word tagged by its first sub-token (from the
    pipeline's tags of every token), grouped as the pipeline groups: (type, start, end, mean score)."""
    tokens = reference(text, aggregation_strategy="none", ignore_labels=[])
    groups: list[list] = []
    for word in re.finditer(r"\S+", text):
        first = next((t for t in tokens if word.start() <= t["start"] < word.end()), None)
        if first is None:
            continue
        prefix, kind = (
            (first["entity"][0], first["entity"][2:]) if first["entity"][1:2] == "-" else ("I", first["entity"])
        )
        if groups and prefix != "B" and groups[-1][0] == kind:
            groups[-1][2], groups[-1][3] = word.end(), groups[-1][3] + [float(first["score"])]
        else:
            groups.append([kind, word.start(), word.end(), [float(first["score"])]])
    return [(kind, start, end, sum(scores) / len(scores)) for kind, start, end, scores in groups if kind != "O"]


def test_a_conll_file_without_blank_lines_is_trained_whole_and_said_so(job, tiny_model_dir, caplog):
    """Without blank lines 60 sentences read as one of 360 words, far past the tiny model's 128 positions:
    training covers it in windows (every word trained on), evaluation says how many words it cuts."""
    job.hyperparameters({**QUICK, "max_steps": "2"})
    job.model_channel(tiny_model_dir)
    joined = "\n".join(line for line in conll_sentences(60).splitlines()[2:] if line) + "\n"
    (job.channel("train") / "train.conll").write_text(joined)
    (job.channel("test") / "test.conll").write_text(joined)
    with caplog.at_level("WARNING"):
        assert entry.train() == 0, job.failure
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    windowed = next(w for w in warnings if w.startswith("train: sentences longer than max_length=128"))
    rows = int(windowed.split("(")[1].split()[0])
    assert rows >= 360 // 126 and "from 1 sentences" in windowed and "blank lines" in windowed
    cut = next(w for w in warnings if w.startswith("test: 1 sentences are longer than max_length=128"))
    assert "words past it are not evaluated" in cut
    assert int(cut.split("; ")[1].split()[0]) >= 360 - 126


def test_words_that_tokenize_to_nothing_are_counted_and_an_eval_set_of_only_them_fails(job, tiny_model_dir, caplog):
    """Zero-width and control characters are words in CoNLL yet no token: their tags were skipped silently,
    and an eval set of only such words evaluated to eval_loss NaN and F1 0.0 without a word."""
    job.hyperparameters({**QUICK, "max_steps": "2"})
    job.model_channel(tiny_model_dir)
    empty = "\u200b\tB-PER\n\x07\tO\n"
    (job.channel("train") / "train.conll").write_text(conll_sentences(8) + empty + "\n" + empty)
    (job.channel("validation") / "v.conll").write_text(empty + "\n" + empty)
    with caplog.at_level("WARNING"):
        assert entry.train() != 0
    warned = [r.getMessage() for r in caplog.records if "tokenize to nothing" in r.getMessage()]
    assert warned and warned[0].startswith("train: 4 words in 2 sentences tokenize to nothing"), warned
    assert "The eval data has no word the tokenizer keeps" in job.failure


def test_token_records_with_class_label_ids(job, tiny_model_dir):
    import datasets

    names = ["O", "B-PER", "I-PER"]
    features = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names)),
        }
    )
    rows = {"tokens": [["john", "smith", "runs"]] * 24, "ner_tags": [[1, 2, 0]] * 24}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(job.channel("train") / "ds"))
    job.hyperparameters({**QUICK, "max_steps": "3", "validation_split": "0.25", "label_all_tokens": "true"})
    job.model_channel(tiny_model_dir)
    assert entry.train() == 0, job.failure
    assert job.metrics["task"] == TOKEN_CLASSIFICATION and "eval_f1" in job.metrics


@pytest.mark.parametrize("task", ["single_label", "multi_label", "regression", "ner"])
def test_the_metric_definitions_read_every_evaluation_from_a_real_log(job, tiny_model_dir, task):
    """Automatic model tuning reads objectives from the log with METRIC_DEFINITIONS: applied to a real
    job's log, they find each evaluation once, with the values metrics.json holds."""
    import re

    from byoc.training.metrics import METRIC_DEFINITIONS
    from helpers import run_train_process, sentiment_rows, write_csv

    hp = {**QUICK, "max_steps": "-1", "epochs": "2", "eval_strategy": "epoch", "logging_steps": "5"}
    job.hyperparameters({**hp, **({"label_column": "relatedness_score"} if task == "regression" else {})})
    job.model_channel(tiny_model_dir)
    train, validation, test = job.channel("train"), job.channel("validation"), job.channel("test")
    if task == "single_label":
        for folder, rows in ((train, 32), (validation, 8), (test, 8)):
            write_csv(folder / "d.csv", sentiment_rows(rows))
    elif task == "multi_label":
        for folder, rows in ((train, 32), (validation, 8), (test, 8)):
            write_jsonl(folder / "d.jsonl", emotion_rows(rows, seed=rows))
    elif task == "regression":
        for folder, rows in ((train, 32), (validation, 8), (test, 8)):
            write_pairs(folder / "d.tsv", score_rows(rows, seed=rows))
    else:
        for folder, rows in ((train, 32), (validation, 8), (test, 8)):
            (folder / "d.conll").write_text(conll_sentences(rows, seed=rows))
    done = run_train_process(job.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found: dict[str, list[float]] = {}
    for line in (done.stdout + done.stderr).splitlines():
        for definition in METRIC_DEFINITIONS:
            match = re.search(definition["Regex"], line)
            if match:
                found.setdefault(definition["Name"], []).append(float(match.group(1)))
    metrics = job.metrics
    evaluated = {k for k, v in metrics.items() if k.startswith(("eval_", "test_")) and isinstance(v, float)}
    evaluated -= {k for k in evaluated if k.endswith(("_runtime", "_per_second"))}
    assert evaluated and len(found["eval:loss"]) == 2 and len(found["test:loss"]) == 1  # an evaluation per epoch
    for key in evaluated:
        split, name = key.split("_", 1)
        values = found.get(f"{split}:{name}")
        assert values, f"no metric definition reads {key}"
        assert values[-1] == pytest.approx(metrics[key], rel=1e-5, abs=1e-6), key
