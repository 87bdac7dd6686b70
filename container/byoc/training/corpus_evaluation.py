"""Evaluation on a corpus: after training, a retrieval model ranks a BEIR set's documents for each of its
queries (byoc.training.data.beir: the test or eval channel in BEIR's layout), scored by sentence-transformers'
own information-retrieval evaluator: NDCG@10, MRR@10, recall@10 and @100, MAP@100, accuracy@1.

Beside it, BM25 (`bm25s`, English stopwords) ranks the same documents and the same evaluator scores its top
100, so metrics.json says what the model adds over a keyword index: `test_corpus_ndcg_at_10` against
`test_bm25_ndcg_at_10`. The model's figures are the evaluator's for its own similarity (cosine, or dot
product for a sparse model), as `SentenceTransformer.evaluate` reports them.

A reranker cannot search a corpus: an embedding model (the `miner` channel's, else the bundled one) retrieves
each query's top 100, the reranker orders them, and the evaluator scores that order (`test_corpus_...`);
the embedding model's own order is reported beside it (`test_retriever_...`), so the figures say what the
reranker adds over the search it reorders.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from byoc import compat, tasks
from byoc.training.arguments import HyperparameterError, TrainArguments
from byoc.training.data.beir import RetrievalSet
from byoc.training.model import embedder_path

logger = logging.getLogger(__name__)

AT_K: dict[str, list[int]] = {
    "mrr_at_k": [10],
    "ndcg_at_k": [10],
    "accuracy_at_k": [1],
    "precision_recall_at_k": [10, 100],
    "map_at_k": [100],
}
REPORTED = {
    "ndcg@10": "ndcg_at_10",
    "mrr@10": "mrr_at_10",
    "recall@10": "recall_at_10",
    "recall@100": "recall_at_100",
    "map@100": "map_at_100",
    "accuracy@1": "accuracy_at_1",
}
RANKERS = ("corpus", "bm25")  # the trained model's figures, and BM25's: `<split>_<ranker>_<metric>`
RETRIEVER = "retriever"  # a reranker's: the embedding model whose top 100 it reorders
RERANKED = 100  # the top documents a reranker reorders
PROGRESS_EVERY = 30.0  # seconds between progress lines of a long reranking
# Those a tuning job may read (metric_definitions: SageMaker reads 40 a job at most).
DEFINED = ("corpus_ndcg_at_10", "corpus_mrr_at_10", "corpus_recall_at_100", "bm25_ndcg_at_10")
BM25_DEPTH = 100  # the deepest cut-off evaluated


def check_sets(sets: dict[str, RetrievalSet], task: str, miner_dir: Path | None = None) -> str | None:
    """Refuse, before training, a retrieval set for a model that ranks nothing; for a reranker, the embedding
    model that retrieves what it reranks (byoc.training.model.embedder_path), else None."""
    kind = tasks.get(task)
    if sets and not kind.evaluation.ranks_corpus:
        channels = " and ".join(f"the {'test' if role == 'test' else 'validation'} channel" for role in sets)
        raise HyperparameterError(
            f"{channels} holds a BEIR retrieval set (corpus.jsonl, queries.jsonl, qrels), which evaluates a retrieval "
            f"model (task=embedding, sparse_embedding, multi_vector or reranker); this job trains {kind.described}. "
            "Give rows to evaluate it on instead (the same columns as the train data), or train a retrieval model"
        )
    if (
        sets and kind.evaluation.corpus_evaluator() is None
    ):  # a reranker: it reorders an embedding model's top documents
        return embedder_path(miner_dir, f"retrieving the retrieval set's top {RERANKED} for the reranker")
    return None


def evaluate_sets(
    sets: dict[str, RetrievalSet],
    task: str,
    model: Any,
    args: TrainArguments,
    tokenizer: Any = None,
    retriever: str | None = None,
) -> dict[str, float]:
    """Each set's figures for the trained `model` and for BM25, under `<role>_corpus_...` and `<role>_bm25_...`;
    for a reranker (its `tokenizer`) over the top 100 of the embedding model at `retriever`, whose own figures
    are `<role>_retriever_...`. Texts go in batches of the job's eval batch size, cut at its max_length."""
    batch_size, max_length = args.per_device_eval_batch_size, args.max_length
    kind = tasks.get(task)
    metrics: dict[str, float] = {}
    for role, found in sets.items():
        logger.info("evaluating on the %s retrieval set: %s", role, found.describe())
        ranks_with = kind.evaluation.corpus_evaluator()
        if ranks_with is None:  # a reranker
            reranker = kind.evaluation.retriever_of(model)
            ranked = reranked_scores(found, reranker, tokenizer, retriever or "", batch_size, max_length, kind)
        else:
            ranked = {"corpus": model_scores(found, ranks_with, kind.evaluation.retriever_of(model), batch_size)}
        baseline = bm25_or_none(found)
        if baseline is not None:
            ranked["bm25"] = baseline
        for ranker, scores in ranked.items():
            metrics.update({f"{role}_{ranker}_{name}": value for name, value in scores.items()})
        if RETRIEVER in ranked:
            logger.info(
                "%s retrieval set: the reranker over the embedding model's top %d: NDCG@10 %.4f (the embedding model "
                "alone %.4f)",
                role,
                RERANKED,
                ranked["corpus"]["ndcg_at_10"],
                ranked[RETRIEVER]["ndcg_at_10"],
            )
        logger.info(
            "%s retrieval set: NDCG@10 %.4f (BM25 %s), MRR@10 %.4f (BM25 %s), recall@100 %.4f (BM25 %s)",
            role,
            *(
                value
                for name in ("ndcg_at_10", "mrr_at_10", "recall_at_100")
                for value in (ranked["corpus"][name], f"{ranked['bm25'][name]:.4f}" if baseline else "none")
            ),
        )
    return metrics


