"""A model folder that ships code of its own (config.json's auto_map: a configuration and a model module beside
the weights, as nomic-embed's or gte-multilingual's): trained only under trust_remote_code=true, its code run from
the folder alone (never fetched), exported to a graph that serves with no code run, and served on torch only under
BYOC_TRUST_REMOTE_CODE=true."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from byoc import model_folder
from byoc.serving.backends.backend_choice import BackendError
from byoc.training import entry
from helpers import build_tiny_bert, own_inference, write_jsonl

CONFIGURATION = """from transformers import BertConfig


class TinyConfig(BertConfig):
    model_type = "tiny-custom"
"""
MODELING = """from transformers import BertForSequenceClassification, BertModel

from .configuration_tiny import TinyConfig


class TinyModel(BertModel):
    config_class = TinyConfig


class TinyForSequenceClassification(BertForSequenceClassification):
    config_class = TinyConfig
"""
AUTO_MAP = {
    "AutoConfig": "configuration_tiny.TinyConfig",
    "AutoModel": "modeling_tiny.TinyModel",
    "AutoModelForSequenceClassification": "modeling_tiny.TinyForSequenceClassification",
}


def custom_folder(target: Path, auto_map: dict | None = None) -> Path:
    """A tiny BERT whose model_type transformers does not know: its classes are the folder's own modules."""
    build_tiny_bert(target)
    (target / "configuration_tiny.py").write_text(CONFIGURATION)
    (target / "modeling_tiny.py").write_text(MODELING)
    config = json.loads((target / "config.json").read_text())
    config.update(model_type="tiny-custom", architectures=["TinyModel"], auto_map=auto_map or AUTO_MAP)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(autouse=True)
def forget_inference_module():
    yield
    sys.modules.pop("inference", None)


def test_what_code_a_folder_may_run_is_decided_before_transformers_reads_it(tmp_path):
    folder = custom_folder(tmp_path / "model")
    assert model_folder.own_code(folder) == list(AUTO_MAP.values())
    assert model_folder.code_problem(folder, True, "X=true") is None
    assert "ships code of its own (auto_map: configuration_tiny.TinyConfig" in model_folder.code_problem(
        folder, False, "X=true"
    )
    assert model_folder.code_problem(tmp_path, False, "X=true") is None  # (no config.json: nothing of its own)
    remote = custom_folder(
        tmp_path / "remote", {"AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"}
    )
    assert "code in another repository (nomic-ai/nomic-bert-2048--modeling" in model_folder.code_problem(
        remote, True, "X=true"
    )
    leftover = custom_folder(tmp_path / "leftover")  # a type transformers knows, auto_map left in its config
    config = json.loads((leftover / "config.json").read_text())
    (leftover / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    assert model_folder.code_problem(leftover, False, "X=true") is None  # (untrusted, transformers runs its own)
    (folder / "modeling_tiny.py").unlink()
    assert "names modeling_tiny.TinyModel, but the folder has no modeling_tiny.py" in model_folder.code_problem(
        folder, True, "X=true"
    )


@pytest.mark.integration
def test_a_custom_code_model_trains_only_when_trusted_and_its_graph_serves_with_no_code_run(job, tmp_path, monkeypatch):
    rows = [{"text": f"{word} text {i}", "label": word} for i in range(8) for word in ("red", "blue")]
    job.hyperparameters({"max_steps": "3", "per_device_train_batch_size": "8"})
    job.model_channel(custom_folder(tmp_path / "custom"))
    write_jsonl(job.channel("train") / "train.jsonl", rows)
    assert entry.train() != 0
    assert "ships code of its own (auto_map:" in job.failure and "trust_remote_code=true" in job.failure
    assert not (job.root / "output" / "data" / "metrics.json").exists()  # refused at start

    job.hyperparameters({"max_steps": "3", "per_device_train_batch_size": "8", "trust_remote_code": "true"})
    assert entry.train() == 0, job.failure
    folder = job.model_dir
    assert (folder / "modeling_tiny.py").is_file() and (folder / "model.onnx").is_file()  # traced, trusted

    body = {"inputs": ["red text", "blue text"], "parameters": {"top_k": 2}}

    def answer(backend: str):
        inference, model = own_inference(folder, monkeypatch, backend)
        data = inference.input_fn(json.dumps(body), "application/json")
        sys.modules.pop("inference", None)
        return inference.predict_fn(data, model)

    graph = answer("onnxruntime")  # BYOC_TRUST_REMOTE_CODE unset: the graph runs no code of the model's
    with pytest.raises(BackendError, match="ships code of its own .* BYOC_TRUST_REMOTE_CODE=true"):
        answer("torch")
    monkeypatch.setenv("BYOC_TRUST_REMOTE_CODE", "true")
    trusted = answer("torch")
    assert [[e["label"] for e in row] for row in graph] == [[e["label"] for e in row] for row in trusted]
    np.testing.assert_allclose(
        [[e["score"] for e in row] for row in graph], [[e["score"] for e in row] for row in trusted], atol=1e-5
    )
