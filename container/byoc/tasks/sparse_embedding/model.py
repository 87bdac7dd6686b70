"""A sparse embedding model to train: sentence-transformers' `SparseEncoder` (an `MLMTransformer` and
`SpladePooling`: a plain masked-language-model folder gets max pooling of log(1 + ReLU), SPLADE-v2's) and
SPLADE's loss: the ranking loss of its rows (in-batch negatives for (anchor, positive[, negative]) rows,
CoSENT for scored pairs) plus the FLOPS regularisers that keep the vectors sparse, with the weights of
sentence-transformers' SPLADE training examples. The job's rows, batches and evaluation are the embedding
model's (byoc.tasks.embedding.model); `save_pretrained` writes a SparseEncoder folder, which byoc serves.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from byoc import compat, sentence_folder
from byoc.tasks.embedding.model import EmbeddingModel, check_module_code

logger = logging.getLogger(__name__)

DOCUMENT_WEIGHT = 3e-5  # SpladeLoss's regulariser weights in sentence-transformers' SPLADE examples
QUERY_WEIGHT = 5e-5


class SparseModel(EmbeddingModel):
    """A SparseEncoder and SPLADE's loss, trained as the embedding model is (token columns in, the loss and
    each row's anchor and positive vectors out)."""

    def make_objective(self, model: Any, scored: bool, world_size: int) -> Any:
        losses = compat.sparse_encoder_api()[3]
        ranking = (
            losses.SparseCoSENTLoss(model)
            if scored
            else losses.SparseMultipleNegativesRankingLoss(model, gather_across_devices=world_size > 1)
        )
        return losses.SpladeLoss(
            model, ranking, document_regularizer_weight=DOCUMENT_WEIGHT, query_regularizer_weight=QUERY_WEIGHT
        )

    def objective_loss(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """SpladeLoss's sum from the vectors already computed: the ranking loss, the FLOPS regulariser of the
        documents (every text after the first) and of the queries (the first)."""
        splade: Any = self.__dict__["objective"]
        loss = splade.loss.compute_loss_from_embeddings(vectors, labels)
        documents = splade.document_regularizer.compute_loss_from_embeddings(torch.cat(vectors[1:]))
        loss = loss + documents * splade.document_regularizer_weight
        if splade.query_regularizer_weight is not None:
            queries = splade.query_regularizer.compute_loss_from_embeddings(vectors[0])
            loss = loss + queries * splade.query_regularizer_weight
        return loss


def build(
    path: str,
    scored: bool,
    max_length: int,
    model_kwargs: dict[str, Any],
    config_kwargs: dict[str, Any],
    trust_remote_code: bool = False,
    world_size: int = 1,
) -> SparseModel:
    """The model to train from `path`: its SparseEncoder folder as saved, or (a plain masked language model)
    that model under max SPLADE pooling; inputs up to `max_length` tokens."""
    SparseEncoder, _, SpladePooling, _ = compat.sparse_encoder_api()
    if _is_sparse_folder(Path(path)):
        check_module_code(Path(path), trust_remote_code)
        model = SparseEncoder(
            path,
            device="cpu",
            trust_remote_code=trust_remote_code,
            model_kwargs=model_kwargs,
            config_kwargs=config_kwargs,
        )
        origin = "its SparseEncoder modules"
    else:
        encoder = compat.mlm_module(
            path, max_length, {**model_kwargs, "trust_remote_code": trust_remote_code}, config_kwargs
        )
        model = SparseEncoder(modules=[encoder, SpladePooling("max")], device="cpu")
        origin = "max SPLADE pooling added (a masked language model)"
    model.max_seq_length = max_length
    logger.info(
        "sparse embedding model: %s; %d terms; loss: SPLADE (%s, FLOPS regularisers)",
        origin,
        model[0].auto_model.config.vocab_size,
        "sparse CoSENT: scored pairs" if scored else "sparse multiple-negatives ranking: in-batch negatives",
    )
    return SparseModel(model, scored, world_size)


def encoder_of(model: SparseModel) -> Any:
    """The masked language model inside (what freezing and dropout settings apply to)."""
    return model.model[0].auto_model


def _is_sparse_folder(path: Path) -> bool:
    settings = path / "config_sentence_transformers.json"
    return settings.is_file() and sentence_folder.read_json(settings).get("model_type") == "SparseEncoder"
