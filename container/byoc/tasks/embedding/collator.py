"""The training batches of an embedding model's rows: up to three texts a row, each group padded on its own."""

from __future__ import annotations

from typing import Any

# A training row's texts, each tokenized on its own: its token columns get the text's prefix.
TEXT_GROUPS = {"text": "", "text_pair": "pair_", "text_negative": "negative_"}


class GroupCollator:
    """Training rows of up to three texts (token columns prefixed as TEXT_GROUPS says), each group
    padded on its own to its longest row; `labels` the rows' scores (float32, NaN for none)."""

    def __init__(self, tokenizer: Any, pad_to_multiple_of: int | None) -> None:
        self.tokenizer, self.pad_to_multiple_of = tokenizer, pad_to_multiple_of

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch  # training's (serving imports this module without torch)

        batch: dict[str, Any] = {}
        for prefix in TEXT_GROUPS.values():
            keys = [key for key in ("input_ids", "attention_mask", "token_type_ids") if prefix + key in features[0]]
            if not keys:
                continue
            padded = self.tokenizer.pad(
                [{key: row[prefix + key] for key in keys} for row in features],
                pad_to_multiple_of=self.pad_to_multiple_of,
                return_tensors="pt",
            )
            batch.update({prefix + key: padded[key] for key in keys})
        if "labels" in features[0]:
            batch["labels"] = torch.tensor([float(row["labels"]) for row in features], dtype=torch.float32)
        return batch
