"""Tokenizing the job's splits once (cached on disk by content), with each row's length for the samplers."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from byoc import tasks
from byoc.tasks import IGNORE_LABEL
from byoc.training.arguments import TrainArguments
from byoc.training.data import DataError, TaskData
from byoc.training.model import ModelError

logger = logging.getLogger(__name__)


def tokenize_splits(
    data: TaskData, tokenizer: PreTrainedTokenizerBase, args: TrainArguments, cache_dir: Path
) -> dict[str, Any]:
    """Tokenize each split once; results are cached on disk by content, so a rerun reuses them.
    `args.max_length`: already at most the model's (`byoc.training.job.prepare` settles it once)."""
    max_length = args.max_length
    splits = {
        name: ds for name, ds in (("train", data.train), ("eval", data.eval), ("test", data.test)) if ds is not None
    }
    if data.pretokenized:
        return {name: with_length(ds) for name, ds in splits.items()}
    task = tasks.get(data.task)
    problem = task.tokenizer_problem(bool(tokenizer.is_fast))
    if problem:
        raise ModelError(f"{problem}; {type(tokenizer).__name__} is not one: use a model folder with a tokenizer.json")
    padding = "max_length" if args.pad_to_max_length else False
    tokenizer_id = hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()[:12]
    encoding = f"{task.name}:{task.rows.encoding_key(tokenizer)}"  # the same rows tokenize otherwise for another task
    out = {}
    for name, ds in splits.items():
        key = hashlib.sha256(
            f"{ds._fingerprint}:{tokenizer_id}:{type(tokenizer).__name__}:{max_length}:{padding}:"
            f"{args.label_all_tokens}:windows:{encoding}".encode()
        ).hexdigest()[:16]
        cache_file = cache_dir / "tokenized" / f"{name}-{key}.arrow"
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        encode = task.rows.encoder(
            tokenizer, max_length, padding, data.label_names, args.label_all_tokens, name == "train"
        )
        out[name] = ds.map(
            encode,
            batched=True,
            batch_size=2000,
            remove_columns=ds.column_names,
            cache_file_name=str(cache_file),
            desc=f"tokenizing {name}",
        )
        if "cut" in out[name].column_names:  # rows of words, some past max_length (Rows.encoder)
            out[name] = _report_words(out[name], name, len(ds), max_length)
    lengths = np.asarray(out["train"]["length"])
    logger.info(
        "tokenized: train %d %s, %.1f tokens on average (max %d, truncated at %d)",
        len(lengths),
        task.rows.row_unit,
        lengths.mean(),
        lengths.max(),
        max_length,
    )
    return out


def _report_words(ds: datasets.Dataset, split: str, sentences: int, max_length: int) -> datasets.Dataset:
    """A WARNING where sentences run past max_length (often a CoNLL file without blank lines between its
    sentences, read as one sentence): how they were windowed (train) or how many words were cut (eval,
    test); one where words tokenize to nothing; a DataError where no word is left to learn or evaluate."""
    if len(ds) > sentences:
        logger.warning(
            "%s: sentences longer than max_length=%d tokens were covered by windows of it (%d rows from %d "
            "sentences), every word trained on. Sentences that long often mean a CoNLL file without blank lines "
            "between its sentences.",
            split,
            max_length,
            len(ds),
            sentences,
        )
    cut = np.asarray(ds["cut"])
    if cut.any():
        logger.warning(
            "%s: %d sentences are longer than max_length=%d tokens; %d of their words past it are not evaluated "
            "or predicted. Raise max_length, or split the sentences (a CoNLL file separates them by blank lines).",
            split,
            int((cut > 0).sum()),
            max_length,
            int(cut.sum()),
        )
    lost = np.asarray(ds["lost"])
    if lost.any():
        logger.warning(
            "%s: %d words in %d sentences tokenize to nothing (zero-width or control characters, a lone byte-order "
            "mark): their tags are neither learned nor evaluated.",
            split,
            int(lost.sum()),
            int((lost > 0).sum()),
        )
    if len(ds) and all(label == IGNORE_LABEL for row in ds["labels"] for label in row):
        raise DataError(
            f"The {split} data has no word the tokenizer keeps: every word is empty after tokenization "
            "(zero-width or control characters), so there is nothing to learn or evaluate. Fix that data."
        )
    return ds.remove_columns(["cut", "lost"])


def with_length(ds: datasets.Dataset) -> datasets.Dataset:
    """Pretokenized rows as given, minus right padding (tutorial datasets are often padded to 512).

    With an attention mask, trailing pad positions change nothing the model computes for the real
    tokens, so dropping them keeps the result and lets batches pad only to their longest row.
    """
    if "attention_mask" not in ds.column_names:
        return ds.map(lambda b: {"length": [len(ids) for ids in b["input_ids"]]}, batched=True)

    def trim(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {key: [] for key in batch}
        out["length"] = []
        for i, mask in enumerate(batch["attention_mask"]):
            n = int(sum(mask))
            right_padded = all(mask[:n]) and not any(mask[n:])
            keep = n if right_padded else len(mask)
            for key in batch:
                value = batch[key][i]
                out[key].append(value[:keep] if key in ("input_ids", "attention_mask", "token_type_ids") else value)
            out["length"].append(keep)
        return out

    return ds.map(trim, batched=True)
