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
from byoc.tasks.embedding import TEXT_GROUPS
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
    per_token, vectors = tasks.get(data.task).per_token, tasks.get(data.task).vectors
    if per_token and not tokenizer.is_fast:
        raise ModelError(
            "token classification needs a fast tokenizer (tokenizer.json) to put each word's tag on its sub-tokens; "
            f"{type(tokenizer).__name__} is not one: use a model folder with a tokenizer.json"
        )
    padding = "max_length" if args.pad_to_max_length else False
    tokenizer_id = hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()[:12]
    out = {}
    for name, ds in splits.items():
        key = hashlib.sha256(
            f"{ds._fingerprint}:{tokenizer_id}:{type(tokenizer).__name__}:{max_length}:{padding}:"
            f"{args.label_all_tokens}:windows".encode()
        ).hexdigest()[:16]
        cache_file = cache_dir / "tokenized" / f"{name}-{key}.arrow"
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        pair = "text_pair" in ds.column_names
        if per_token:
            # Training covers a long sentence in windows (no word goes unlearned); evaluation cuts it, as the
            # predictions are one row per sentence, and says how much was cut.
            encode = tag_encoder(
                tokenizer, max_length, padding, data.label_names, args.label_all_tokens, windows=name == "train"
            )
        elif vectors:
            encode = group_encoder(tokenizer, max_length, padding)
        else:
            encode = text_encoder(tokenizer, max_length, padding, pair)
        out[name] = ds.map(
            encode,
            batched=True,
            batch_size=2000,
            remove_columns=ds.column_names,
            cache_file_name=str(cache_file),
            desc=f"tokenizing {name}",
        )
        if per_token:
            out[name] = _report_words(out[name], name, len(ds), max_length)
    lengths = np.asarray(out["train"]["length"])
    logger.info(
        "tokenized: train %d %s, %.1f tokens on average (max %d, truncated at %d)",
        len(lengths),
        "sentences" if per_token else "texts",
        lengths.mean(),
        lengths.max(),
        max_length,
    )
    return out


def text_encoder(tokenizer: PreTrainedTokenizerBase, max_length: int, padding: Any, pair: bool) -> Any:
    """Texts (and pairs) -> token ids, each row's length, and its label."""

    def encode(batch: dict[str, list], pair: bool = pair) -> dict[str, list]:
        enc = tokenizer(
            batch["text"],
            batch["text_pair"] if pair else None,
            truncation=True,
            max_length=max_length,
            padding=padding,
        )
        enc["length"] = [sum(mask) for mask in enc["attention_mask"]]
        enc["labels"] = batch["label"]
        return enc

    return encode


def group_encoder(tokenizer: PreTrainedTokenizerBase, max_length: int, padding: Any) -> Any:
    """An embedding model's rows (a text, its pair, a negative) -> each text's token ids under its group's
    prefix (byoc.training.embedding), the row's length (its longest text's) and its score."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {}
        for column, prefix in TEXT_GROUPS.items():
            if column in batch:
                enc = tokenizer(batch[column], truncation=True, max_length=max_length, padding=padding)
                out.update({prefix + key: values for key, values in enc.items()})
        masks = [out[prefix + "attention_mask"] for column, prefix in TEXT_GROUPS.items() if column in batch]
        out["length"] = [max(sum(mask) for mask in row) for row in zip(*masks)]
        out["labels"] = batch["label"]
        return out

    return encode


def tag_encoder(
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    padding: Any,
    names: list[str],
    all_tokens: bool,
    windows: bool = False,
) -> Any:
    """Sentences of words -> token ids, and each word's tag on its first sub-token (`all_tokens`: on
    every sub-token, B- becoming I- after the first); special tokens and the other sub-tokens get
    IGNORE_LABEL, which the loss and the metrics skip (as run_ner.py does). A sentence longer than
    `max_length` is cut there, or (`windows`) covered by consecutive windows, each word tagged once.
    A sentence's last row counts its words that no row holds: `cut` past max_length, `lost` empty after
    tokenization (both reported, then removed, by tokenize_splits)."""
    inside = [
        names.index("I-" + n[2:]) if n.startswith("B-") and "I-" + n[2:] in names else i for i, n in enumerate(names)
    ]

    def encode(batch: dict[str, list]) -> dict[str, list]:
        enc = tokenizer(
            batch["tokens"],
            is_split_into_words=True,
            truncation=True,
            max_length=max_length,
            padding=padding,
            return_overflowing_tokens=True,
        )
        sources = enc.pop("overflow_to_sample_mapping")
        keep = [i for i, source in enumerate(sources) if windows or i == 0 or sources[i - 1] != source]
        overflowed = {source for i, source in enumerate(sources) if i > 0 and sources[i - 1] == source}
        labels, cut, lost = [], [], []
        tagged: set[int] = set()  # the words of this sentence tagged so far (in earlier windows too)
        for n, row in enumerate(keep):
            source, tags = sources[row], batch["tags"][sources[row]]
            if n == 0 or sources[keep[n - 1]] != source:
                tagged = set()
            previous, aligned = None, []
            for word in enc.word_ids(row):
                if word is None:
                    aligned.append(IGNORE_LABEL)
                elif word != previous and word not in tagged:
                    aligned.append(tags[word])
                    tagged.add(word)
                else:
                    aligned.append(inside[tags[word]] if all_tokens else IGNORE_LABEL)
                previous = word
            labels.append(aligned)
            if n + 1 < len(keep) and sources[keep[n + 1]] == source:
                cut.append(0)  # the sentence's counts go on its last row
                lost.append(0)
                continue
            # Words no token holds: past max_length (cut), or tokenized to nothing (lost: a zero-width
            # character, a control character, a lone byte-order mark).
            trailing = len(tags) - len(tagged) - (max(tagged, default=-1) + 1 - len(tagged))
            truncated = not windows and source in overflowed
            cut.append(trailing if truncated else 0)
            lost.append(len(tags) - len(tagged) - (trailing if truncated else 0))
        out = {key: [values[i] for i in keep] for key, values in enc.items()}
        out["labels"] = labels
        out["length"] = [sum(mask) for mask in out["attention_mask"]]
        out["cut"], out["lost"] = cut, lost
        return out

    return encode


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
