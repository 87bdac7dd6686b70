"""The training job's hyperparameters: one dataclass, `TrainArguments`, its names, aliases, ranges and
checks; the task's and the data's defaults (`for_task`); what the Trainer owns of them (`TRAINER_OWNS`).
Reading them from hyperparameters.json, whichever SDK wrote it: byoc.training.hyperparameters.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from byoc import tasks
from byoc.errors import UserError
from byoc.sdk_values import Bound, base_type
from byoc.tasks.settings import COUNT, INT_LIMIT, sizes

logger = logging.getLogger(__name__)


class HyperparameterError(UserError, ValueError):
    """A bad hyperparameter. The message names it and says what would be valid."""


# Past these a job fails late (an OverflowError when the Trainer counts its steps, a tensor too
# large to allocate); no real job comes near them.
EPOCHS_LIMIT = 100_000
SEED_LIMIT = 2**32 - 1  # numpy's seeds are 32-bit, and transformers.set_seed seeds numpy
DEFAULT_BATCH_SIZE, SMALL_BATCH_SIZE = 32, 16  # 16: token classification, and runs under SMALL_RUN rows
SMALL_RUN = 4096  # rows the whole run sees (rows x epochs): at 32, under 128 steps in all
# The ranges, each checked when the hyperparameters are read, so a bad value fails before any work.
WHOLE = Bound(0, INT_LIMIT)
POSITIVE = Bound(0, low_open=True)
NOT_NEGATIVE = Bound(0)
# [0, 1): a ratio of 1 would warm up for the whole run (and transformers 5 reads a warm-up of 1 as one step),
# smooth every label away, hold out all of train or drop every activation.
FRACTION = Bound(0, 1, high_open=True)
PACKING_HELP = "Pack a batch's texts end to end in fewer rows, no padding (docs/training.md). auto: eager on CPU."
COMPILED = ("layers", "model")  # compile_scope: a transformer layer, compiled once for every length; the whole step


def _hp(
    default: Any, help: str, aliases: tuple[str, ...] = (), choices: tuple[str, ...] = (), bound: Bound | None = None
) -> Any:
    return field(default=default, metadata={"help": help, "aliases": aliases, "choices": choices, "bound": bound})


@dataclass
class TrainArguments:
    """Every hyperparameter `byoc train` understands (docs/hyperparameters.md's table is generated from this)."""

    # Model
    model_name_or_path: str | None = _hp(
        None,
        "Model folder (or a Hub id where the Hub is reachable). Default: the `model` channel, "
        "else the bundled all-MiniLM-L6-v2 when installed.",
        ("model_id", "model_name", "model"),
    )
    tokenizer_name_or_path: str | None = _hp(None, "Tokenizer, if not with the model.", ("tokenizer_name", "tokenizer"))
    trust_remote_code: bool = _hp(False, "Allow model code shipped with the checkpoint to run. Off unless asked.")
    # Schedule
    epochs: float = _hp(
        3.0, "Training epochs.", ("num_train_epochs", "num_epochs", "n_epochs"), bound=Bound(0, EPOCHS_LIMIT)
    )
    max_steps: int = _hp(
        -1,
        "Total optimizer steps; overrides `epochs` when > 0 (as in the tutorials).",
        ("max_train_steps",),
        bound=Bound(-1, INT_LIMIT),
    )
    learning_rate: float = _hp(
        1e-4,
        "Peak learning rate (AdamW). An embedding model's on (anchor, positive) rows: 5e-5.",
        ("lr",),
        bound=POSITIVE,
    )
    per_device_train_batch_size: int | None = _hp(
        None,
        "Training batch size per device (GPU, NeuronCore or CPU process). "
        "Default: 32; 16 for token classification, multi-label, embeddings and runs under 4,096 rows in all "
        "(training rows x epochs, or max_steps x 32: under 128 steps at 32; 16 gives twice the steps).",
        ("train_batch_size", "batch_size"),
        bound=COUNT,
    )
    per_device_eval_batch_size: int = _hp(64, "Evaluation batch size per device.", ("eval_batch_size",), bound=COUNT)
    gradient_accumulation_steps: int = _hp(1, "Batches accumulated per optimizer step.", bound=COUNT)
    weight_decay: float = _hp(0.01, "AdamW weight decay (not applied to biases and LayerNorm).", bound=NOT_NEGATIVE)
    warmup_ratio: float = _hp(0.1, "Fraction of the steps spent warming the learning rate up.", bound=FRACTION)
    warmup_steps: int = _hp(0, "Warm-up steps; overrides `warmup_ratio` when > 0.", bound=WHOLE)
    lr_scheduler_type: str = _hp(
        "linear",
        "Learning-rate schedule after warm-up.",
        ("lr_scheduler", "scheduler"),
        ("linear", "cosine", "constant", "constant_with_warmup", "polynomial", "cosine_with_restarts"),
    )
    max_grad_norm: float = _hp(1.0, "Gradient clipping norm (0 disables).", bound=NOT_NEGATIVE)
    label_smoothing: float = _hp(0.0, "Label smoothing factor.", ("label_smoothing_factor",), bound=FRACTION)
    seed: int = _hp(42, "Random seed (data order, head initialisation, dropout).", bound=Bound(0, SEED_LIMIT))
    # Inputs
    max_length: int = _hp(
        256,
        "Longest sequence in tokens; longer texts are truncated.",
        ("max_seq_length", "max_seq_len", "seq_len"),
        bound=COUNT,
    )
    pad_to_max_length: bool = _hp(
        False,
        "Pad every batch to `max_length` (the tutorials' recipe; slow). Default: pad each batch to its longest text.",
    )
    group_by_length: bool = _hp(True, "Batch texts of similar length together, which cuts padding.")
    packing: str = _hp("auto", PACKING_HELP, (), ("auto", "true", "false"))
    text_column: str | None = _hp(None, "Text column. Default: detected (text, sentence, review, tweet, content, ...).")
    text_pair_column: str | None = _hp(
        None, "Second text column for sentence-pair tasks. Default: detected (sentence2, hypothesis, ...)."
    )
    label_column: str | None = _hp(None, "Label column. Default: detected (label, labels, target, class, ...).")
    task: str = _hp(
        "auto",
        f"{', '.join(n for n, t in tasks.TASKS.items() if t.trains)} (or an alias: docs/data.md). auto: CoNLL files or "
        "tokens + ner_tags -> token_classification; anchor and positive columns -> embedding; lists of labels or 0/1 "
        "label columns -> multi-label; numbers not all whole -> regression; else single-label.",
        ("problem_type",),
    )
    label_columns: str | None = _hp(
        None, "Multi-label, one 0/1 column per label: the columns (a,b). Default: found when all but the text are 0/1."
    )
    label_delimiter: str = _hp(",", "Multi-label labels written as text (joy,love): what separates them.")
    threshold: float | None = _hp(
        None, "Multi-label: predict labels at or above this. Default: tuned on eval data, else 0.5.", bound=Bound(0, 1)
    )
    label_all_tokens: bool = _hp(False, "Token classification: tag every sub-token of a word, not only its first.")
    mine_hard_negatives: bool = _hp(
        False,
        "Embedding models and rerankers on (anchor, positive) rows: before training, give each row a hard negative "
        "mined with an embedding model (sentence-transformers' util.mine_hard_negatives; docs/training.md).",
    )
    negatives_range_min: int = _hp(
        10, "Mined negatives: skip each anchor's closest N texts (often unlabelled positives).", bound=WHOLE
    )
    negatives_range_max: int = _hp(50, "Mined negatives: look no further than each anchor's closest N.", bound=COUNT)
    negatives_margin: float = _hp(
        0.05, "Mined negatives: at most (1 - margin) as similar to the anchor as its positive.", bound=FRACTION
    )
    num_negatives: int = _hp(1, "Mined negatives: how many a row (rerankers: several; the others: 1).", bound=COUNT)
    validation_split: float = _hp(0.0, "No eval data: hold out this fraction of train (stratified).", bound=FRACTION)
    max_train_samples: int | None = _hp(None, "Use only the first N training examples (quick runs).", bound=COUNT)
    max_eval_samples: int | None = _hp(None, "Use only the first N eval and test examples.", bound=COUNT)
    # Speed (docs/training.md: measured on CPU, they keep accuracy)
    freeze_embeddings: bool = _hp(
        True,
        "Freeze the embeddings (the word-embedding matrix is most of a small model's parameters): "
        "faster steps, same accuracy.",
    )
    freeze_layers: int = _hp(
        1,
        "Also freeze the bottom N transformer layers: no backward pass below them "
        "(docs/training.md: faster at equal accuracy). 0 trains every layer.",
        bound=WHOLE,
    )
    dropout: float | None = _hp(
        0.0,
        "Dropout probability for hidden and attention layers; empty/null keeps the model's own (an embedding "
        "model's default on (anchor, positive) rows: in-batch negatives learn more with it).",
        bound=FRACTION,
    )
    precision: str = _hp(
        "auto",
        "Training precision. auto: the shortest whole job: on CUDA GPUs from Ampere on tf32 eagerly, or bf16 compiled "
        "in a job long enough to repay it; else fp32 (docs/training.md). bf16/fp16 on a CUDA GPU compile where that "
        "pays, else train as auto does (the log says why); torch_compile=true/false decides yourself.",
        (),
        ("auto", "fp32", "tf32", "bf16", "fp16"),
    )
    bf16: bool = _hp(False, "Same as precision=bf16: bfloat16 mixed precision (GPUs from Ampere on, Trainium).")
    fp16: bool = _hp(False, "Same as precision=fp16: float16 mixed precision (CUDA GPUs only).")
    tf32: bool | None = _hp(None, "TF32 matmuls on CUDA GPUs from Ampere on (precision=auto's); false: full fp32.")
    torch_compile: bool | None = _hp(None, "Compile the step. Default: on one CUDA GPU, jobs long enough to repay it.")
    compile_scope: str = _hp("layers", "Compiled: layers (once, any length) or model (per bucket).", (), COMPILED)
    cuda_graphs: bool = _hp(True, "compile_scope=model on a CUDA GPU: replay each step as a CUDA graph.")
    gradient_checkpointing: bool = _hp(False, "Trade compute for memory on long sequences.")
    attn_implementation: str | None = _hp(
        None, "Attention kernel: sdpa or eager. Default: the library's.", (), ("sdpa", "eager")
    )
    dataloader_num_workers: int = _hp(0, "Data-loader worker processes.", bound=WHOLE)
    # Device: Trainium (XLA) and friends
    device: str = _hp(
        "auto",
        "Where to train: auto (NeuronCores -> xla, else CUDA GPUs -> cuda, else cpu), or one of them. "
        "xla is torch-xla's path (one process per NeuronCore, fixed-shape batches); it also runs on whatever "
        "PJRT_DEVICE names, e.g. CPU, to try a Trainium job without Trainium.",
        ("accelerator",),
        ("auto", "cpu", "cuda", "xla"),
    )
    buckets: str = _hp(
        "auto",
        "Compiled paths (XLA, torch_compile): lengths are padded up to one of these sizes (e.g. 32,64,128), so only "
        "that many graphs compile; auto picks `max_buckets` sizes from the training data's lengths.",
        ("bucket_sizes",),
    )
    max_buckets: int = _hp(
        5, "Compiled paths: how many sizes buckets=auto picks (more: less padding, more graphs).", bound=COUNT
    )
    neuron_precompile: bool = _hp(
        False,
        "Compile only (neuron_parallel_compile): fill the compile cache with every bucket's training and "
        "evaluation graphs from one batch each, then stop without a model. Needs the Neuron image.",
    )
    serving_graph: bool = _hp(
        True,
        "Also write model.onnx, the forward pass as an ONNX graph whose weights stay in model.safetensors, so the "
        "endpoint serves on ONNX Runtime without importing torch (faster start and CPU inference). Skipped with a "
        "warning where the model cannot be exported.",
    )
    serving_int8: bool = _hp(
        False,
        "Also write model.int8.onnx (about a quarter of the weights' size), so that an endpoint with "
        "BYOC_INFERENCE_PRECISION=int8 starts without quantizing (about 4 s). Needs serving_graph.",
    )
    # Evaluation, logging, checkpoints
    do_eval: bool = _hp(True, "Evaluate when there is eval (or test) data.")
    do_predict: bool = _hp(
        False, "Also write per-example predictions on the test data to output/data/test_predictions.jsonl."
    )
    do_train: bool = _hp(True, "Accepted for run_glue.py compatibility; must be true.")
    eval_strategy: str = _hp(
        "auto",
        "When to evaluate during training: auto (every epoch when training several epochs, else at the end), "
        "no, steps, epoch.",
        ("evaluation_strategy",),
        ("auto", "no", "steps", "epoch"),
    )
    eval_steps: int | None = _hp(
        None, "Evaluate every N steps (with eval_strategy=steps). Default: logging_steps.", bound=COUNT
    )
    logging_steps: int = _hp(50, "Log loss, learning rate and throughput every N steps.", bound=COUNT)
    save_strategy: str = _hp(
        "auto",
        "When to write checkpoints besides on SIGTERM: no, steps, epoch; "
        "auto = steps when the job has a checkpoint_s3_uri, else no.",
        (),
        ("auto", "no", "steps", "epoch"),
    )
    save_steps: int = _hp(500, "Checkpoint every N steps (with save_strategy=steps).", bound=COUNT)
    save_total_limit: int = _hp(2, "Checkpoints kept.", bound=COUNT)
    output_dir: str | None = _hp(
        None, "Accepted for tutorial compatibility; the model always goes to SM_MODEL_DIR (/opt/ml/model)."
    )
    # The settings of the task's own training recipe the job gave, by name (each task declares its own:
    # byoc.tasks.settings; docs/hyperparameters.md lists them after these).
    recipe: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every hyperparameter by name, each recipe setting beside byoc's own (its default where not given)."""
        own = {f.name: getattr(self, f.name) for f in own_fields()}
        return {**own, **{name: self.recipe.get(name, s.default) for name, s in tasks.recipe_settings().items()}}

    def __post_init__(self) -> None:
        _validate(self)

    def trainer_arguments(self) -> dict[str, Any]:
        """What `transformers.TrainingArguments` takes as the user gave it (TRAINER_OWNS), under the Trainer's
        names. The rest of its arguments byoc decides from these and the job (byoc.training.trainer)."""
        return {TRAINER_OWNS[name] or name: getattr(self, name) for name in TRAINER_OWNS}

    @property
    def train_batch_size(self) -> int:
        """`per_device_train_batch_size`, or the default once the task is known (`for_task`)."""
        return self.per_device_train_batch_size or DEFAULT_BATCH_SIZE

    def run_rows(self, train_rows: int) -> float:
        """The rows the run sees at the default batch: `max_steps` batches of 32, else every row `epochs` times. A short
        run learns more from twice the steps at 16 (rte, 1 epoch), a longer one from 32 (3 epochs: +0.023, 4 seeds)."""
        return self.max_steps * DEFAULT_BATCH_SIZE if self.max_steps > 0 else train_rows * self.epochs

    def planned_steps(self, train_rows: int, processes: int) -> int:
        """The optimizer steps the run takes: `max_steps`, else `epochs` over `train_rows` split across `processes`."""
        per_step = self.train_batch_size * self.gradient_accumulation_steps * max(1, processes)
        return self.max_steps if self.max_steps > 0 else math.ceil(self.epochs * math.ceil(train_rows / per_step))

    def for_task(self, task: str, train_rows: int, given: Collection[str] = (), num_labels: int = 0) -> TrainArguments:
        """With the task's and the data's defaults where the user gave none (measured: docs/training.md): the batch
        size, and the task's own `training_defaults` (for data of `num_labels` labels) for those not `given`."""
        kind = tasks.get(task)
        small = kind.recipe.small_batches or self.run_rows(train_rows) < SMALL_RUN
        size = self.per_device_train_batch_size or (SMALL_BATCH_SIZE if small else DEFAULT_BATCH_SIZE)
        own = {name: value for name, value in kind.recipe.training_defaults(num_labels).items() if name not in given}
        return dataclasses.replace(self, per_device_train_batch_size=size, **own)


def own_fields() -> list[dataclasses.Field]:
    """TrainArguments' fields that are hyperparameters of byoc's own (all but the recipe's settings)."""
    return [f for f in dataclasses.fields(TrainArguments) if f.name != "recipe"]


# The hyperparameters the Trainer owns, passed to TrainingArguments as they are: each under its own name
# (None), or the Trainer's (which users may write too: an alias). They are read here rather than into a
# TrainingArguments at once (run_glue's way) because building one sets up the device and accelerate's
# distributed state (its __post_init__ reads `self.device`), which byoc decides only after reading the
# hardware and the hosts; byoc.training.trainer builds it once, from this table and those decisions.
TRAINER_OWNS: dict[str, str | None] = {
    "epochs": "num_train_epochs",
    "label_smoothing": "label_smoothing_factor",
    **dict.fromkeys(("max_steps", "learning_rate", "per_device_eval_batch_size", "gradient_accumulation_steps")),
    **dict.fromkeys(("weight_decay", "lr_scheduler_type", "max_grad_norm", "seed", "logging_steps", "save_steps")),
    **dict.fromkeys(("save_total_limit", "dataloader_num_workers")),
}


def _validate(args: TrainArguments) -> None:
    _check_bounds(args)
    if args.max_steps <= 0 and not args.epochs > 0:
        raise HyperparameterError(
            f"hyperparameter epochs must be greater than 0 (or set max_steps), got {args.epochs!r}"
        )
    if not args.do_train:
        raise HyperparameterError(
            "hyperparameter do_train=false: `byoc train` always trains; remove it or set it to true"
        )
    bucket_sizes(args)  # a bad list fails here, before any work
    try:
        args.task = tasks.trained_name(args.task)
    except ValueError as err:
        raise HyperparameterError(f"hyperparameter {err}") from None
    if args.mine_hard_negatives and args.negatives_range_max <= args.negatives_range_min:
        raise HyperparameterError(
            f"hyperparameter negatives_range_max={args.negatives_range_max} must be above negatives_range_min="
            f"{args.negatives_range_min}: the negatives are mined among the texts ranked between them"
        )
    _check_precision(args)
    if args.serving_int8 and not args.serving_graph:
        raise HyperparameterError(
            "hyperparameter serving_int8=true needs serving_graph=true (the int8 graph is made "
            "from it): drop serving_graph=false or serving_int8"
        )


# What a range means for a setting, where its bound alone does not say.
_RANGE_NOTES = {
    "epochs": " (to train for a number of steps, set max_steps)",
    "max_steps": " (-1 or 0: train for `epochs`)",
}


def _check_bounds(args: TrainArguments) -> None:
    """Every bounded hyperparameter against its range; the message names it, its range and the value."""
    hints, recipes = typing.get_type_hints(TrainArguments), tasks.recipe_settings()
    bounded = [(f.name, hints[f.name], f.metadata["bound"], getattr(args, f.name)) for f in own_fields()]
    bounded += [(name, recipes[name].hint, recipes[name].bound, value) for name, value in args.recipe.items()]
    for name, hint, bound, value in bounded:
        if bound is None or value is None or bound.holds(value):
            continue
        unset = " or null (unset)" if base_type(hint)[1] else ""
        raise HyperparameterError(
            f"hyperparameter {name} must be {bound.describe()}{unset}{_RANGE_NOTES.get(name, '')}, got {value!r}"
        )


def _check_precision(args: TrainArguments) -> None:
    """precision, bf16, fp16 and tf32 must agree (tf32 beside bf16/fp16: may autocast's fp32 ops use TF32)."""
    wanted = ({args.precision} - {"auto"}) | {name for name in ("bf16", "fp16") if getattr(args, name)}
    full = {"tf32" if args.tf32 else "fp32"} if args.tf32 is not None else set()
    if len(wanted) > 1 or (full and wanted & {"fp32", "tf32"} and wanted != full):
        raise HyperparameterError(
            f"hyperparameters precision, bf16, fp16 and tf32 disagree ({' and '.join(sorted(wanted | full))}): set "
            "precision alone, to one of auto, fp32, tf32, bf16, fp16"
        )


def label_column_list(args: TrainArguments) -> list[str] | None:
    """The `label_columns` hyperparameter as column names (None: not given). Takes a,b and ["a", "b"]."""
    names = [part.strip().strip("'\"").strip() for part in str(args.label_columns or "").strip("[] ").split(",")]
    return [n for n in names if n] or None


def bucket_sizes(args: TrainArguments) -> list[int] | None:
    """The `buckets` hyperparameter as ascending sizes, or None for auto. Takes 32,64 and [32, 64]."""
    sizes = _sizes(args.buckets, "buckets", "auto or a list of positive sizes such as 32,64,128")
    if sizes and sizes[-1] > args.max_length:
        raise HyperparameterError(
            f"hyperparameter buckets has {sizes[-1]}, above max_length={args.max_length}: "
            "texts are cut at max_length, so no bucket needs to be longer; lower it or raise max_length"
        )
    return sizes or None


def _sizes(value: Any, name: str, expected: str) -> list[int]:
    """Positive whole numbers written as a list ([] for none, or auto), ascending, each once."""
    if str(value or "").strip("[]() ").lower() == "auto":
        return []
    try:
        return sorted(sizes(value))
    except ValueError:
        raise HyperparameterError(f"hyperparameter {name} must be {expected}, got {value!r}") from None