def evaluator(found: RetrievalSet, kind: Any = None, batch_size: int = 32) -> Any:
    """sentence-transformers' evaluator over the set, at byoc's cut-offs: `kind` (an evaluator class: the task's
    `corpus_evaluator()`), by default the dense one (BM25's and a reranker's retriever's figures)."""
    return (kind or compat.dense_retrieval_evaluator())(
        found.queries, found.corpus, found.relevant, batch_size=batch_size, name="corpus", write_csv=False, **AT_K
    )


def model_scores(found: RetrievalSet, kind: Any, retriever: Any, batch_size: int) -> dict[str, float]:
    """The evaluator's figures for the sentence-transformers model `retriever`, at its own similarity. On the XLA
    path it encodes on the host: every length of text would compile a graph of its own on a NeuronCore."""
    scoring = evaluator(found, kind, batch_size)
    device = retriever.device
    if device.type == "xla":
        retriever.to("cpu")
    try:
        results = scoring(retriever)
    finally:
        retriever.to(device)
    prefix = scoring.primary_metric.removesuffix("ndcg@10")  # "corpus_cosine_": the model's own similarity's
    return {REPORTED[key]: float(results[prefix + key]) for key in REPORTED}


def reranked_scores(
    found: RetrievalSet,
    model: Any,
    tokenizer: Any,
    retriever: str,
    batch_size: int,
    max_length: int,
    kind: tasks.Task,
) -> dict[str, dict[str, float]]:
    """The cross-encoder `model`'s order of each query's top 100 by the embedding model at `retriever` (pairs cut
    at `max_length` tokens and tokenized as the task `kind` scores them, as served), and the embedding model's own
    order, both scored by the evaluator."""
    from sentence_transformers.util import semantic_search  # training's alone

    embedder = compat.sentence_transformers_api()[0](retriever, device="cpu")
    scoring = evaluator(found, None, batch_size)
    queries = [found.queries[query] for query in scoring.queries_ids]
    ids = list(found.corpus)
    encoded = [
        embedder.encode(texts, batch_size=batch_size, convert_to_tensor=True) for texts in (queries, scoring.corpus)
    ]
    top = semantic_search(encoded[0], encoded[1], top_k=min(RERANKED, len(ids)))
    retrieved = [
        [{"corpus_id": scoring.corpus_ids[hit["corpus_id"]], "score": hit["score"]} for hit in hits] for hits in top
    ]
    pairs = [(query, found.corpus[hit["corpus_id"]]) for query, hits in zip(queries, retrieved) for hit in hits]
    scores = iter(_pair_logits(model, tokenizer, pairs, batch_size, max_length, kind))
    reranked = [[{**hit, "score": next(scores)} for hit in hits] for hits in retrieved]
    return {"corpus": _flat(scoring.compute_metrics(reranked)), RETRIEVER: _flat(scoring.compute_metrics(retrieved))}


