"""Every API that differs across the torch and transformers versions byoc supports, in one place.

Supported: torch 2.9 (both DLC bases ship it) to 2.13, transformers 4.55 (the Neuron DLC) to 5.x.
Each difference is detected by feature (a signature, a field, an attribute), never by comparing
version strings: a backport or a vendor build then takes the right branch by itself. Nothing here
imports torch or transformers at module level; each helper imports what it inspects.

What differs, and where it is used:
- `LaunchConfig` keywords (`launch_config`): torch 2.13 added `shutdown_timeout`; 2.9 and 2.11
  raise TypeError on it. Without it the elastic agent gives ranks a fixed 30 s after SIGTERM, so
  `shutdown_grace` lengthens that wait through the process context's `close(timeout=...)`.
- `TrainingArguments` names (`sampling_arguments`): transformers 5 replaced `group_by_length` with
  `train_sampling_strategy`, `warmup_ratio` with a fractional `warmup_steps`, and
  `gradient_checkpointing` (the switch) with `activation_checkpointing`.
- The `Trainer` private methods byoc overrides or calls (`TRAINER_HOOKS`, `check_trainer_hooks`): the same
  names and parameters in 4.55 and 5.x today; checked at start so that a transformers release that
  renames one fails loudly instead of silently skipping byoc's sampler or sealed checkpoints.
- `from_pretrained`'s weight type (`fp32_weights`): transformers 5 loads a checkpoint in the type it
  was saved in (`dtype="auto"`), 4.55 in float32. A half-precision checkpoint (common on the Hub)
  would then train with fp16 weights (AdamW's updates lost, or the grad scaler's refusal) and serve
  slowly on a CPU; byoc always asks for float32 and casts later where a plan says so.
"""

from __future__ import annotations

# Imported where used: each helper imports what it inspects, so importing compat loads neither torch nor
# transformers (the launcher and the server import it).
import contextlib
import inspect
import logging
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# torch.distributed: the elastic launcher


def _parameters(obj: Any) -> list[str]:
    """The parameter names of a callable, in order ([] where it has no readable signature)."""
    try:
        return list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return []


def launch_config(**kwargs: Any):
    """`LaunchConfig(**kwargs)` without the keywords this torch lacks (logged once at debug)."""
    from torch.distributed.launcher.api import LaunchConfig

    known = _parameters(LaunchConfig)
    dropped = sorted(k for k in kwargs if k not in known)
    if dropped:
        logger.debug("this torch's LaunchConfig has no %s: left out", ", ".join(dropped))
    return LaunchConfig(**{k: v for k, v in kwargs.items() if k in known})


def launcher_has_shutdown_timeout() -> bool:
    from torch.distributed.launcher.api import LaunchConfig

    return "shutdown_timeout" in _parameters(LaunchConfig)


@contextlib.contextmanager
def shutdown_grace(seconds: int) -> Iterator[None]:
    """While the launch runs: ranks get `seconds` after SIGTERM before the agent kills them.

    Where `LaunchConfig` takes `shutdown_timeout` (torch >= 2.13) the config carries it and this
    does nothing. Older agents call `PContext.close(death_sig)` and so wait its default of 30 s;
    here that default becomes `seconds`, for this process only and only during the launch.
    """
    if launcher_has_shutdown_timeout():
        yield
        return
    from torch.distributed.elastic.multiprocessing.api import PContext

    original = PContext.close
    if "timeout" not in _parameters(original):  # no way to lengthen it: the agent's own wait applies
        logger.warning(
            "this torch's elastic agent has no shutdown timeout to set: ranks get its default "
            "time to save a checkpoint after SIGTERM"
        )
        yield
        return

    def close(self, death_sig=None, timeout: int = seconds):
        return original(self, death_sig, timeout)

    PContext.close = close  # type: ignore[method-assign]
    try:
        yield
    finally:
        PContext.close = original  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------------
# transformers: TrainingArguments and the Trainer's private methods


def _training_fields() -> set[str]:
    from transformers import TrainingArguments

    return set(TrainingArguments.__dataclass_fields__)


