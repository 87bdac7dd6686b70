"""What a finished job leaves: the model folder (published whole or not at all) and the test predictions."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import cast

import datasets
import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer
from transformers.trainer_utils import PredictionOutput

from byoc import model_folder, onnx_graph, tasks
from byoc.model_folder import DEFAULT_THRESHOLD
from byoc.training.model import ModelError
from byoc.training.samplers import length_order
from byoc.training.settings import CODE_DIR_ENV

logger = logging.getLogger(__name__)


def default_code_dir(configured: Path | None = None) -> Path:
    """The inference code copied into every model's code/: `configured` (the settings' `code_dir`,
    BYOC_CODE_DIR: the image's /opt/byoc/code), else the repository's `code/` when byoc runs from a checkout."""
    for candidate in (configured, Path(__file__).resolve().parents[3] / "code"):
        if candidate and (Path(candidate) / "inference.py").exists():
            return Path(candidate)
    raise ModelError(
        f"cannot find the inference code to put in the model (code/inference.py): set {CODE_DIR_ENV} to its folder"
    )


def publish_model(
    trainer: Trainer,
    tokenizer: PreTrainedTokenizerBase,
    code_dir: Path,
    model_dir: Path,
    serving_graph: bool = True,
    serving_int8: bool = False,
    max_length: int | None = None,
    trust_remote_code: bool = False,
) -> None:
    """Save weights (safetensors), config, tokenizer, the serving graph (model.onnx; model.int8.onnx
    with `serving_int8`) and `code/`, so model.tar.gz deploys as it is.

    `max_length`: the longest input training fed the model, in tokens. The saved tokenizer records
    it as its model_max_length, so serving truncates where training did: the model never saw
    positions past it in fine-tuning, and a 512-token forward pass costs several times a 256-token one.

    Everything is written to a staging folder first; a failure leaves model/ without a model.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".byoc-staging-", dir=model_dir.parent))
    moved: list[Path] = []
    model = cast(PreTrainedModel, trainer.model)  # the Trainer types it loosely (a Module, or None before init)
    try:
        if model.device.type == "xla":  # safetensors reads host memory: the job is done, bring it home
            model.cpu()
        model.save_pretrained(staging, safe_serialization=True)
        _save_tokenizer(tokenizer, staging, max_length)
        if serving_graph and onnx_graph.export(staging, trust_remote_code) and serving_int8:
            onnx_graph.export_int8(staging)
        shutil.copytree(code_dir, staging / "code", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "train.py"))
        for item in sorted(staging.iterdir()):
            target = model_dir / item.name
            if target.is_dir():  # left by a run killed mid-publish: replace it, never move into it
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            shutil.move(str(item), str(target))
            moved.append(target)
    except BaseException:
        for target in moved:
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: Path, max_length: int | None) -> None:
    kept = tokenizer.model_max_length
    if max_length is not None and max_length < model_folder.max_length(kept):
        tokenizer.model_max_length = max_length
    try:
        tokenizer.save_pretrained(folder)
    finally:
        tokenizer.model_max_length = kept


def write_predictions(
    output: PredictionOutput,
    test_ds: datasets.Dataset,
    label_names: list[str],
    output_data_dir: Path,
    task: str = tasks.DEFAULT,
    threshold: float | list[float] = DEFAULT_THRESHOLD,
) -> None:
    """output/data/test_predictions.jsonl: each test row's label(s) and prediction, in the data's order
    (byoc.tasks: `Evaluation.predictions`): the best label and its score; the labels at or above `threshold`
    (one, or one per label) with every label's score (multi-label); the predicted value (regression);
    a sentence's tags (token classification)."""
    logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    lines = tasks.get(task).evaluation.predictions(
        logits, np.asarray(output.label_ids), label_names, np.asarray(threshold)
    )
    output_data_dir.mkdir(parents=True, exist_ok=True)
    path = output_data_dir / "test_predictions.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for index, at in sorted((index, at) for at, index in enumerate(length_order(test_ds))):
            f.write(json.dumps({"index": index, **lines[at]}) + "\n")
    logger.info("test predictions written to %s", path)