def _pair_logits(
    model: Any, tokenizer: Any, pairs: list[tuple[str, str]], batch_size: int, max_length: int, kind: tasks.Task
) -> list[float]:
    """The cross-encoder's logit for each pair, in batches of similar lengths (as CrossEncoder.predict sorts
    them: little padding), progress logged; on the host where the model sits on XLA (as model_scores)."""
    import torch  # (as semantic_search)

    device = model.device
    host = torch.device("cpu") if device.type == "xla" else device
    model.to(host)
    was_training = model.training
    model.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    logits = [0.0] * len(pairs)
    logger.info("reranking %d (query, document) pairs", len(pairs))
    started, reported = time.monotonic(), time.monotonic()
    try:
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                batch = [pairs[i] for i in order[start : start + batch_size]]
                encoded = tokenizer.pad(kind.rows.pair_encoding(tokenizer, batch, max_length), return_tensors="pt").to(
                    host
                )
                scores = model(**encoded).logits.float().reshape(-1).tolist()
                for i, score in zip(order[start : start + batch_size], scores):
                    logits[i] = score
                if time.monotonic() - reported > PROGRESS_EVERY:
                    reported = time.monotonic()
                    done = min(start + batch_size, len(order))
                    logger.info("reranked %d of %d pairs (%.0f s)", done, len(order), reported - started)
    finally:
        model.train(was_training)
        model.to(device)
    return logits


def _flat(computed: dict[str, dict[int, float]]) -> dict[str, float]:
    """The evaluator's compute_metrics ({"ndcg@k": {10: ...}}) as byoc's names ({"ndcg_at_10": ...})."""
    flat = {f"{name.removesuffix('k')}{k}": value for name, by_k in computed.items() for k, value in by_k.items()}
    return {REPORTED[key]: float(flat[key]) for key in REPORTED}


def bm25_or_none(found: RetrievalSet) -> dict[str, float] | None:
    """BM25's figures (`bm25_scores`), or None after a warning where BM25 cannot index the set (every document
    empty or stopwords only): the baseline is left out, and the model's own figures stay."""
    try:
        return bm25_scores(found)
    except (ValueError, IndexError, ZeroDivisionError) as err:  # (bm25s: "max() arg is an empty sequence")
        logger.warning(
            "%s retrieval set: BM25 cannot index its corpus (%s: are its documents empty, or English stopwords "
            "only?), so its baseline (%s_bm25_*) is left out; the model's own figures are kept",
            found.role,
            err,
            found.role,
        )
        return None


def bm25_scores(found: RetrievalSet) -> dict[str, float]:
    """BM25's top 100 documents a query (bm25s; English stopwords, no stemming), scored by the same evaluator.
    A document sharing no term with the query scores 0 and is not retrieved."""
    import bm25s  # training's alone (the slim serving image has none)

    ids = list(found.corpus)
    index = bm25s.BM25()
    index.index(_tokens(bm25s, [found.corpus[doc] for doc in ids]), show_progress=False)
    scoring = evaluator(found)
    asked = _tokens(bm25s, [found.queries[query] for query in scoring.queries_ids])
    docs, scores = index.retrieve(asked, k=min(BM25_DEPTH, len(ids)), show_progress=False)
    hits = [
        [{"corpus_id": ids[int(doc)], "score": float(score)} for doc, score in zip(row_docs, row_scores) if score > 0]
        for row_docs, row_scores in zip(docs, scores)
    ]
    return _flat(scoring.compute_metrics(hits))


def _tokens(bm25s: Any, texts: list[str]) -> Any:
    return bm25s.tokenize(texts, stopwords="en", show_progress=False)