def sampling_arguments(
    grouped: bool, warmup_steps: int, warmup_ratio: float, gradient_checkpointing: bool
) -> dict[str, Any]:
    """The `TrainingArguments` for length grouping, warm-up and activation checkpointing, in the
    names this transformers takes."""
    fields = _training_fields()
    out: dict[str, Any] = {}
    if "train_sampling_strategy" in fields:  # transformers 5
        out["train_sampling_strategy"] = "group_by_length" if grouped else "random"
    else:
        out["group_by_length"] = grouped
    if warmup_steps > 0:
        out["warmup_steps"] = warmup_steps
    elif "warmup_ratio" in fields:
        out["warmup_ratio"] = warmup_ratio
    else:  # transformers 5: a warmup_steps below 1 is a fraction of the training steps
        out["warmup_steps"] = warmup_ratio
    if "activation_checkpointing" in fields:
        if gradient_checkpointing:
            out["activation_checkpointing"] = True
    else:
        out["gradient_checkpointing"] = gradient_checkpointing
    return out


def is_length_grouped(training_args: Any) -> bool:
    """Whether `TrainingArguments` ask for length-grouped training batches (either spelling)."""
    return (
        getattr(training_args, "train_sampling_strategy", None) == "group_by_length"
        or getattr(training_args, "group_by_length", False) is True
    )


# name -> the leading parameters (after self) byoc's overrides take and its calls pass
TRAINER_HOOKS: dict[str, tuple[str, ...]] = {
    "_get_train_sampler": ("train_dataset",),
    "_get_eval_sampler": ("eval_dataset",),
    "_save_checkpoint": ("model", "trial"),
    "_get_output_dir": ("trial",),
    "_load_from_checkpoint": ("resume_from_checkpoint",),
}


def check_trainer_hooks(trainer_class: type | None = None) -> None:
    """Fail at start, naming the method, if this transformers' `Trainer` no longer has a private
    method byoc overrides with the parameters it passes."""
    if trainer_class is None:
        from transformers import Trainer as trainer_class
    for name, wanted in TRAINER_HOOKS.items():
        method = getattr(trainer_class, name, None)
        have = tuple(p for p in _parameters(method) if p != "self") if method else None
        if have is None or have[: len(wanted)] != wanted:
            import transformers

            raise RuntimeError(
                f"transformers {transformers.__version__}: Trainer.{name}"
                f"{'(' + ', '.join(have) + ')' if have is not None else ' is missing'}; byoc overrides "
                f"{name}({', '.join(wanted)}). Use transformers 4.55 to 5.x, or update byoc.compat"
            )


def fp32_weights() -> dict[str, Any]:
    """The `from_pretrained` keyword that loads the weights in float32, in this transformers' name."""
    import torch
    from transformers import PretrainedConfig

    name = "dtype" if "dtype" in _parameters(PretrainedConfig.__init__) else "torch_dtype"  # 5.x renamed it
    return {name: torch.float32}


# ---------------------------------------------------------------------------------------------
# torch.load of checkpoints written by CPU ranks


def restore_indexed_cpu_locations() -> None:
    """Let `torch.load(map_location="cpu:0")` work.

    With several CPU ranks accelerate names each rank's device `cpu:0`, and transformers 4.55
    resumes the optimizer with `map_location=args.device`; torch (2.9 to 2.13) only restores
    storages tagged exactly "cpu", so every multi-process CPU job failed to resume on the Neuron
    image's transformers. Probed, not assumed: registered only where this torch refuses "cpu:0".
    """
    import torch

    try:
        torch.serialization.default_restore_location(torch.UntypedStorage(1), "cpu:0")
        return
    except RuntimeError:
        pass

    def tagger(obj):  # byoc never writes such tags: saving keeps torch's own
        return None

    def deserializer(obj, location: str):
        return obj if location.startswith("cpu:") and location[4:].isdigit() else None

    torch.serialization.register_package(30, tagger, deserializer)


# ---------------------------------------------------------------------------------------------
# sentence-transformers: training embedding models


