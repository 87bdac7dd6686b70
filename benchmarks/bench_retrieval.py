"""Retrieval quality on a BEIR set built from SICK (make bench-retrieval): what `byoc train` reports for a
retrieval model evaluated on a corpus, against sentence-transformers' own training with the same recipe.

  the set   SICK's test split as BEIR's layout: each ENTAILMENT pair's first sentence is a query whose second
            sentence is relevant; every distinct second sentence of the split is a document (a query's own
            text is left out of the corpus, where it is one, so that no query finds itself).
  the rows  SICK train's ENTAILMENT pairs as (anchor, positive) rows.

  runs      bm25          byoc's BM25 (bm25s) on the set, as every job reports it
            pretrained    the bundled all-MiniLM-L6-v2 as it is, by sentence-transformers' evaluator
            dense/byoc    `byoc train`: mine_hard_negatives=true, 1 epoch, the set as its test channel
            dense/st      sentence-transformers' own: util.mine_hard_negatives (the same ranks and margin) then
                          MultipleNegativesRankingLoss in SentenceTransformerTrainer (batch 16, 5e-5, warmup 10%)
            reranker/byoc `byoc train task=reranker` from the bundled model on mined negatives, evaluated over
                          the bundled embedding model's top 100 (byoc's own figures: reranker and embedder)
            multi_vector/byoc  `byoc train task=multi_vector` from the bundled model (sentence-transformers makes it a
                          ColBERT: a 128-wide projection drawn at random), mined negatives, ranked by MaxSim
            listwise/byoc `byoc train task=listwise_reranker` (LambdaLoss) from the bundled model, five mined
                          negatives a row (num_negatives=5), evaluated as reranker/byoc is
            sparse/byoc   `byoc train task=sparse_embedding` from the bundled model under a masked-language-model
                          head (its decoder tied to the word embeddings, its transform drawn at random: no
                          pretrained SPLADE or MLM is available offline), in-batch negatives (sentence-transformers'
                          miner takes dense models only), ranked by the sparse evaluator (dot product)
            served/fp32, served/int8   the bundled model's vectors as `byoc serve` answers them (its graph
                          and int8 graph, written by byoc's own export), ranked by cosine, scored by the evaluator

Every model ranks by sentence-transformers' InformationRetrievalEvaluator (NDCG@10, MRR@10, recall@100).

    .venv/bin/python benchmarks/bench_retrieval.py [--runs dense,reranker,int8,multi_vector,sparse,listwise]
        [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # (benchmarks/: every results file with its provenance)
from child_process import byoc_train, exit_on_sigterm
from fixtures import EMBED_BATCH as BATCH  # noqa: E402  (the embedding jobs' recipe, bench_embed_train's)
from fixtures import EMBED_LR as LR  # noqa: E402
from fixtures import sick  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))

from byoc import compat  # noqa: E402
from byoc.training import corpus_evaluation  # noqa: E402
from byoc.training.data.beir import read_set  # noqa: E402
from byoc.training.model import bundled_model_dir  # noqa: E402

FIGURES = ("ndcg_at_10", "mrr_at_10", "recall_at_100")
BYOC_EXTRA: dict[str, str] = {}  # --byoc key=value,...: hyperparameters beyond byoc's defaults
MINING = {"negatives_range_min": 10, "negatives_range_max": 50, "negatives_margin": 0.05}  # byoc's defaults


def write_set(folder: Path) -> Path:
    """SICK's test split in BEIR's layout (the docstring's rules)."""
    pairs = [r for r in sick("SICK_test_annotated.txt") if r["entailment_judgment"] == "ENTAILMENT"]
    queries = {text: f"q{i}" for i, text in enumerate(dict.fromkeys(r["sentence_A"] for r in pairs))}
    documents = [text for text in dict.fromkeys(r["sentence_B"] for r in sick("SICK_test_annotated.txt"))]
    documents = {text: f"d{i}" for i, text in enumerate(text for text in documents if text not in queries)}
    folder.mkdir(parents=True)
    (folder / "qrels").mkdir()
    with (folder / "corpus.jsonl").open("w") as f:
        f.writelines(json.dumps({"_id": key, "text": text}) + "\n" for text, key in documents.items())
    with (folder / "queries.jsonl").open("w") as f:
        f.writelines(json.dumps({"_id": key, "text": text}) + "\n" for text, key in queries.items())
    judged = {(queries[r["sentence_A"]], documents[r["sentence_B"]]) for r in pairs if r["sentence_B"] in documents}
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t1" for q, d in sorted(judged))]
    (folder / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return folder


def train_rows() -> list[dict]:
    return [
        {"anchor": r["sentence_A"], "positive": r["sentence_B"]}
        for r in sick("SICK_train.txt")
        if r["entailment_judgment"] == "ENTAILMENT"
    ]


def run_byoc(
    task: str, epochs: float, test_set: Path, workdir: Path, mine: bool = True, extra: dict | None = None
) -> tuple[dict, float]:
    """A real `byoc train` job with the set as its test channel (its negatives mined unless `mine` is false); its
    metrics.json."""
    root = workdir / "opt-ml"
    for folder in ("input/config", "input/data/train"):
        (root / folder).mkdir(parents=True)
    (root / "input/data/test").symlink_to(test_set, target_is_directory=True)
    hyperparameters = {
        "epochs": str(epochs),
        "task": task,
        "mine_hard_negatives": str(mine).lower(),
        **(extra or {}),
        **BYOC_EXTRA,
    }
    (root / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
    (root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    with (root / "input/data/train/train.jsonl").open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in train_rows())
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "BYOC_CACHE_DIR": str(workdir / "cache")}
    start = time.perf_counter()
    done = byoc_train(env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"byoc train failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    seconds = time.perf_counter() - start
    return json.loads((root / "output/data/metrics.json").read_text()), seconds


def run_reference(epochs: float, workdir: Path) -> tuple[Path, float]:
    """sentence-transformers' own recipe: mined hard negatives (one a row, the top one in range), then the
    multiple-negatives ranking loss over the triplets in its trainer."""
    import datasets
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.util import mine_hard_negatives

    SentenceTransformer, _, _, losses = compat.sentence_transformers_api()
    model = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    start = time.perf_counter()
    rows = datasets.Dataset.from_list(train_rows())
    mined = mine_hard_negatives(
        rows,
        model,
        range_min=MINING["negatives_range_min"],
        range_max=MINING["negatives_range_max"],
        relative_margin=MINING["negatives_margin"],
        num_negatives=1,
        sampling_strategy="top",
        output_format="triplet",
        verbose=False,
    )
    args = SentenceTransformerTrainingArguments(
        output_dir=str(workdir / "checkpoints"),
        num_train_epochs=epochs,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        warmup_ratio=0.1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        batch_sampler="no_duplicates",
    )
    loss = losses.MultipleNegativesRankingLoss(model)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=mined, loss=loss).train()
    folder = workdir / "model"
    model.save(str(folder))
    print(f"  sentence-transformers trained on {len(mined)} mined triplets of {len(rows)} rows", flush=True)
    return folder, time.perf_counter() - start


def evaluated(folder: Path, test_set: Path) -> dict[str, float]:
    found = read_set(test_set, "test", "test")
    scoring = corpus_evaluation.evaluator(found, None, 64)
    results = scoring(compat.sentence_transformers_api()[0](str(folder), device="cpu"))
    prefix = scoring.primary_metric.removesuffix("ndcg@10")
    return {name: float(results[prefix + key]) for key, name in corpus_evaluation.REPORTED.items()}


def served(precision: str, found: Any, workdir: Path) -> dict[str, float]:
    """The set ranked with the vectors byoc's default predict_fn answers for the bundled model at `precision`."""
    import shutil

    import numpy as np
    from fixtures import load, vectors  # (the dense serving benchmark's loaders)

    from byoc import onnx_graph

    folder = workdir / "served-model"
    if not (folder / onnx_graph.INT8_GRAPH).exists():
        shutil.copytree(bundled_model_dir(), folder)
        assert onnx_graph.export(folder) and onnx_graph.export_int8(folder)
    model = load(folder, precision)
    scoring = corpus_evaluation.evaluator(found)
    queries = vectors(model, [found.queries[query] for query in scoring.queries_ids])
    documents = vectors(model, scoring.corpus)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    documents /= np.linalg.norm(documents, axis=1, keepdims=True)
    similarity = queries @ documents.T
    top = np.argsort(-similarity, axis=1)[:, : corpus_evaluation.BM25_DEPTH]
    hits = [
        [{"corpus_id": scoring.corpus_ids[d], "score": float(similarity[q, d])} for d in row]
        for q, row in enumerate(top)
    ]
    return corpus_evaluation._flat(scoring.compute_metrics(hits))


def shown(figures: dict[str, float]) -> str:
    return ", ".join(f"{name} {figures[name]:.4f}" for name in FIGURES)


# --- the runs: each trains (or serves) one family and returns its figures, keyed as the results file has them


def corpus_figures(metrics: dict, seconds: float) -> dict:
    figures = {n: metrics[f"test_corpus_{n}"] for n in corpus_evaluation.REPORTED.values()}
    return {**figures, "job_seconds": round(seconds, 1)}


def dense(epochs: float, test_set: Path, found, tmp: Path) -> dict:
    metrics, seconds = run_byoc("embedding", epochs, test_set, tmp / "dense-byoc")
    out = {"dense/byoc": corpus_figures(metrics, seconds)}
    print(f"dense/byoc          {shown(out['dense/byoc'])}  ({seconds:.0f} s, the whole job)", flush=True)
    folder, seconds = run_reference(epochs, tmp / "dense-st")
    out["dense/st"] = {**evaluated(folder, test_set), "train_seconds": round(seconds, 1)}
    print(f"dense/st            {shown(out['dense/st'])}  ({seconds:.0f} s, mining, training)", flush=True)
    return out


def int8(epochs: float, test_set: Path, found, tmp: Path) -> dict:
    out = {}
    for precision in ("fp32", "int8"):
        out[f"served/{precision}"] = served(precision, found, tmp)
        print(f"served/{precision:5s}       {shown(out[f'served/{precision}'])}", flush=True)
    drop = out["served/fp32"]["recall_at_10"] - out["served/int8"]["recall_at_10"]
    out["int8_recall_at_10_drop"] = round(drop, 4)
    print(f"int8 recall@10 below fp32's by {drop:.4f}", flush=True)
    return out


def multi_vector(epochs: float, test_set: Path, found, tmp: Path) -> dict:
    metrics, seconds = run_byoc("multi_vector", epochs, test_set, tmp / "multi-vector-byoc")
    out = {"multi_vector/byoc": corpus_figures(metrics, seconds)}
    print(f"multi_vector/byoc   {shown(out['multi_vector/byoc'])}  ({seconds:.0f} s)", flush=True)
    return out


def sparse(epochs: float, test_set: Path, found, tmp: Path) -> dict:
    metrics, seconds = run_byoc("sparse_embedding", epochs, test_set, tmp / "sparse", mine=False)
    out = {"sparse/byoc": {**corpus_figures(metrics, seconds), "eval_active_dims": metrics.get("eval_active_dims")}}
    print(f"sparse/byoc         {shown(out['sparse/byoc'])}  ({seconds:.0f} s)", flush=True)
    return out


def rankers(name: str, metrics: dict, seconds: float) -> dict:
    """A reranker's figures: reranking the retriever's candidates (corpus), and that retriever alone."""
    out = {
        f"{name}/byoc/{ranker}": {n: metrics[f"test_{ranker}_{n}"] for n in corpus_evaluation.REPORTED.values()}
        for ranker in ("corpus", "retriever")
    }
    print(f"{name + '/byoc':20s}{shown(out[f'{name}/byoc/corpus'])}  ({seconds:.0f} s)", flush=True)
    print(f"  its retriever     {shown(out[f'{name}/byoc/retriever'])}", flush=True)
    return out


def listwise(epochs: float, test_set: Path, found, tmp: Path) -> dict:
    extra = {"num_negatives": "5"}
    metrics, seconds = run_byoc("listwise_reranker", epochs, test_set, tmp / "listwise", extra=extra)
    return rankers("listwise", metrics, seconds)


def reranker(epochs: float, test_set: Path, found, tmp: Path) -> dict:
    metrics, seconds = run_byoc("reranker", epochs, test_set, tmp / "reranker-byoc")
    return rankers("reranker", metrics, seconds)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="dense,reranker,int8")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "retrieval.json")
    parser.add_argument("--byoc", default="", help="byoc hyperparameters beyond its defaults: key=value,...")
    harness.add_rounds(parser)
    options = parser.parse_args()
    BYOC_EXTRA.update(dict(kv.split("=", 1) for kv in options.byoc.split(",") if kv))
    results: dict = {"epochs": options.epochs, "byoc": BYOC_EXTRA}
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as tmp:
        test_set = write_set(Path(tmp) / "sick-beir")
        found = read_set(test_set, "test", "test")
        results["set"] = {"queries": len(found.queries), "documents": len(found.corpus)}
        print(f"the set: {found.describe()}", flush=True)
        results["bm25"] = corpus_evaluation.bm25_scores(found)
        print(f"bm25                {shown(results['bm25'])}", flush=True)
        results["pretrained"] = evaluated(bundled_model_dir(), test_set)
        print(f"pretrained          {shown(results['pretrained'])}", flush=True)
        runs = {"dense": dense, "int8": int8, "multi_vector": multi_vector, "sparse": sparse}
        runs.update({"listwise": listwise, "reranker": reranker})
        declared = {
            name: lambda run=run: run(
                options.epochs, test_set, found, Path(tempfile.mkdtemp(dir=tmp))
            )  # (a round's own)
            for name, run in runs.items()
            if name in options.runs.split(",")
        }
        for figures in harness.scenarios(declared, options.rounds).values():
            results.update(figures)
    results["rounds"] = options.rounds
    options.json.parent.mkdir(exist_ok=True)
    harness.write_results(options.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
