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
from byoc.tasks.base import BadParameter
from byoc.tasks.embedding.model import QUERY, EmbeddingModel, check_module_code, transformer_of

logger = logging.getLogger(__name__)

DOCUMENT_WEIGHT = 3e-5  # SpladeLoss's regulariser weights in sentence-transformers' SPLADE examples
QUERY_WEIGHT = 5e-5
# Its inference-free example's: no FLOPS on the queries (a table lookup costs nothing to search with), a
# stronger one on the documents, and the table learning at 1e-3 (the transformer: the job's learning_rate).
FREE_DOCUMENT_WEIGHT = 3e-3
TABLE_LEARNING_RATE = 1e-3


class SparseModel(EmbeddingModel):
    """A SparseEncoder and SPLADE's loss, trained as the embedding model is (token columns in, the loss and
    each row's anchor and positive vectors out)."""

    def make_objective(self, model: Any, scored: bool, world_size: int) -> Any:
        losses = compat.sparse_encoder_api()[3]
        self.world_size = world_size  # (make_inference_free makes the objective again)
        ranking = (
            losses.SparseCoSENTLoss(model)
            if scored
            else losses.SparseMultipleNegativesRankingLoss(model, gather_across_devices=world_size > 1)
        )
        if static_table(model) is not None:
            return losses.SpladeLoss(
                model, ranking, document_regularizer_weight=FREE_DOCUMENT_WEIGHT, query_regularizer_weight=0
            )
        return losses.SpladeLoss(
            model, ranking, document_regularizer_weight=DOCUMENT_WEIGHT, query_regularizer_weight=QUERY_WEIGHT
        )

    def embed(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None, side: str) -> torch.Tensor:
        """An inference-free model's queries go through its table, the rest through the transformer. The table
        sees a query's tokens without the special ones, as sentence-transformers tokenizes a query for it and
        as byoc serves one: the rows were tokenized with them, which the mask now leaves out."""
        table = static_table(self.model)
        if table is None:
            return super().embed(ids, mask, types, side)
        features: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "task": side}
        if side == QUERY:
            special = torch.tensor(table.tokenizer.all_special_ids, device=ids.device)
            features["attention_mask"] = mask * ~torch.isin(ids, special)
        elif types is not None:
            features["token_type_ids"] = types
        return self.model(features)["sentence_embedding"]

    def objective_loss(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """SpladeLoss's sum from the vectors already computed: the ranking loss, the FLOPS regulariser of the
        documents (every text after the first) and of the queries (the first)."""
        splade: Any = self.__dict__["objective"]
        loss = splade.loss.compute_loss_from_embeddings(vectors, labels)
        documents = splade.document_regularizer.compute_loss_from_embeddings(torch.cat(vectors[1:]))
        loss = loss + documents * splade.document_regularizer_weight
        if splade.query_regularizer_weight:  # (0: an inference-free model's)
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
        check_masked_lm(Path(path), trust_remote_code)
        encoder = compat.mlm_module(
            path, max_length, {**model_kwargs, "trust_remote_code": trust_remote_code}, config_kwargs
        )
        model = SparseEncoder(modules=[encoder, SpladePooling("max")], device="cpu")
        origin = "max SPLADE pooling added (a masked language model)"
    model.max_seq_length = max_length
    logger.info(
        "sparse embedding model: %s; %d terms; loss: SPLADE (%s, FLOPS regularisers)",
        origin,
        transformer_of(model).auto_model.config.vocab_size,
        "sparse CoSENT: scored pairs" if scored else "sparse multiple-negatives ranking: in-batch negatives",
    )
    sparse = SparseModel(model, scored, world_size)
    if static_table(model) is not None:
        make_inference_free(sparse)  # (already one: its table's learning rate)
    return sparse


def check_masked_lm(path: Path, trust_remote_code: bool = False) -> None:
    """A BadParameter, before any weight loads, where the architecture has no masked-language-model head (a
    decoder: Qwen, Llama): SPLADE weighs the vocabulary's terms with that head's logits."""
    # (transformers: only a job that builds a sparse model from a plain one reads its config here)
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    model_type = getattr(config, "model_type", None)
    own = "AutoModelForMaskedLM" in (getattr(config, "auto_map", None) or {})  # (a custom-code model's own head)
    if model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not own:
        raise BadParameter(
            f"a sparse embedding model (SPLADE) weighs terms with a masked-language-model head, which {model_type} "
            "models have none of: train it from an encoder (BERT, DistilBERT, RoBERTa, XLM-RoBERTa, DeBERTa, "
            "ModernBERT), or train a dense embedding model (task=embedding) from this one"
        )


def encoder_of(model: SparseModel) -> Any:
    """The masked language model inside (what freezing and dropout settings apply to)."""
    return transformer_of(model.model).auto_model


def static_table(model: Any) -> Any:
    """An inference-free model's query table (its Router's query route: a SparseStaticEmbedding); else None."""
    routes = getattr(model[0], "sub_modules", None)
    return routes[QUERY][0] if routes is not None and QUERY in routes else None


def make_inference_free(model: SparseModel) -> None:
    """`inference_free=true`: the SPLADE model becomes sentence-transformers' inference-free kind, a Router
    whose document route is the masked language model and its pooling and whose query route is a table of a
    weight per term (SparseStaticEmbedding, every weight 1 to start), trained beside it at TABLE_LEARNING_RATE.
    A folder that is one already (a Router) is left as it is."""
    SparseEncoder = compat.sparse_encoder_api()[0]
    Router, SparseStaticEmbedding = compat.inference_free_api()
    if static_table(model.model) is None:
        documents = list(model.model)
        table = SparseStaticEmbedding(tokenizer=documents[0].tokenizer, frozen=False)
        router = Router.for_query_document(query_modules=[table], document_modules=documents)
        encoder = SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu")
        encoder.max_seq_length = model.model.max_seq_length
        model.model = encoder
        model.__dict__["objective"] = model.make_objective(encoder, model.scored, model.world_size)
    table = static_table(model.model)
    model.learning_rates = {f"model.{name}": TABLE_LEARNING_RATE for name, _ in named_in(model.model, table)}
    logger.info(
        "inference-free: queries weighed by a table of %d terms (learning rate %g), documents by the model; "
        "FLOPS regulariser on the documents only (weight %g)",
        table.weight.numel(),
        TABLE_LEARNING_RATE,
        FREE_DOCUMENT_WEIGHT,
    )


def named_in(model: torch.nn.Module, part: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """`part`'s parameters as `model` names them."""
    own = {id(weight) for weight in part.parameters()}
    return [(name, weight) for name, weight in model.named_parameters() if id(weight) in own]


def _is_sparse_folder(path: Path) -> bool:
    settings = path / "config_sentence_transformers.json"
    return settings.is_file() and sentence_folder.read_json(settings).get("model_type") == "SparseEncoder"