def sentence_transformers_api() -> Any:
    """sentence-transformers' `(SentenceTransformer, Transformer, Pooling, losses)`: 6.x moved the
    embedding model's modules and losses under `sentence_transformers.sentence_transformer` (the old
    paths warn); 5.1 (the Neuron image's floor) has only the old ones."""
    import sentence_transformers

    try:
        from sentence_transformers.sentence_transformer import losses
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers import losses  # type: ignore[no-redef,attr-defined]
        from sentence_transformers.models import Pooling, Transformer  # type: ignore[no-redef]
    return sentence_transformers.SentenceTransformer, Transformer, Pooling, losses


def sparse_encoder_api() -> Any:
    """sentence-transformers' `(SparseEncoder, MLMTransformer, SpladePooling, losses)`: 6.x keeps the modules
    in `sparse_encoder.modules`, 5.x in `sparse_encoder.models`."""
    from sentence_transformers.sparse_encoder import SparseEncoder, losses

    try:
        from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    except ImportError:
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling  # type: ignore
    return SparseEncoder, MLMTransformer, SpladePooling, losses


def dense_retrieval_evaluator() -> Any:
    """sentence-transformers' information-retrieval evaluator for dense vectors: 6.x keeps it in
    `sentence_transformer.evaluation` (the old path warns), 5.1 only at the old path."""
    try:
        from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    except ImportError:
        from sentence_transformers.evaluation import InformationRetrievalEvaluator  # type: ignore[no-redef]
    return InformationRetrievalEvaluator


def replace_transformer_model(module: Any, model: Any) -> None:
    """`model` as a sentence-transformers Transformer's transformers model: 6.x's `model`, 5.x's `auto_model`."""
    if isinstance(getattr(type(module), "auto_model", None), property):
        module.model = model
    else:
        module.auto_model = model


