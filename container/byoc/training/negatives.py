"""Negatives for an embedding model's rows: the check that in-batch negatives exist, and hard negatives mined
before training (`mine_hard_negatives=true`) with sentence-transformers' `util.mine_hard_negatives`.

A hard negative is a text close to the anchor but not its positive: the model learns more from it than from
the random other rows of a batch. The miner is the model the job trains, as loaded (its own pooling), run
over the train rows' positives as the corpus: each anchor's candidates are the positives ranked
`negatives_range_min` to `negatives_range_max` by cosine (the very top ones are often unlabelled positives),
at most `1 - negatives_margin` as close as its own positive. A row for which none qualifies gets another
row's positive, chosen at random (seeded): every row keeps its place, and the log says how many.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

import numpy as np

from byoc import compat, tasks
from byoc.training.arguments import HyperparameterError, TrainArguments
from byoc.training.data import DataError, TaskData, task_choice
from byoc.training.model import embedder_path

logger = logging.getLogger(__name__)

NEGATIVE = "text_negative"  # the rows' negative column (byoc.tasks.embedding.TEXT_GROUPS)


def check_in_batch_negatives(data: TaskData, batch_size: int, world_size: int) -> None:
    """Refuse (anchor, positive) rows no batch can train: without a negative column an anchor's negatives are the
    other positives of its batch (every rank's, gathered), and a batch of one row has none: a loss of 0."""
    if not tasks.get(data.task).rows.in_batch_negatives(data.train.column_names, bool(data.label_names)):
        return  # scored pairs (CoSENT), each row's own hard negative, or no negatives at all: any batch size trains
    why = "each anchor is trained against the other positives of its batch (in-batch negatives)"
    other = "or add a negative column (for each row a hard negative: a text close to the anchor, but wrong)"
    if len(data.train) < 2:
        raise DataError(
            f"The train data has only {len(data.train)} (anchor, positive) row, and {why}: there are none, so "
            f"nothing would be learned. Give more rows, {other}."
        )
    if batch_size * world_size < 2:
        raise HyperparameterError(
            f"per_device_train_batch_size={batch_size} on {world_size} process, and {why}: a batch of one row has "
            "none, so every loss would be 0 and nothing would be learned. Set a larger per_device_train_batch_size "
            f"(the default is 16; the more rows a batch, the more negatives), {other}."
        )


def mine_hard_negatives(
    data: TaskData, source_path: str, args: TrainArguments, miner_dir: Path | None = None
) -> TaskData:
    """`data` with a negative for each train row, mined where the job asks (`mine_hard_negatives=true`) with the
    model the task mines with (`Rows.mined_by`: the job's own model for an embedding model; for a reranker an
    embedding model: the `miner` channel's, else the bundled one); as given otherwise."""
    if not args.mine_hard_negatives:
        if args.num_negatives != 1:
            raise HyperparameterError(
                f"hyperparameter num_negatives={args.num_negatives} sets how many negatives are mined a row: set "
                "mine_hard_negatives=true too, or drop num_negatives"
            )
        return data
    task = tasks.get(data.task)
    if args.num_negatives > 1 and not task.rows.several_negatives:
        raise HyperparameterError(
            f"num_negatives={args.num_negatives}: {task.described} trains on one negative a row (its in-batch "
            "negatives add the rest); several train a reranker (task=reranker). Drop num_negatives"
        )
    if not task.rows.takes_mined_negatives(data.train.column_names, bool(data.label_names)):
        raise HyperparameterError(
            "mine_hard_negatives=true mines a negative for each (anchor, positive) row of a retrieval model's "
            f"(embedding, reranker, multi-vector) train data; this job's train data are {_described(data)}: drop "
            "mine_hard_negatives, or give (anchor, positive) rows without a negative column"
        )
    if len(data.train) < 2:
        raise DataError(
            f"mine_hard_negatives=true needs two train rows at least (a corpus); the train data has {len(data.train)}"
        )
    miner_task = tasks.get(task.rows.mined_by) if task.rows.mined_by else task
    purpose = f"mining the {task.name.replace('_', '-')}'s hard negatives"  # ("the reranker's", "the multi-vector's")
    path = source_path if miner_task is task else embedder_path(miner_dir, purpose)
    kwargs = {**compat.fp32_weights(), **miner_task.recipe.model_kwargs()}
    labels = data.label_names if miner_task is task else []
    miner = miner_task.recipe.training_model(path, labels, kwargs, {}, args.trust_remote_code, args.max_length, 1)
    anchors, positives = list(data.train["text"]), list(data.train["text_pair"])
    try:
        mined = miner_task.rows.mine_negatives(
            miner,
            anchors,
            positives,
            args.negatives_range_min,
            args.negatives_range_max,
            args.negatives_margin,
            args.num_negatives,
        )
    except tasks.BadParameter as err:  # a task that mines no negatives says why
        raise HyperparameterError(str(err)) from None
    missing = fill_unmined(mined, anchors, positives, random.Random(args.seed))
    logger.info(
        "hard negatives: mined for %d of %d train rows (ranks %d-%d by cosine, margin %g, %d a row at most, %.2f on "
        "average); %d without one in range got another row's positive",
        len(mined) - missing,
        len(mined),
        args.negatives_range_min,
        args.negatives_range_max,
        args.negatives_margin,
        args.num_negatives,
        sum(len(found) for found in mined) / max(len(mined), 1),
        missing,
    )
    train = data.train
    for n in range(args.num_negatives):  # text_negative, then text_negative_2...: None where a row has fewer
        train = train.add_column(negative_column(n), [found[n] if n < len(found) else None for found in mined])
    return dataclasses.replace(data, train=train)


def fill_unmined(mined: list[list[str]], anchors: list[str], positives: list[str], rng: random.Random) -> int:
    """Give each row the miner found none for another row's positive, as in-batch negatives would, never one of its
    own anchor's positives (FAQ rows sharing an answer drew their own answer as their negative); the rows filled.
    DataError where every positive is one of the anchor's own: no text could be its negative."""
    own: dict[str, set[str]] = {}
    for anchor, positive in zip(anchors, positives):
        own.setdefault(anchor, set()).add(positive)
    distinct = sorted(set(positives))
    missing = 0
    for i, found in enumerate(mined):
        if found:
            continue
        missing += 1
        mine = own[anchors[i]]
        tries = (positives[rng.randrange(len(positives))] for _ in range(32))  # (most draws are another's at once)
        chosen = next((text for text in tries if text not in mine), None)
        if chosen is None:
            others = [text for text in distinct if text not in mine]
            if not others:
                raise DataError(
                    f"mine_hard_negatives=true: train row {i + 1}'s anchor has every positive of the train data as "
                    f"its own ({len(distinct)} distinct), so no text can be its negative: give rows of several "
                    "distinct positives, or a negative column"
                )
            chosen = others[rng.randrange(len(others))]
        mined[i] = [chosen]
    return missing


def negative_column(n: int) -> str:
    """The column of a row's `n`-th negative (from 0): the one an embedding model reads, then a reranker's others."""
    return NEGATIVE if n == 0 else f"{NEGATIVE}_{n + 1}"


def as_pairs(data: TaskData) -> TaskData:
    """Each split as the task trains on it (`Rows.pairs_of_rows`: a reranker's (query, document, label) pairs from
    an embedding model's rows); as it is for every other task."""
    task = tasks.get(data.task)
    try:
        train = task.rows.pairs_of_rows(data.train, "train")
        held = [
            None if table is None else task.rows.pairs_of_rows(table, split)
            for split, table in (("eval", data.eval), ("test", data.test))
        ]
    except tasks.BadParameter as err:
        message = str(err)
        raise DataError(message[0].upper() + message[1:]) from None
    if train is data.train and held[0] is data.eval and held[1] is data.test:
        return data
    logger.info("train: %d pairs; %s", len(train), task.rows.label_summary(np.asarray(train["label"])))
    # Rows name no output; the pairs' one output is each pair's relevance.
    return dataclasses.replace(
        data, train=train, eval=held[0], test=held[1], label_names=data.label_names or ["relevance"]
    )


def _described(data: TaskData) -> str:
    if NEGATIVE in data.train.column_names:
        return "(anchor, positive, negative) rows already"
    kind = tasks.get(data.task).described
    return f"{kind}'s scored pairs" if task_choice.reads_rows(data.task) else f"the data of {kind}"
