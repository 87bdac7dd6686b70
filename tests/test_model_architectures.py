"""The architecture matrix: for each architecture users fine-tune (tests/architectures.py: tiny random models of
BERT, DistilBERT, ELECTRA, RoBERTa, XLM-RoBERTa, DeBERTa-v3, ModernBERT and a Qwen3 decoder, each with its own
tokenizer family), every task byoc trains runs the real job a few steps from the plain encoder, exports its
serving graph, and the folder's own code/inference.py answers the same on ONNX Runtime and on torch (and in
int8, answers of the same shape). A cell an architecture cannot do fails the job at start, by name.

Both tiers run every cell (about a minute each on two cores)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import architectures
import numpy as np
import pytest

from byoc.training import entry
from helpers import conll_sentences, emotion_rows, own_inference, score_rows, topic_rows, write_jsonl, write_pairs

# Real jobs; ONNX Runtime's answers compared with torch's on the CPU, at fp32.
pytestmark = [pytest.mark.integration, pytest.mark.cpu]

QUICK = {"max_steps": "3", "logging_steps": "3", "per_device_train_batch_size": "8", "learning_rate": "1e-3"}
TEXTS = [
    "a man plays the guitar",
    "rain is expected tomorrow in paris",
    "john smith lives in lima now " * 30,  # past the models' 128 tokens: cut (NER: windows)
]
TASKS = ("single_label", "multi_label", "regression", "ner", "embedding", "reranker", "sparse")


def write(task: str, channel: Path) -> None:
    """A few rows of the task's data, in the layout a user gives it."""
    if task == "single_label":
        rows = [{"text": f"{word} text {i}", "label": word} for i in range(8) for word in ("red", "blue", "green")]
        write_jsonl(channel / "train.jsonl", rows)
    elif task == "multi_label":
        write_jsonl(channel / "train.jsonl", emotion_rows(24))
    elif task == "regression":
        write_pairs(channel / "train.tsv", score_rows(24))
    elif task == "ner":
        (channel / "train.conll").write_text(conll_sentences(24))
    else:
        write_jsonl(channel / "train.jsonl", topic_rows(24, negatives=True))


HYPERPARAMETERS = {
    "embedding": {"task": "embedding"},
    "reranker": {"task": "reranker"},
    "sparse": {"task": "sparse_embedding"},
}
BODIES = {
    "single_label": {"inputs": TEXTS, "parameters": {"top_k": 3}},
    "multi_label": {"inputs": TEXTS, "parameters": {"top_k": 3}},
    "regression": {"inputs": [{"text": TEXTS[0], "text_pair": TEXTS[1]}, {"text": TEXTS[2], "text_pair": TEXTS[2]}]},
    "ner": {"inputs": TEXTS, "parameters": {"aggregation_strategy": "none"}},
    "embedding": {"inputs": TEXTS},
    "reranker": {"query": TEXTS[0], "texts": TEXTS},
    "sparse": {"inputs": TEXTS},
}
# What an architecture cannot train, and the job's words at start.
REFUSED = {("qwen3", "sparse"): "masked-language-model"}


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


@pytest.fixture(scope="module")
def encoders(tmp_path_factory) -> dict[str, Path]:
    """Each architecture's plain encoder folder, built once."""
    root = tmp_path_factory.mktemp("architectures")
    return {name: architectures.build(name, root / name) for name in architectures.ARCHITECTURES}


def served(model_dir: Path, monkeypatch, backend: str, body: dict) -> Any:
    inference, model = own_inference(model_dir, monkeypatch, backend)
    data = inference.input_fn(json.dumps(body), "application/json")
    answer = json.loads(inference.output_fn(inference.predict_fn(data, model), "application/json")[0])
    sys.modules.pop("inference", None)
    return answer


def leaves(answer: Any) -> tuple[list[str], list[float]]:
    """An answer's strings and numbers, in order (labels, words; scores, vector components)."""
    words: list[str] = []
    numbers: list[float] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                words.append(key)
                walk(value[key])
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers.append(float(value))
        else:
            words.append(str(value))

    walk(answer)
    return words, numbers


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("arch", architectures.ARCHITECTURES)
def test_each_architecture_trains_exports_and_serves_each_task_alike_on_onnx_and_torch(
    arch, task, encoders, job, monkeypatch
):
    job.hyperparameters({**QUICK, **HYPERPARAMETERS.get(task, {}), "serving_int8": "true"})
    job.model_channel(encoders[arch])
    write(task, job.channel("train"))
    code = entry.train()
    if (arch, task) in REFUSED:
        assert code != 0 and REFUSED[arch, task] in (job.failure or ""), job.failure
        assert not list((job.root / "output").glob("data/metrics.json"))  # at start: nothing trained
        return
    assert code == 0, job.failure
    folder = job.model_dir
    assert (folder / "code" / "inference.py").is_file()
    assert list(folder.rglob("model.onnx")), "no serving graph"
    body = BODIES[task]
    torch_answer = served(folder, monkeypatch, "torch", body)
    onnx_answer = served(folder, monkeypatch, "onnxruntime", body)
    monkeypatch.setenv("BYOC_INFERENCE_PRECISION", "int8")  # (the job's int8 graph: answers of the same shape)
    int8_answer = served(folder, monkeypatch, "onnxruntime", body)
    assert type(int8_answer) is type(torch_answer) and len(int8_answer) == len(torch_answer)
    assert all(math.isfinite(n) for n in leaves(int8_answer)[1])
    torch_words, torch_numbers = leaves(torch_answer)
    onnx_words, onnx_numbers = leaves(onnx_answer)
    if task == "sparse":  # a term's presence can flip at zero: compare the vectors as dense rows
        width = max(term["index"] for row in torch_answer + onnx_answer for term in row) + 1
        dense = [np.zeros((len(body["inputs"]), width)) for _ in range(2)]
        for rows, grid in ((torch_answer, dense[0]), (onnx_answer, dense[1])):
            for i, row in enumerate(rows):
                for term in row:
                    grid[i, term["index"]] = term["value"]
        np.testing.assert_allclose(dense[1], dense[0], rtol=1e-3, atol=1e-4)
        return
    assert onnx_words == torch_words, (onnx_answer, torch_answer)
    assert len(onnx_numbers) == len(torch_numbers) and all(math.isfinite(n) for n in onnx_numbers)
    np.testing.assert_allclose(onnx_numbers, torch_numbers, rtol=1e-3, atol=1e-4)