def words_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer that takes sentences as words (`is_split_into_words`): transformers 4.x's byte-level BPE ones
    (RoBERTa's) refuse them unless loaded with add_prefix_space=True (as run_ner.py loads them); 5.x's take them."""
    try:
        tokenizer(["word"], is_split_into_words=True)
        return tokenizer
    except (AssertionError, ValueError):
        from transformers import AutoTokenizer  # (only a tokenizer that refuses words is loaded again)

        return AutoTokenizer.from_pretrained(tokenizer.name_or_path, add_prefix_space=True)


def unsupported_architecture(config: dict[str, Any]) -> str | None:
    """Why this transformers cannot run the architecture config.json describes as it was trained, or None.
    transformers loads a config with settings it does not know and ignores them: a bidirectional Gemma 3
    (EmbeddingGemma: `use_bidirectional_attention`, 4.56 on) would run causal on 4.55, embedding wrongly."""
    import transformers

    kind = config.get("model_type")
    if config.get("use_bidirectional_attention") and kind in ("gemma3_text", "gemma3"):
        if "use_bidirectional_attention" not in transformers.Gemma3TextConfig().to_dict():
            return (
                f"a bidirectional Gemma 3 (EmbeddingGemma) needs transformers 4.56 or newer; this environment has "
                f"{transformers.__version__}, which would run it causal and embed wrongly: serve its model.onnx "
                "(exported where transformers is newer), or use an image with a newer transformers"
            )
    return None


def exportable(model: Any) -> Any:
    """`model` as the ONNX tracer can follow it, where tracing it as it is failed (byoc.onnx_graph). A decoder
    (Qwen3 and its kind) builds its causal mask with functorch's vmap in transformers 4.55, which the
    TorchScript tracer cannot trace ("unordered_map::at"), nor do 5.x's sliding-window masks (Gemma 3): it
    gets its 4D masks made here instead, as transformers builds them (additive): causal, or padding alone where
    the config says use_bidirectional_attention (EmbeddingGemma); for a model of sliding-window layers
    (`layer_types`), one mask per kind of layer, the local one within the window (|q - k| < window when
    bidirectional, as Gemma 3's overlay; q - window < k <= q when causal). Encoders are returned unchanged."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return model
    window: int = (getattr(config, "sliding_window", None) or 0) if getattr(config, "use_sliding_window", True) else 0
    local = bool(window) and "sliding_attention" in (getattr(config, "layer_types", None) or ())
    if window and not local:
        return model  # (a window over every layer, no per-layer masks to hand it: not offered)
    bidirectional = bool(getattr(config, "use_bidirectional_attention", False))
    import torch

    class CausalMask(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model  # ("model.": the prefix the graph's weights are matched to the checkpoint by)
            self.config = model.config

        def forward(self, input_ids: Any, attention_mask: Any, **rest: Any) -> Any:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            query, key = positions[:, None], positions[None, :]
            seen = attention_mask.bool()[:, None, None, :]
            full = (torch.ones_like(key == query) if bidirectional else key <= query)[None, None] & seen
            if not local:
                return self.model(input_ids=input_ids, attention_mask=self.additive(full), **rest)
            near = (query - key).abs() < window if bidirectional else (key <= query) & (key > query - window)
            masks = {"full_attention": self.additive(full), "sliding_attention": self.additive(near[None, None] & seen)}
            return self.model(input_ids=input_ids, attention_mask=masks, **rest)

        def additive(self, allowed: Any) -> Any:
            dtype = next(self.model.parameters()).dtype
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            return mask.masked_fill(~allowed, torch.finfo(dtype).min)

    return CausalMask().eval()


def inference_free_api() -> Any:
    """sentence-transformers' `(Router, SparseStaticEmbedding)`, an inference-free sparse model's modules: 6.x
    keeps the Router in `base.modules` and the table in `sparse_encoder.modules`, 5.x in `models` for both."""
    try:
        from sentence_transformers.base.modules import Router
        from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding
    except ImportError:
        from sentence_transformers.models import Router  # type: ignore[no-redef]
        from sentence_transformers.sparse_encoder.models import SparseStaticEmbedding  # type: ignore[no-redef]
    return Router, SparseStaticEmbedding


def mlm_module(path: str, max_seq_length: int, model: dict[str, Any], config: dict[str, Any]) -> Any:
    """A SparseEncoder's masked-language-model module: 6.x's `Transformer(transformer_task="fill-mask")` (its
    `MLMTransformer` is deprecated and warns), 5.x's `MLMTransformer` (`model_args`/`config_args`)."""
    try:
        from sentence_transformers.sparse_encoder.modules import Transformer
    except ImportError:
        from sentence_transformers.sparse_encoder.models import MLMTransformer

        return MLMTransformer(path, max_seq_length=max_seq_length, model_args=model, config_args=config)
    kwargs = sentence_encoder_kwargs(Transformer, model, config)
    return Transformer(path, max_seq_length=max_seq_length, transformer_task="fill-mask", **kwargs)


def cos_sim(a: Any, b: Any) -> Any:
    """Every row of `a` against every row of `b`: sentence-transformers' `util.cos_sim` on dense vectors.
    Theirs ends in `.to_dense()`, which returns a dense tensor itself; torch.compile before torch 2.13
    (seen on 2.9 and 2.11) then leaves the loss without a grad_fn, and a compiled step fails in backward."""
    import torch.nn.functional as F

    return F.normalize(a, p=2, dim=1) @ F.normalize(b, p=2, dim=1).transpose(0, 1)


def pairwise_cos_sim(a: Any, b: Any) -> Any:
    """`a[i]` against `b[i]`: sentence-transformers' `util.pairwise_cos_sim` on dense vectors, without its
    `.to_dense()` (see `cos_sim`)."""
    import torch.nn.functional as F

    return (F.normalize(a, p=2, dim=1) * F.normalize(b, p=2, dim=1)).sum(dim=-1)


def sentence_encoder_kwargs(transformer_class: Any, model: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """sentence-transformers' `Transformer(...)` keywords for `from_pretrained`'s and the config's
    arguments: `model_kwargs`/`config_kwargs` in 6.x, `model_args`/`config_args` in 5.1."""
    names = _parameters(transformer_class.__init__)
    suffix = "kwargs" if "model_kwargs" in names else "args"
    return {f"model_{suffix}": model, f"config_{suffix}": config}


def embedding_dimension(module: Any) -> int:
    """A SentenceTransformer's (or its Transformer module's) vector width: `get_embedding_dimension` in 6.x
    (the old names warn), `get_sentence_embedding_dimension` / `get_word_embedding_dimension` in 5.1."""
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension", "get_word_embedding_dimension"):
        method = getattr(module, name, None)
        if method is not None:
            return int(method())
    raise TypeError(f"{type(module).__name__} states no embedding dimension")
