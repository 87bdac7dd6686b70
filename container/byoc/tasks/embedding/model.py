"""Training an embedding model: a sentence-transformers model and its loss, as one module the Trainer trains.

The model is sentence-transformers' own (`SentenceTransformer`: the model channel's folder with its pooling,
Dense and Normalize modules, or any encoder with mean pooling added), so the job saves a folder that
sentence-transformers loads as it is and `byoc serve` embeds exactly as it does. The loss is
sentence-transformers' too, chosen by the data's shape:

* scored pairs (any range): CoSENT, which only asks that pairs scored higher be closer;
* (anchor, positive[, negative]) rows: the multiple-negatives ranking loss: each anchor against every
  positive (and hard negative) of the batch, the other rows' being its negatives; across several
  processes and hosts against the whole global batch's (`gather_across_devices`).

Each batch holds up to three groups of token columns (the anchor's, `pair_...`, `negative_...`), embedded
one after the other; the predictions an evaluation gathers are each row's anchor and positive vectors side
by side, which `byoc.tasks.embedding` scores (Spearman of the cosine; MRR, NDCG and recall).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.nn.functional import normalize

from byoc import compat, sentence_folder
from byoc.tasks.base import IGNORE_LABEL, BadParameter

logger = logging.getLogger(__name__)

QUERY, DOCUMENT = "query", "document"  # the sides of a row (a Router's routes, where the model has one)


class EmbeddingModel(torch.nn.Module):
    """A SentenceTransformer and its training loss: token columns (and scores) in, the loss and each row's
    anchor and positive vectors out. `save_pretrained` writes a sentence-transformers folder."""

    def __init__(self, model: Any, scored: bool, world_size: int = 1) -> None:
        super().__init__()
        self.model = model  # the SentenceTransformer
        self.config = transformer_of(model).auto_model.config  # what byoc's steps read of a transformers model
        self.scored = scored
        self.matryoshka_dims: tuple[int, ...] = ()  # leading dimensions also trained alone (train_leading_dimensions)
        self.mini_batch_size: int | None = None  # training's in-batch negatives embedded this many rows a pass (cache)
        self.learning_rates: dict[str, float] = {}  # weights (by name) trained at a rate of their own (the trainer's)
        self.low_rank = 0  # the rank of the LoRA adapters trained instead of the transformer's weights (train_low_rank)
        # Held outside the module tree: the loss keeps a reference to the model, which would put every
        # weight in the state dict twice (and safetensors refuses tensors that share memory).
        self.__dict__["objective"] = self.make_objective(model, scored, world_size)

    def make_objective(self, model: Any, scored: bool, world_size: int) -> Any:
        """CoSENT for scored pairs, else the multiple-negatives ranking loss (gathered across ranks), with their
        own similarity functions, but ones torch.compile keeps gradients through (compat.cos_sim)."""
        losses = compat.sentence_transformers_api()[3]
        if scored:
            return losses.CoSENTLoss(model, similarity_fct=compat.pairwise_cos_sim)
        return losses.MultipleNegativesRankingLoss(
            model, similarity_fct=compat.cos_sim, gather_across_devices=world_size > 1
        )

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        pair_input_ids: torch.Tensor | None = None,
        pair_attention_mask: torch.Tensor | None = None,
        pair_token_type_ids: torch.Tensor | None = None,
        negative_input_ids: torch.Tensor | None = None,
        negative_attention_mask: torch.Tensor | None = None,
        negative_token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor | None]:
        groups = (
            (input_ids, attention_mask, token_type_ids),
            (pair_input_ids, pair_attention_mask, pair_token_type_ids),
            (negative_input_ids, negative_attention_mask, negative_token_type_ids),
        )
        if self.mini_batch_size and self.training and labels is not None:
            return {"loss": self.cached_loss(groups, labels)}
        vectors = [
            self.embed(ids, mask, types, QUERY if side == 0 else DOCUMENT)
            for side, (ids, mask, types) in enumerate(groups)
            if ids is not None and mask is not None
        ]
        loss = self.loss(vectors, labels) if labels is not None and len(vectors) > 1 else None
        return {"loss": loss, "logits": torch.cat(vectors[:2], dim=-1)}

    def embed(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None, side: str) -> torch.Tensor:
        """A group's vectors; `side`: the row's anchor is a query (QUERY), its other texts documents (for models
        that encode the two apart: byoc.tasks.sparse_embedding.model)."""
        return self.model(features_of(ids, mask, types))["sentence_embedding"]

    def cached_loss(self, groups: Any, labels: torch.Tensor) -> torch.Tensor:
        """sentence-transformers' CachedMultipleNegativesRankingLoss over the batch's groups: it embeds them
        `mini_batch_size` rows at a time without gradients, takes the loss's gradients at the vectors, and
        replays each mini-batch with gradients in the backward pass (GradCache): the uncached loss's gradients
        in a mini-batch's memory. Training only: an evaluation has no backward pass to replay in."""
        features = [
            features_of(ids, mask, types) for ids, mask, types in groups if ids is not None and mask is not None
        ]
        return self.__dict__["cached"](features, labels)

    def loss(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """The objective over the batch's rows. An evaluation drops the filler rows of a fixed-shape batch
        (labelled IGNORE_LABEL: a selection there, as its loss is only reported); training batches are full."""
        labels = labels.to(torch.float32)
        if not self.training:
            keep = labels != IGNORE_LABEL
            if self.scored:
                keep &= torch.isfinite(labels)
            if not bool(keep.any()):
                return vectors[0].sum() * 0.0
            vectors, labels = [v[keep] for v in vectors], labels[keep]
        return self.objective_loss(vectors, labels)

    def objective_loss(self, vectors: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """The loss; with `matryoshka_dims`, sentence-transformers' MatryoshkaLoss's sum: the loss over each size's
        leading dimensions, normalized, weight 1 each (its ForwardDecorator swaps the model's forward, which
        byoc's steps run themselves, so its arithmetic is done here on the vectors)."""
        objective: Any = self.__dict__["objective"]
        if not self.matryoshka_dims:
            return objective.compute_loss_from_embeddings(vectors, labels)
        losses = [
            objective.compute_loss_from_embeddings([normalize(v[..., :size], dim=-1) for v in vectors], labels)
            for size in self.matryoshka_dims
        ]
        return torch.stack(losses).sum()

    def save_pretrained(self, folder: Path | str, **_: Any) -> None:
        """The sentence-transformers folder: the encoder at its root, its modules beside it (modules.json). LoRA
        adapters (`lora_r`) are merged into a copy's weights first: the folder is a plain one."""
        model = self.model
        if self.low_rank:
            import copy  # (only a LoRA job's save copies its model)

            model = copy.deepcopy(model)
            transformer = transformer_of(model)
            compat.replace_transformer_model(transformer, transformer.auto_model.merge_and_unload())
        model.save(str(folder))


def build(
    path: str,
    scored: bool,
    max_length: int,
    model_kwargs: dict[str, Any],
    config_kwargs: dict[str, Any],
    trust_remote_code: bool = False,
    world_size: int = 1,
) -> EmbeddingModel:
    """The model to train from `path`: its sentence-transformers folder as saved, or (a plain encoder) the
    encoder with mean pooling; inputs up to `max_length` tokens (the job's, at most the model's)."""
    SentenceTransformer, Transformer, Pooling, _ = compat.sentence_transformers_api()
    if sentence_folder.is_sentence_folder(Path(path)):
        check_module_code(Path(path), trust_remote_code)
        model = SentenceTransformer(
            path,
            device="cpu",
            trust_remote_code=trust_remote_code,
            model_kwargs=model_kwargs,
            config_kwargs=config_kwargs,
        )
        origin = "its sentence-transformers modules"
    else:
        encoder = Transformer(
            path,
            max_seq_length=max_length,
            **compat.sentence_encoder_kwargs(
                Transformer, {**model_kwargs, "trust_remote_code": trust_remote_code}, config_kwargs
            ),
        )
        model = SentenceTransformer(modules=[encoder, Pooling(compat.embedding_dimension(encoder), "mean")])
        model.to("cpu")
        origin = "mean pooling added (a plain encoder)"
    model.max_seq_length = max_length
    # The encoder's pooler (BERT's) feeds no embedding: frozen, so that DDP finds every trained weight used.
    for name, weight in transformer_of(model).auto_model.named_parameters():
        if name.startswith("pooler."):
            weight.requires_grad_(False)
    logger.info(
        "embedding model: %s; %d dimensions; loss: %s",
        origin,
        compat.embedding_dimension(model),
        "CoSENT (scored pairs)" if scored else "multiple-negatives ranking (in-batch negatives)",
    )
    return EmbeddingModel(model, scored, world_size)


def transformer_of(model: Any) -> Any:
    """The sentence-transformers module holding the transformer: the first module, or, where that is a Router
    (an inference-free sparse model), its document route's first."""
    routes = getattr(model[0], "sub_modules", None)
    return routes[DOCUMENT][0] if routes is not None else model[0]


def features_of(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """A group's token columns as sentence-transformers' features."""
    features = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        features["token_type_ids"] = types
    return features


def cache_negatives(model: EmbeddingModel, mini_batch_size: int) -> None:
    """Cached in-batch negatives (`mini_batch_size`): any batch trains in the memory of a mini-batch, with the
    gradients of the uncached loss (EmbeddingModel.cached_loss)."""
    if model.scored:
        raise BadParameter(
            "mini_batch_size caches the gradients of in-batch negatives ((anchor, positive) rows); these are scored "
            "pairs, trained with CoSENT: drop mini_batch_size"
        )
    losses = compat.sentence_transformers_api()[3]
    cached = losses.CachedMultipleNegativesRankingLoss(
        model.model, similarity_fct=compat.cos_sim, mini_batch_size=mini_batch_size
    )
    if model.matryoshka_dims:
        # sentence-transformers' own combination: MatryoshkaLoss decorates the cached loss's loss-from-vectors
        # step, so each size's loss (leading dimensions, normalized, weight 1) is taken on the cached vectors and
        # its gradients flow back through the one replay: the uncached Matryoshka sum's gradients.
        cached = losses.MatryoshkaLoss(model.model, cached, matryoshka_dims=list(model.matryoshka_dims))
    model.__dict__["cached"] = cached  # (outside the module tree, as the objective)
    model.mini_batch_size = mini_batch_size
    logger.info("cached in-batch negatives: %d rows a pass, gradients cached (GradCache)", mini_batch_size)


def train_low_rank(model: EmbeddingModel, rank: int) -> None:
    """`lora_r`: LoRA adapters (peft) of rank `rank` (alpha 2 x rank) on every linear layer of the transformer,
    its own weights frozen: a 0.6B decoder embedder trains in a fraction of the memory of its full fine-tune.
    The adapters are merged into the weights when the model is saved (save_pretrained), so the folder serves as
    any other: no peft at serving (the slim image has none), one graph, the base model's speed."""
    from peft import LoraConfig, get_peft_model  # (a LoRA job's only)

    transformer = transformer_of(model.model)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", bias="none")
    compat.replace_transformer_model(transformer, get_peft_model(transformer.auto_model, config))
    model.low_rank = rank
    trained = sum(w.numel() for w in transformer.auto_model.parameters() if w.requires_grad)
    logger.info("LoRA: rank %d on every linear layer, %.2fM weights trained, merged when saved", rank, trained / 1e6)


def train_leading_dimensions(model: EmbeddingModel, sizes: list[int]) -> None:
    """Matryoshka training: the loss over each of `sizes` leading dimensions of the vectors (largest first), so a
    vector cut to any of them (`dimensions` in a request) still embeds well."""
    width = compat.embedding_dimension(model.model)
    if sizes[0] > width:
        raise BadParameter(f"matryoshka_dims has {sizes[0]}, above the model's {width} dimensions: lower it")
    model.matryoshka_dims = tuple(sizes)
    logger.info("Matryoshka: the loss over the leading %s of %d dimensions", ", ".join(map(str, sizes)), width)


def check_module_code(folder: Path, trust_remote_code: bool) -> None:
    """Refuse a folder whose modules.json names module types of its own (code beside it: `my_pool.Pooling`,
    `my_pool.py`) unless the job trusts it: sentence-transformers 5.x (the Neuron image's) imports and runs
    such code from a local folder without asking, before any of byoc's checks could see it."""
    foreign = sentence_folder.foreign_modules(folder)
    if not foreign:
        return
    foreign = list(dict.fromkeys(foreign))
    named = ", ".join(repr(kind) for kind in foreign)
    if not trust_remote_code:
        raise sentence_folder.FolderError(
            "loading it would run code of its own, and byoc loads only sentence-transformers' own modules "
            "(sentence_transformers.*) unless trust_remote_code=true: set it if you trust the code of the module "
            f"type{'s' if len(foreign) > 1 else ''} its {sentence_folder.MODULES} names: {named}"
        )
    logger.warning("%s names %s: code of the model's own, run (trust_remote_code=true)", sentence_folder.MODULES, named)


def encoder_of(model: EmbeddingModel) -> Any:
    """The transformers model inside (what freezing and dropout settings apply to)."""
    return transformer_of(model.model).auto_model


def mine_negatives(
    model: EmbeddingModel,
    anchors: list[str],
    positives: list[str],
    range_min: int,
    range_max: int,
    margin: float,
    count: int = 1,
) -> list[list[str]]:
    """Each (anchor, positive) row's hardest negatives among every row's positive, `count` at most, hardest first:
    ranked `range_min` to `range_max` by the model's cosine, at most `1 - margin` as close as the row's own
    positive; none for a row with none (sentence-transformers' util.mine_hard_negatives, the top ones)."""
    import datasets  # training's: serving imports this package without it
    from sentence_transformers.util import mine_hard_negatives  # (as datasets)

    # At most the corpus (the distinct positives, less an anchor's own): sentence-transformers 5.x asks torch.topk
    # for more than there are and fails; 6.x caps it.
    range_max = min(range_max, len(set(positives)) - max(Counter(anchors).values()))
    if range_max <= range_min:
        return [[] for _ in anchors]  # too few texts to rank past range_min
    if torch.cuda.is_available():  # the miner is a copy the job drops after: its GPU, while it runs
        model.model.to("cuda")
    rows = datasets.Dataset.from_dict({"anchor": anchors, "positive": positives})
    mined = mine_hard_negatives(
        rows,
        model.model,
        range_min=range_min,
        range_max=range_max,
        relative_margin=margin,
        num_negatives=count,
        sampling_strategy="top",
        output_format="triplet",  # (a row a negative, hardest first: a row's fewer than `count` are all kept)
        verbose=False,
    )
    found: dict[tuple[str, str], list[str]] = {}
    for a, p, n in zip(mined["anchor"], mined["positive"], mined["negative"]):
        found.setdefault((a, p), []).append(n)
    return [found.get((anchor, positive), [])[:count] for anchor, positive in zip(anchors, positives)]
