"""The retrieval loop on this machine's CPU (`make demo-retrieval`): train an embedder, evaluate it on a corpus,
encode the corpus, serve it, answer a query. Every step through byoc's own commands on SageMaker's /opt/ml
layout, as the image runs them:

1. `byoc train` (task=embedding) fine-tunes the bundled all-MiniLM-L6-v2 on (question, article) pairs of a small
   help-center corpus this script writes (its own text: free to use), and ranks the corpus for held-out
   questions (a BEIR set in the test channel): NDCG@10 against BM25's in metrics.json;
2. `byoc encode` writes the corpus's vectors as Parquet shards and a manifest;
3. `byoc serve` serves the trained model; a question is encoded over HTTP (TEI's /embed route) and the shards
   searched by cosine: the best articles printed.

No network is needed. Output under demo-output/retrieval/ (BYOC_DEMO_DIR sets another place).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("BYOC_DEMO_DIR") or REPO / "demo-output") / "retrieval"
QUESTION = "my parcel never showed up, what can I do?"

# (title, text, three questions a customer asks: two to train on, the last held out for the evaluation)
ARTICLES = [
    (
        "Lost parcels",
        "If your tracking shows no movement for five days, we reship the order or refund it in full.",
        ["my package has not moved in a week", "the courier lost my box", "tracking stuck for days what now"],
    ),
    (
        "Damaged items",
        "Send a photo of the damage within 14 days and we send a replacement at no cost.",
        ["the box arrived crushed", "my mug came broken", "item was damaged in transit"],
    ),
    (
        "Refunds",
        "Refunds go back to the original payment method within 5 to 7 business days of approval.",
        ["when do i get my money back", "how long does a refund take", "refund not on my card yet"],
    ),
    (
        "Double charges",
        "A second charge is usually a card pre-authorisation and disappears within 3 days.",
        ["i was charged twice", "two payments for one order", "duplicate charge on my statement"],
    ),
    (
        "Resetting a password",
        "Use Forgot password on the sign-in page; the reset link is valid for one hour.",
        ["i forgot my password", "cannot remember my login password", "how do i reset my password"],
    ),
    (
        "Deleting an account",
        "Go to Settings, Privacy, Delete account; your data is erased after 30 days.",
        ["how do i close my account", "remove my profile for good", "i want my account deleted"],
    ),
    (
        "Changing the email address",
        "Settings, Profile lets you change your email; we confirm it by a link.",
        ["update the email on my account", "new email address for login", "change my contact email"],
    ),
    (
        "Two-factor sign-in",
        "Turn on two-factor sign-in in Settings, Security with an authenticator app.",
        ["how to enable 2fa", "add an authenticator to my login", "make my account more secure"],
    ),
    (
        "App crashes on start",
        "Update the app to the latest version, then clear its cache; reinstall if needed.",
        ["the app closes right after opening", "app keeps crashing", "application crashes at launch"],
    ),
    (
        "Error 500 at checkout",
        "A 500 error at checkout is temporary: wait a minute and retry; your cart is kept.",
        ["checkout gives server error", "error 500 when paying", "cannot finish my order error page"],
    ),
    (
        "Delivery times",
        "Standard delivery takes 3 to 5 business days; express arrives the next business day.",
        ["how long does shipping take", "when will my order arrive", "how fast is delivery"],
    ),
    (
        "Shipping abroad",
        "We ship to 40 countries; duties are shown at checkout and paid before dispatch.",
        ["do you ship internationally", "can i order from canada", "customs fees for foreign orders"],
    ),
    (
        "Returns",
        "Return any unused item within 30 days with the prepaid label from your order page.",
        ["how do i send something back", "return an item i do not want", "is there a return label"],
    ),
    (
        "Discount codes",
        "Enter a discount code in the basket before paying; one code applies per order.",
        ["where do i type my promo code", "voucher not working", "can i use two coupons"],
    ),
    (
        "Invoices",
        "Invoices are in Orders, View invoice, as a PDF with your company details if you added them.",
        ["i need an invoice for my company", "download a receipt", "where is my bill"],
    ),
    (
        "Subscription cancellation",
        "Cancel the subscription in Settings, Plan; it runs until the period ends.",
        ["stop my monthly plan", "cancel subscription", "end my membership renewal"],
    ),
]


def write_json_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def job_tree(root: Path, hyperparameters: dict[str, str], channels: list[str]) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    spec = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
    (config / "inputdataconfig.json").write_text(json.dumps(dict.fromkeys(channels, spec)))
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    return root


def write_corpus(beir: Path) -> list[dict]:
    """The BEIR set: the articles (title and text), the held-out questions, the judgements."""
    corpus = [{"_id": f"kb-{n}", "title": title, "text": text} for n, (title, text, _) in enumerate(ARTICLES)]
    write_json_lines(beir / "corpus.jsonl", corpus)
    write_json_lines(beir / "queries.jsonl", [{"_id": f"q-{n}", "text": a[2][2]} for n, a in enumerate(ARTICLES)])
    (beir / "qrels").mkdir(exist_ok=True)
    judged = "".join(f"q-{n}\tkb-{n}\t1\n" for n in range(len(ARTICLES)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
    return corpus


def run(command: str, root: Path) -> None:
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(ROOT / "cache")}
    print(f"demo: byoc {command} (SAGEMAKER_BASE_DIR={root})", flush=True)
    code = subprocess.call([sys.executable, "-m", "byoc.cli", command], env=env)
    if code:
        failure = root / "output" / "failure"
        raise SystemExit(f"demo: byoc {command} failed ({code}): {failure.read_text() if failure.exists() else ''}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask_server(model_dir: Path, question: str) -> list[float]:
    """The question's vector, from `byoc serve` on the trained model over HTTP (TEI's /embed)."""
    port = free_port()
    env = {**os.environ, "SM_MODEL_DIR": str(model_dir), "SAGEMAKER_BIND_TO_PORT": str(port)}
    server = subprocess.Popen([sys.executable, "-m", "byoc.cli", "serve"], env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("demo: byoc serve did not start (its log is above)") from None
                time.sleep(0.2)
        body = json.dumps({"inputs": question}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/embed", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())[0]
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    import numpy as np
    import pyarrow.dataset as ds

    from byoc.training.model import bundled_model_dir

    started = time.monotonic()
    train = job_tree(
        ROOT / "train",
        {"task": "embedding", "epochs": "4", "per_device_train_batch_size": "16", "learning_rate": "3e-5"},
        ["train", "test", "model"],
    )
    rows = [{"anchor": q, "positive": f"{title} {text}"} for title, text, qs in ARTICLES for q in qs[:2]]
    write_json_lines(train / "input" / "data" / "train" / "train.jsonl", rows)
    corpus = write_corpus(train / "input" / "data" / "test" / "help-center")
    (train / "input" / "data" / "model").symlink_to(bundled_model_dir(), target_is_directory=True)
    run("train", train)
    metrics = json.loads((train / "output" / "data" / "metrics.json").read_text())
    print(
        f"demo: trained and evaluated: NDCG@10 {metrics['test_corpus_ndcg_at_10']:.3f} on the held-out questions "
        f"(BM25: {metrics['test_bm25_ndcg_at_10']:.3f})"
    )

    encode = job_tree(ROOT / "encode", {"batch_size": "32"}, ["corpus", "model"])
    shutil.copytree(train / "input" / "data" / "test" / "help-center", encode / "input" / "data" / "corpus")
    (encode / "input" / "data" / "model").symlink_to(train / "model", target_is_directory=True)
    run("encode", encode)
    table = ds.dataset(encode / "model" / "shards", format="parquet").to_table()
    ids = table["id"].to_pylist()
    vectors = np.stack(table["vector"].to_numpy(zero_copy_only=False))
    print(f"demo: encoded {len(ids)} articles into {encode / 'model' / 'shards'}")

    query = np.asarray(ask_server(train / "model", QUESTION))
    scores = vectors @ query / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query)
    titles = {doc["_id"]: doc["title"] for doc in corpus}
    print(f'demo: "{QUESTION}"')
    for rank, index in enumerate(np.argsort(-scores)[:3], start=1):
        print(f"demo:   {rank}. {titles[ids[index]]} ({scores[index]:.3f})")
    print(f"demo: the retrieval loop in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
