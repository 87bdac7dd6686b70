"""A multi-vector (ColBERT) model to train: sentence-transformers' `MultiVectorEncoder` (the model channel's
folder with its modules, or a plain encoder under the modules sentence-transformers gives one: a 128-wide
projection, the scoring mask, normalisation) and its in-batch negatives loss,
`MultiVectorMultipleNegativesRankingLoss` (each query's MaxSim against every document of the batch, gathered
across ranks). The rows are tokenized as queries (the anchor) and documents (the positive and any negative)
by the task's encoder (byoc.tasks.multi_vector.rows), as the folder's settings say; the loss runs the
model itself, column by column, as sentence-transformers' trainer does. `save_pretrained` writes a
MultiVectorEncoder folder, which byoc serves.

An evaluation gives each row's query and document token vectors (with their scoring masks), packed at a fixed
width (the row's first number) so that batches concatenate: byoc.tasks.multi_vector.rows ranks every row's
document for every query by MaxSim.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from byoc.tasks.base import BadParameter
from byoc.tasks.embedding.model import EmbeddingModel, check_module_code, features_of

logger = logging.getLogger(__name__)


class MultiVectorModel(EmbeddingModel):
    """A MultiVectorEncoder and its loss: the anchor's token columns (with its query-expansion positions) and
    the documents' in, the loss and (evaluating) each row's packed token vectors out."""

    width = 0  # the packed token axis of an evaluation's outputs (the job's max_length, or the query expansion's)

    def make_objective(self, model: Any, scored: bool, world_size: int) -> Any:
        # (sentence-transformers 6.2's: imported when a job builds the model, as `build` imports the model class)
        from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

        return MultiVectorMultipleNegativesRankingLoss(model, gather_across_devices=world_size > 1)

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        query_expansion: torch.Tensor | None = None,
        pair_input_ids: torch.Tensor | None = None,
        pair_attention_mask: torch.Tensor | None = None,
        pair_token_type_ids: torch.Tensor | None = None,
        negative_input_ids: torch.Tensor | None = None,
        negative_attention_mask: torch.Tensor | None = None,
        negative_token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor | None]:
        query = {**features_of(input_ids, attention_mask, token_type_ids), "task": "query"}
        if query_expansion is not None:
            query["query_expansion_positions"] = query_expansion.bool()
        documents = [
            {**features_of(ids, mask, types), "task": "document"}
            for ids, mask, types in (
                (pair_input_ids, pair_attention_mask, pair_token_type_ids),
                (negative_input_ids, negative_attention_mask, negative_token_type_ids),
            )
            if ids is not None and mask is not None
        ]
        # The loss embeds the columns itself (sentence-transformers' own loop). An evaluation's filler rows (labels
        # IGNORE_LABEL) count in its reported loss, which the dense model drops; the metrics drop them (kept_rows).
        loss = self.__dict__["objective"]([query, *documents], labels) if documents and labels is not None else None
        if self.training:
            return {"loss": loss}
        width = torch.full((input_ids.shape[0], 1), float(self.width), device=input_ids.device)
        packed = [self.packed(query), self.packed(documents[0])]
        return {"loss": loss, "logits": torch.cat([width.to(packed[0].dtype), *packed], dim=1)}

    def packed(self, features: dict[str, Any]) -> torch.Tensor:
        """A column's token vectors and scoring mask, (rows, width * (dim + 1)): each token's vector, then the
        mask as one more component, zero-padded (or cut) to `width` tokens."""
        out = self.model(dict(features), task=features["task"])
        vectors, mask = out["token_embeddings"], out["attention_mask"].to(out["token_embeddings"].dtype)
        tokens = torch.cat([vectors * mask[..., None], mask[..., None]], dim=-1)[:, : self.width]
        tokens = torch.nn.functional.pad(tokens, (0, 0, 0, self.width - tokens.shape[1]))
        return tokens.reshape(tokens.shape[0], -1)


def cache_negatives(model: MultiVectorModel, mini_batch_size: int) -> None:
    """`mini_batch_size`: sentence-transformers' cached multi-vector loss in place of the loss (GradCache: each
    column embedded `mini_batch_size` rows at a time without gradients, the loss's gradients taken at the token
    vectors, each mini-batch replayed with gradients in the backward pass): the uncached loss's gradients, any
    batch in a mini-batch's memory. The loss runs the model either way, so nothing else changes."""
    # (6.2's, as make_objective's: imported when a job asks for it)
    from sentence_transformers.multi_vector_encoder.losses import CachedMultiVectorMultipleNegativesRankingLoss

    loss = CachedMultiVectorMultipleNegativesRankingLoss(model.model, mini_batch_size=mini_batch_size)
    model.__dict__["objective"] = loss  # (outside the module tree, as the loss it replaces)
    model.mini_batch_size = mini_batch_size
    logger.info("cached in-batch negatives: %d rows a pass, gradients cached (GradCache, MaxSim)", mini_batch_size)


def build(
    path: str,
    scored: bool,
    max_length: int,
    model_kwargs: dict[str, Any],
    config_kwargs: dict[str, Any],
    trust_remote_code: bool = False,
    world_size: int = 1,
) -> MultiVectorModel:
    """The model to train from `path` (a MultiVectorEncoder folder as saved, or a plain encoder under
    sentence-transformers' default modules for one); inputs up to `max_length` tokens."""
    if scored:
        raise BadParameter(
            "a multi-vector model trains on (query, positive[, negative]) rows with in-batch negatives, not on "
            "scored pairs: give anchor and positive columns"
        )
    try:  # (6.2 on: imported here, so that an older one fails this job only, with the message below)
        from sentence_transformers import MultiVectorEncoder
    except ImportError:
        import sentence_transformers  # (its version, for the message)

        raise BadParameter(
            "training a multi-vector model takes sentence-transformers 6.2 or newer (its MultiVectorEncoder); this "
            f"environment has {sentence_transformers.__version__}"
        ) from None

    if (Path(path) / "modules.json").is_file():
        check_module_code(Path(path), trust_remote_code)
    model = MultiVectorEncoder(
        path, device="cpu", trust_remote_code=trust_remote_code, model_kwargs=model_kwargs, config_kwargs=config_kwargs
    )
    model.max_seq_length = max_length
    transformer: Any = model[0]
    for name, weight in transformer.auto_model.named_parameters():
        if name.startswith("pooler."):  # (no token vector reads BERT's pooler: frozen, so DDP finds every weight used)
            weight.requires_grad_(False)
    expansion = transformer.query_expansion
    trained = MultiVectorModel(model, scored, world_size)
    trained.width = max(max_length, expansion["length"] if expansion else 0)
    logger.info(
        "multi-vector model: %s; %d dimensions a token; loss: in-batch negatives by MaxSim",
        "its MultiVectorEncoder modules" if (Path(path) / "modules.json").is_file() else "a projection added",
        model.get_embedding_dimension() or 0,
    )
    return trained
