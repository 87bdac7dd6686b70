"""The benchmarks' models and data, made once and shared by the scenario scripts: the emotion tweets and a MiniLM
emotion classifier trained by `byoc train` (the serving benchmarks'), SICK's sentences and the bundled
all-MiniLM-L6-v2 with byoc's graphs (the embedding benchmarks'), loaded by byoc's default pipeline in this process,
and the model-alone loop (`rate`, `ceiling`: the default predict_fn, no HTTP)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shared_data  # noqa: E402
from child_process import byoc_train  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EMOTION = shared_data.find("emotion")  # None where the shared data is missing (a script says so)
SERVE_WORK = Path("/tmp/byoc-bench-serve")  # the emotion classifier's job
EMBED_WORK = Path("/tmp/byoc-bench-embed")  # the embedding model's folder
SHAPES = ((1, 32), (16, 8))  # an embedding server's loads: (sentences a request, concurrency)
MME_WORK = Path("/tmp/byoc-bench-mme")  # the multi-model endpoints' copies
# The embedding jobs' recipe (bench_embed_train and bench_retrieval train alike): batch size, learning rate.
EMBED_BATCH, EMBED_LR = 16, 5e-5
SICK_COLUMNS = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]


def sentences() -> list[str]:
    lines = (EMOTION / "test.txt").read_text(encoding="utf-8").split("\n")[1:]
    return [line.rsplit(";", 1)[0] for line in lines if line.strip()]


def train_model() -> Path:
    """A MiniLM emotion classifier from `byoc train` (a short run: speed, not accuracy, is measured)."""
    root = SERVE_WORK / "opt-ml"
    model = root / "model"
    if (model / "model.safetensors").exists():
        # Today's template (the installed default handlers, predict_fn overridden), not an old copy of them.
        shutil.copy(REPO / "code" / "inference.py", model / "code" / "inference.py")
        if not (model / "model.int8.onnx").exists():  # trained before byoc wrote the serving graphs
            subprocess.run(
                [str(Path(sys.executable).parent / "byoc"), "export-onnx", "--int8", str(model)],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        return model
    shutil.rmtree(root, ignore_errors=True)
    (root / "input" / "data" / "train").mkdir(parents=True)
    shutil.copy(EMOTION / "train.txt", root / "input" / "data" / "train" / "train.txt")
    (root / "input" / "config").mkdir(parents=True)
    hyperparameters = {"max_steps": "60", "logging_steps": "20", "serving_int8": "true"}
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(SERVE_WORK / "cache")}
    byoc_train(env, check=True, stdout=subprocess.DEVNULL)
    return model


def sick_pairs() -> tuple[list[str], list[str], np.ndarray]:
    rows = [
        line.split("\t") for line in (shared_data.folder("sick") / "SICK_test_annotated.txt").read_text().splitlines()
    ]
    rows = [r for r in rows[1:] if len(r) >= 4]
    return [r[1] for r in rows], [r[2] for r in rows], np.array([float(r[3]) for r in rows])


def model_folder() -> Path:
    """The Hub folder, copied, with model.onnx and model.int8.onnx written by byoc's own export."""
    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    target = EMBED_WORK / "model"
    if not (target / onnx_graph.INT8_GRAPH).exists():
        shutil.rmtree(EMBED_WORK, ignore_errors=True)
        shutil.copytree(bundled_model_dir(), target)
        assert onnx_graph.export(target) and onnx_graph.export_int8(target)
    return target


def vectors(model: dict, texts: list[str]) -> np.ndarray:
    from byoc.serving import default_pipeline

    out = []
    for i in range(0, len(texts), 64):
        out.extend(default_pipeline.predict_fn({"inputs": texts[i : i + 64], "parameters": {}}, model))
    return np.asarray(out, dtype=np.float64)


def load(folder: Path, precision: str, backend: str = "onnxruntime") -> dict:
    from byoc.serving import default_pipeline
    from byoc.serving.settings import InferenceSettings

    settings = InferenceSettings(backend=backend, precision=precision, threads=os.cpu_count() or 1)
    with default_pipeline.serving_with(settings):
        return default_pipeline.model_fn(str(folder))


def rate(encode: Callable[[list[str]], object], texts: list[str], seconds: float, batch: int = 32) -> float:
    """Sentences/s of `encode`, `batch` texts a call (SICK's in turn), for `seconds`, in this process."""
    done, started, i = 0, time.monotonic(), 0
    while time.monotonic() - started < seconds:
        chunk = texts[i : i + batch] or texts[:batch]
        encode(chunk)
        done, i = done + len(chunk), (i + batch) % len(texts)
    return done / (time.monotonic() - started)


def ceiling(model: dict, texts: list[str], seconds: float = 6.0, parameters: dict | None = None) -> float:
    """Sentences/s of the default predict_fn, 32 a call, in this process (`parameters`: the request's)."""
    from byoc.serving import default_pipeline

    def answer(batch: list[str]) -> object:
        return default_pipeline.predict_fn({"inputs": batch, "parameters": parameters or {}}, model)

    return rate(answer, texts, seconds)


def sick(name: str) -> list[dict]:
    """One SICK split's rows (the test file has no header line)."""
    with (shared_data.folder("sick") / name).open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, fieldnames=SICK_COLUMNS, delimiter="\t"))
    return [row for row in rows if row["pair_ID"] != "pair_ID"]


def model_copies(model: Path, count: int) -> list[Path]:
    """`count` model folders as SageMaker unpacks them (/opt/ml/models/{name}/model), hard-linked."""
    folders = []
    for i in range(count):
        target = MME_WORK / "models" / f"m{i:03d}" / "model"
        if not (target / "model.safetensors").exists():
            for source in model.rglob("*"):
                if source.is_file():
                    dest = target / source.relative_to(model)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if not dest.exists():
                        os.link(source, dest)
        folders.append(target)
    return folders
