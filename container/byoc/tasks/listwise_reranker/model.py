"""Training a listwise reranker: a row's (query, document) pairs tokenized a group of columns each, padded group by
group, scored by the cross-encoder, and the lists' loss taken by sentence-transformers' own listwise losses.

Those losses (`LambdaLoss`, `ListNetLoss`) take the texts and run a `CrossEncoder` on them; here the job's
classifier has scored the batch's pairs already (its token columns, as every byoc job tokenizes ahead). `Scored`
stands in for the CrossEncoder inside the loss: it hands the loss the logits of the pairs it asks for, in the
order it asks, so that the loss's own arithmetic (padding, sorting, weighting) runs unchanged, on
sentence-transformers 5 (which tokenizes with `model.tokenizer`) and 6 (`model.preprocess`) alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from byoc.tasks.base import IGNORE_LABEL

KEYS = ("input_ids", "attention_mask", "token_type_ids")


def prefix(n: int) -> str:
    """The token columns' prefix of a row's `n`-th document (0: its positive; then its negatives, in the order of
    their columns text_negative, text_negative_2...)."""
    return "" if n == 0 else "negative_" if n == 1 else f"negative_{n}_"


def documents_of(batch: Mapping[str, list]) -> list[str]:
    """A batch's document columns, in list order: text_pair (the positive), then text_negative, text_negative_2..."""
    negatives = sorted((c for c in batch if c.startswith("text_negative")), key=lambda c: (len(c), c))
    return ["text_pair", *negatives]


def list_encoder(tokenizer: Any, max_length: int, padding: Any) -> Any:
    """A `datasets.map(batched=True)` function: each row's (query, document) pairs, a group of token columns a
    document (`prefix`); `labels` a row's list: 1 for the positive, 0 for each negative, -1 where the row has
    none in that column; `length` its longest pair (for the length buckets)."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {}
        columns = documents_of(batch)
        for n, column in enumerate(columns):
            texts = [text if text is not None else "" for text in batch[column]]
            enc = tokenizer(batch["text"], texts, truncation=True, max_length=max_length, padding=padding)
            out.update({prefix(n) + key: values for key, values in enc.items()})
        out["length"] = [
            max(sum(out[prefix(n) + "attention_mask"][i]) for n in range(len(columns)))
            for i in range(len(batch["text"]))
        ]
        out["labels"] = [
            [1.0 if n == 0 else 0.0 if batch[column][i] is not None else -1.0 for n, column in enumerate(columns)]
            for i in range(len(batch["text"]))
        ]
        return out

    return encode


class ListCollator:
    """A batch of lists: each document's token columns padded on their own, to their longest pair; `labels` the
    rows' lists (float32). A row an evaluation adds to fill its last batch is labelled IGNORE_LABEL by the
    collator byoc wraps this in."""

    def __init__(self, tokenizer: Any, pad_to_multiple_of: int | None) -> None:
        self.tokenizer, self.pad_to_multiple_of = tokenizer, pad_to_multiple_of

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        n = 0
        while prefix(n) + "input_ids" in features[0]:
            keys = [key for key in KEYS if prefix(n) + key in features[0]]
            padded = self.tokenizer.pad(
                [{key: row[prefix(n) + key] for key in keys} for row in features],
                pad_to_multiple_of=self.pad_to_multiple_of,
                return_tensors="pt",
            )
            batch.update({prefix(n) + key: padded[key] for key in keys})
            n += 1
        if "labels" in features[0]:
            batch["labels"] = torch.tensor([row["labels"] for row in features], dtype=torch.float32)
        return batch


class ListwiseModel(torch.nn.Module):
    """The classifier and a listwise loss: each document group's pairs scored, the logits (rows x documents) out,
    and the loss of the rows' lists (filler rows and missing documents left out). `save_pretrained` writes the
    classifier: the folder is the pairwise reranker's."""

    # Its loss is a mean over the micro-batch's lists: the Trainer divides it by gradient_accumulation_steps only
    # where the model says it takes no loss arguments (a forward of **columns would be read as taking them).
    accepts_loss_kwargs = False

    def __init__(self, classifier: Any) -> None:
        super().__init__()
        self.classifier = classifier
        self.config = classifier.config  # what byoc's steps read of a transformers model
        self.loss_name = "lambdaloss"

    @property
    def device(self) -> torch.device:
        return self.classifier.device

    def use(self, loss: str) -> None:
        self.loss_name = loss

    def forward(self, labels: torch.Tensor | None = None, **columns: torch.Tensor) -> dict[str, Any]:
        logits = []
        n = 0
        while prefix(n) + "input_ids" in columns:
            feeds = {key: columns[prefix(n) + key] for key in KEYS if prefix(n) + key in columns}
            logits.append(self.classifier(**feeds).logits.reshape(-1))
            n += 1
        scores = torch.stack(logits, dim=1)
        loss = self.list_loss(scores, labels) if labels is not None else None
        return {"loss": loss, "logits": scores}

    def list_loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """sentence-transformers' listwise loss of the rows' lists: each row's listed documents (label 0 or more),
        in order; rows an evaluation added to fill a batch (IGNORE_LABEL) left out."""
        rows = [i for i in range(len(labels)) if float(labels[i, 0]) != IGNORE_LABEL]
        if not rows:
            return scores.sum() * 0.0
        listed = [labels[i] >= 0 for i in rows]
        lists = [labels[i][keep] for i, keep in zip(rows, listed)]
        flat = torch.cat([scores[i][keep] for i, keep in zip(rows, listed)])
        loss = objective(self.loss_name, Scored(flat))
        texts = ([""] * len(rows), [[""] * len(documents) for documents in lists])  # (the loss reads their counts)
        return loss(texts, lists)

    def save_pretrained(self, folder: Any, **kwargs: Any) -> None:
        self.classifier.save_pretrained(folder, **kwargs)


def objective(name: str, scored: Scored) -> Any:
    """sentence-transformers' listwise loss `name` ("lambdaloss" or "listnet", their defaults) over `scored`."""
    from sentence_transformers.cross_encoder import losses  # (the training image's; imported once a step is taken)

    stand_in: Any = scored  # (the losses name CrossEncoder; they read only what Scored gives)
    return losses.LambdaLoss(stand_in) if name == "lambdaloss" else losses.ListNetLoss(stand_in)


class Scored:
    """Stands in for sentence-transformers' CrossEncoder inside its listwise losses: one output, and the logits
    of the pairs the loss asks for, `logits`' next ones each time (the loss asks in list order)."""

    num_labels = 1

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits, self.device, self.at = logits, logits.device, 0

    def _next(self, pairs: list) -> torch.Tensor:
        taken = self.logits[self.at : self.at + len(pairs)]
        self.at += len(pairs)
        return taken

    def preprocess(self, pairs: list, **_: Any) -> dict[str, torch.Tensor]:  # sentence-transformers 6
        return {"scores": self._next(pairs)}

    def tokenizer(self, pairs: list, **_: Any) -> _Taken:  # sentence-transformers 5
        return _Taken(self._next(pairs))

    def __call__(self, features: Mapping[str, torch.Tensor] | None = None, **named: torch.Tensor) -> Any:
        if features is not None:
            return {"scores": features["scores"]}
        return (named["scores"],)


class _Taken(dict):
    """What sentence-transformers 5's listwise losses get from the tokenizer: moved to the device, then spread
    into the model's call."""

    def __init__(self, scores: torch.Tensor) -> None:
        super().__init__(scores=scores)

    def to(self, device: Any) -> _Taken:
        return self
