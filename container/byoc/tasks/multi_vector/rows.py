"""A multi-vector model's training rows and evaluation: each (anchor, positive[, negative]) row tokenized as a
query and its documents the way serving tokenizes them (byoc.tasks.multi_vector.head: the folder's prompts,
lengths, query expansion), the batches padded with the query's expansion positions beside its tokens, and an
evaluation's rows ranked by MaxSim: each query against every row's document, its own the relevant one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from byoc import sentence_folder
from byoc.tasks.base import kept_rows
from byoc.tasks.embedding import GroupCollator, rank_metrics
from byoc.tasks.multi_vector.folder import MODEL_TYPE, settings
from byoc.tasks.multi_vector.head import TokenEncoder, encode_side

# What sentence-transformers gives a plain encoder it makes a MultiVectorEncoder of: no prompts, no query
# expansion, no skiplist, the job's length for both sides.
PLAIN: dict[str, Any] = {
    "prompts": {},
    "query_length": None,
    "document_length": None,
    "query_expansion": None,
    "skiplist_words": [],
    "skiplist_tasks": ["document"],
    "similarity": "maxsim",
}
SIDES = (("text", "", "query"), ("text_pair", "pair_", "document"), ("text_negative", "negative_", "document"))
BLOCK_BYTES = 1 << 28  # an evaluation's MaxSim scores a block of queries against every document in this much


def folder_settings(tokenizer: Any) -> dict[str, Any]:
    """The settings (byoc.tasks.multi_vector.settings) of the MultiVectorEncoder folder the tokenizer was loaded
    from; PLAIN for a plain encoder's."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    config = folder / "config_sentence_transformers.json"
    if config.is_file() and sentence_folder.read_json(config).get("model_type") == MODEL_TYPE:
        return settings(folder)
    return PLAIN


def row_encoder(tokenizer: Any, max_length: int) -> Any:
    """A `datasets.map(batched=True)` function: rows -> the anchor's token columns as a query (with
    `query_expansion`, the positions expansion added that the model does not attend to), the positive's
    (`pair_...`) and the negative's (`negative_...`) as documents, the row's `length` and `labels`."""
    settings = folder_settings(tokenizer)
    names = [name for name in tokenizer.model_input_names if name in ("input_ids", "attention_mask", "token_type_ids")]
    encoder = TokenEncoder(tokenizer.backend_tokenizer, max_length, ["input_ids", "attention_mask", "token_type_ids"])

    def encode(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {}
        for column, prefix, side in SIDES:
            if column not in batch:
                continue
            encoded = [feeds for feeds, _ in encode_side(encoder, settings, batch[column], side)]
            for name in names:
                out[prefix + name] = [feeds[name] for feeds in encoded]
            if side == "query":
                out["query_expansion"] = [[1 - a for a in feeds["attention_mask"]] for feeds in encoded]
        groups = [prefix for column, prefix, _ in SIDES if column in batch]
        out["length"] = [max(len(out[p + "input_ids"][i]) for p in groups) for i in range(len(batch["text"]))]
        out["labels"] = batch["label"]
        return out

    return encode


class RowCollator(GroupCollator):
    """The embedding model's batches, and the queries' expansion positions padded as their tokens are."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch  # training's (serving imports this module without torch)

        batch = super().__call__(features)
        if "query_expansion" in features[0]:
            width = batch["input_ids"].shape[1]
            flags = [row["query_expansion"] + [0] * (width - len(row["query_expansion"])) for row in features]
            batch["query_expansion"] = torch.tensor(flags, dtype=torch.long)
        return batch


def unpacked(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(query vectors, query mask, document vectors, document mask) of packed rows (byoc.tasks.multi_vector.model:
    the width first, then each side's tokens, a vector and its mask component each), cut to the longest mask."""
    width = int(logits[0, 0]) if len(logits) else 1
    tokens = logits[:, 1:].reshape(len(logits), 2, width, -1)
    vectors, masks = tokens[..., :-1], tokens[..., -1] > 0.5
    longest = [max(1, int(np.flatnonzero(masks[:, side].any(axis=0)).max(initial=0)) + 1) for side in (0, 1)]
    return (
        vectors[:, 0, : longest[0]],
        masks[:, 0, : longest[0]],
        vectors[:, 1, : longest[1]],
        masks[:, 1, : longest[1]],
    )


def maxsim_scores(queries: Any, query_mask: Any, documents: Any, document_mask: Any) -> Any:
    """(queries x documents) MaxSim: each query vector's best dot product with a document's vectors, summed
    over the query's scored tokens (torch tensors in, one out)."""
    import torch  # (as RowCollator)

    dots = torch.einsum("qtd,nsd->qnts", queries, documents)
    dots = dots.masked_fill(~document_mask[None, :, None, :], float("-inf")).amax(dim=-1)
    return (dots.clamp(min=-1e30) * query_mask[:, None, :]).sum(dim=-1)


def maxsim_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every kept row's query against every kept row's document by MaxSim, its own the relevant one: the
    embedding model's ranking metrics (ties ranked by row, as there)."""
    import torch  # (as RowCollator)

    kept, _ = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
    if not len(kept):
        return rank_metrics(np.zeros(0, dtype=np.int64))
    q, qm, d, dm = (torch.as_tensor(a) for a in unpacked(kept))
    block = max(1, BLOCK_BYTES // (4 * len(d) * q.shape[1] * d.shape[1]))
    position = torch.arange(len(d))
    found = []
    for start in range(0, len(q), block):
        scores = maxsim_scores(q[start : start + block], qm[start : start + block], d, dm)
        rows = torch.arange(start, start + len(scores))
        own = scores[torch.arange(len(scores)), rows][:, None]
        before = (scores > own) | ((scores == own) & (position[None, :] < rows[:, None]))
        found.append(before.sum(dim=1) + 1)
    return rank_metrics(torch.cat(found).numpy())


def own_scores(logits: np.ndarray, labels: np.ndarray) -> list[float]:
    """Each kept row's MaxSim between its query and its own document."""
    import torch  # (as RowCollator)

    kept, _ = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
    if not len(kept):
        return []
    q, qm, d, dm = (torch.as_tensor(a) for a in unpacked(kept))
    return [float(maxsim_scores(q[i : i + 1], qm[i : i + 1], d[i : i + 1], dm[i : i + 1])[0, 0]) for i in range(len(q))]
