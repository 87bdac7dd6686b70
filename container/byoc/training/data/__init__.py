"""Turn SageMaker input channels into train / eval / test datasets.

SageMaker mounts each input channel as a directory (``/opt/ml/input/data/<channel>``).
This package finds the data in those directories -- a ``datasets`` ``save_to_disk``
folder, or CSV / TSV / JSON / JSON Lines / Parquet / ``text;label`` files, optionally
gzipped -- picks the text and label columns, checks the labels and returns normalised
``datasets.Dataset`` objects:

* text data: ``text`` (and ``text_pair`` for sentence pairs) plus ``label``: an int64 class id, a
  float32 0/1 vector (multi-label) or a float32 number (regression);
* token data (CoNLL files, or ``tokens`` with ``ner_tags``): ``tokens`` and ``tags`` (tag ids);
* embedding data: ``text``, ``text_pair`` [, ``text_negative``] plus ``label`` (a pair's score, NaN for none);
* pretokenized data (has ``input_ids``): ``input_ids``, ``attention_mask``,
  ``token_type_ids`` (those present) plus ``labels`` (int64).

Problems with the user's data raise `DataError`; its message is shown to the user as the
SageMaker FailureReason, so it says what is wrong and how to fix it.

Channel directories may be read-only (FastFile mode), so nothing is ever written into
them: files are read with pandas / pyarrow rather than the ``datasets`` file builders,
and anything that has to be cached goes under ``cache_dir``.

The data flow, one module a step (each imports only the ones below it; none imports this one):

* `load_task_data` (here): channels -> `TaskData`, the eval hold-out and the max-samples limits;
* `sources`: which channel (or which file / split in the train channel) holds train, eval, test;
* `formats`: reading one file (CSV, TSV, JSON, JSON Lines, Parquet, text) into a DataFrame;
* `pretokenized`: data with input_ids -> token columns + labels (it shares the column helpers below);
* `columns`: text data -> its text, text pair and label columns -> text + label datasets;
* `labels`: label names -> ids, and the stratified hold-out;
* `tokens` (and `conll`): token classification data, sentences of tokens with an IOB tag each;
* `embedding_rows`: an embedding model's data: (anchor, positive[, negative]) rows, or scored pairs;
* `tasks`: which task the labels ask for (one class, several, a number), and the codecs of the last two;
* `names` and `types`: the column names recognised, and the shared types (`DataError`, `DataSpec`, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from byoc import tasks
from byoc.training.data import task_choice
from byoc.training.data.columns import build_text
from byoc.training.data.embedding_rows import build_embedding, has_rows_layout
from byoc.training.data.labels import holdout
from byoc.training.data.pretokenized import build_pretokenized, is_pretokenized
from byoc.training.data.sources import collect_sources, data_channels
from byoc.training.data.tokens import build_tokens, is_token_data
from byoc.training.data.types import DataError, DataSpec, TaskData

__all__ = ["DataError", "DataSpec", "TaskData", "load_task_data"]

logger = logging.getLogger(__name__)


def load_task_data(channels: Mapping[str, Path], spec: DataSpec, cache_dir: Path) -> TaskData:
    """Read the train (and optional eval / test) data from SageMaker channel directories."""
    _check_spec(spec)
    sources = collect_sources(data_channels(channels))

    pretokenized = is_pretokenized(sources["train"])
    kind = {True: "pretokenized (has input_ids)", False: "raw text (no input_ids)"}
    for role, role_sources in sources.items():
        if is_pretokenized(role_sources) != pretokenized:
            raise DataError(
                f"The train data is {kind[pretokenized]} but the {role} data ({role_sources[0].where}) is "
                f"{kind[not pretokenized]}. Provide every split in the same form."
            )
    tokens = not pretokenized and is_token_data(sources["train"])
    rows = not (pretokenized or tokens) and has_rows_layout(sources["train"])
    where, label_columns = sources["train"][0].where, bool(spec.label_columns)
    task = task_choice.check_request(spec.task, where, tokens, pretokenized, label_columns, rows)
    if task_choice.reads_rows(task):
        splits, label_names, train_labels = build_embedding(sources, spec)
    elif pretokenized:
        splits, label_names, train_labels = build_pretokenized(sources, spec, Path(cache_dir))
    elif tokens:
        splits, label_names, train_labels = build_tokens(sources, spec)
    else:
        splits, label_names, train_labels, task = build_text(sources, spec)
    assert task is not None

    if "eval" in splits and spec.validation_split > 0:
        logger.info("eval: using the given eval data; validation_split=%s is not used", spec.validation_split)
    elif spec.validation_split > 0:
        train_idx, eval_idx = holdout(train_labels, spec.validation_split, spec.seed)
        splits["eval"] = splits["train"].select(eval_idx)
        splits["train"] = splits["train"].select(train_idx)
        logger.info(
            "eval: no eval data given; held out %d of %d train rows (validation_split=%s, seed=%d)",
            len(eval_idx),
            len(train_labels),
            spec.validation_split,
            spec.seed,
        )

    limits = {"train": spec.max_train_samples, "eval": spec.max_eval_samples, "test": spec.max_eval_samples}
    for role, limit in limits.items():
        if role in splits and limit is not None and limit < len(splits[role]):
            logger.info("%s: keeping the first %d of %d rows (max samples)", role, limit, len(splits[role]))
            splits[role] = splits[role].select(range(limit))

    shown = ", ".join(label_names[:20]) + (", ..." if len(label_names) > 20 else "")
    logger.info(
        "data ready (%s): train %d, eval %s, test %s rows; %s%s",
        task,
        len(splits["train"]),
        len(splits["eval"]) if "eval" in splits else "no",
        len(splits["test"]) if "test" in splits else "no",
        tasks.get(task).recipe.head_summary(len(label_names)),
        f": {shown}" if shown else "",  # rows without labels (anchor, positive) name none
    )
    return TaskData(
        train=splits["train"],
        eval=splits.get("eval"),
        test=splits.get("test"),
        label_names=label_names,
        pretokenized=pretokenized,
        task=task,
    )


def _check_spec(spec: DataSpec) -> None:
    if spec.task != tasks.AUTO and tasks.name_of(spec.task) != spec.task:
        raise DataError(f"task must be auto or one of byoc's task names, got {spec.task!r}.")
    split = spec.validation_split
    if not isinstance(split, (int, float)) or not (split == 0 or 0 < split < 1):
        raise DataError(
            f"validation_split must be a fraction between 0 and 1 (for example 0.1), or 0 for none; got {split!r}."
        )
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise DataError(f"{name} must be a positive whole number; got {value!r}.")
