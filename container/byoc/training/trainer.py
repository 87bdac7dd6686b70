"""The `Trainer` for a job: byoc's samplers and sealed checkpoints in a `Trainer` subclass (every
override of a transformers private method is here, listed in `byoc.compat.TRAINER_HOOKS`), and the
`TrainingArguments` a job's device and precision call for."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainerState,
    TrainingArguments,
)
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_callback import ProgressCallback as TqdmCallback

from byoc import compat, tasks
from byoc.contract import TrainingContract
from byoc.launch import distributed
from byoc.tasks import IGNORE_LABEL
from byoc.training import compiled_steps, packing, precision, tracking, xla
from byoc.training.arguments import HyperparameterError, TrainArguments
from byoc.training.buckets import FixedShapeCollator
from byoc.training.checkpoints import EvaluationStopped, mark_complete, rotate
from byoc.training.divergence import DivergenceGuard
from byoc.training.metrics import ProgressCallback, TaskMetrics
from byoc.training.model import own_learning_rates
from byoc.training.precision import Precision
from byoc.training.samplers import FixedShapeSampler, LengthBucketSampler, length_order

logger = logging.getLogger(__name__)


class TaskTrainer(Trainer):
    """`Trainer` with byoc's samplers, sealed checkpoints, and evaluations SIGTERM can cut short.

    The private methods overridden here are listed in `byoc.compat.TRAINER_HOOKS` and checked
    against the installed transformers when a job starts.

    Evaluation runs in a known order: by length, which is fast and reproducible (transformers 5
    length-groups *and shuffles* evaluation when training is length-grouped).
    """

    def __init__(
        self,
        *args: Any,
        buckets: list[int] | None = None,
        use_xla: bool = False,
        shard_consumers: list[int] | None = None,
        precompile: bool = False,
        compiled: bool = False,
        task: str = tasks.DEFAULT,
        train_collator: Any = None,
        **kwargs: Any,
    ) -> None:
        """`Trainer`'s own arguments, and byoc's: `buckets`, the fixed-shape length buckets (XLA, or
        torch_compile); `use_xla`; `shard_consumers`, the ranks that read each host's shard when
        each host trains on its own; `precompile` (neuron_precompile: one batch per shape, then stop);
        `compiled`: the steps run under torch.compile (their graphs are counted, as XLA's are);
        `task`: the name of the byoc.tasks task (those that mask filler rows compute their loss here);
        `train_collator`: the training batches' own, where it is not `data_collator` (the evaluation's)."""
        super().__init__(*args, **kwargs)
        self.train_collator = train_collator
        self.task = tasks.get(task)
        self.buckets, self.use_xla = buckets, use_xla
        self.shard_consumers, self.precompile = shard_consumers, precompile
        self.bucket_sampler: LengthBucketSampler | None = None
        self.add_callback(_SamplerEpoch(self))
        self.divergence = DivergenceGuard(self.args.learning_rate)  # a NaN loss fails the job
        self.add_callback(self.divergence)
        self.compile_report: compiled_steps.CompileReport | None = None
        if use_xla or compiled:
            self.compile_report = compiled_steps.CompileReport(use_xla)
            self.add_callback(self.compile_report)

    def resume_finished(self, checkpoint: Path) -> dict[str, Any]:
        """Load a checkpoint saved once training was complete (a stop during the final evaluation):
        its weights and state, without training again. `Trainer.train` would run one step past
        max_steps when resumed at max_steps mid-epoch. Returns the training's own metrics."""
        self._load_from_checkpoint(str(checkpoint))
        self.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
        return next((h for h in reversed(self.state.log_history) if "train_runtime" in h), {})

    def save_final_checkpoint(self) -> None:
        """A sealed checkpoint of the finished training (before a stop during the final evaluation):
        the rerun resumes it with `resume_finished` and only evaluates."""
        self._save_checkpoint(self.model, None)

    def get_train_dataloader(self):
        # The Trainer builds both loaders on `data_collator`: the training loader takes its own here.
        if self.train_collator is None:
            return super().get_train_dataloader()
        evaluation, self.data_collator = self.data_collator, self.train_collator
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = evaluation

    def _get_train_sampler(self, train_dataset=None):
        dataset: Any = train_dataset if train_dataset is not None else self.train_dataset
        if "input_ids" not in dataset.column_names or not (self.buckets or compat.is_length_grouped(self.args)):
            return super()._get_train_sampler(train_dataset)
        lengths = row_lengths(dataset)
        if self.buckets:  # compiled: every batch one of a few fixed shapes
            self.bucket_sampler = FixedShapeSampler(
                lengths,
                self.buckets,
                self.args.per_device_train_batch_size,
                self.args.seed,
                self.args.world_size,
                self.shard_consumers,
                one_per_shape=self.precompile,
            )
        else:
            self.bucket_sampler = LengthBucketSampler(
                lengths,
                self.args.per_device_train_batch_size,
                self.args.seed,
                self.args.world_size,
                self.shard_consumers,
            )
        return self.bucket_sampler

    def _get_eval_sampler(self, eval_dataset):
        # With several ranks, accelerate deals the batches round-robin and gathers them back in order.
        if eval_dataset is None or "input_ids" not in eval_dataset.column_names:
            return super()._get_eval_sampler(eval_dataset)
        return length_order(eval_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Multi-label and regression: the model's own loss (binary cross-entropy, mean squared error)
        over the rows that are not filler rows of a fixed-shape batch (labelled IGNORE_LABEL), which
        their losses, unlike cross-entropy, cannot skip. A mask, not a selection: shapes stay fixed."""
        if not self.task.recipe.masks_rows or "labels" not in inputs:  # cross-entropy skips -100 itself
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs["labels"]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        loss = masked_loss(outputs.logits, labels, self.task)
        return (loss, outputs) if return_outputs else loss

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        own_learning_rates(optimizer, self.model)
        if self.use_xla and "weight_decay" in optimizer.defaults:
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


def row_lengths(dataset: Any) -> list[Any]:
    """Each row's length in tokens; a length per text where a row holds several (an embedding model's)."""
    columns = [dataset[name] for name in dataset.column_names if name.endswith("input_ids")]
    if len(columns) == 1:
        return [len(ids) for ids in columns[0]]
    return [[len(ids) for ids in texts] for texts in zip(*columns)]


def masked_loss(logits: torch.Tensor, labels: torch.Tensor, task: tasks.Task) -> torch.Tensor:
    """transformers' loss for the task (its `row_loss`: BCE-with-logits for multi-label, MSE for regression),
    as a mean over the rows whose label is not IGNORE_LABEL; the same number where no row is filler."""
    rows = labels.shape[0]
    keep = (labels.reshape(rows, -1)[:, 0] != IGNORE_LABEL).to(torch.float32)
    per_row = task.recipe.row_loss(logits, labels)
    return (per_row * keep).sum() / keep.sum().clamp(min=1.0)


class _SamplerEpoch(TrainerCallback):
    """Tell the bucket sampler which epoch starts, also on resume and with several ranks.

    (With several ranks accelerate wraps the sampler in `BatchSamplerShard`, and the Trainer's
    `set_epoch` no longer reaches it: a resumed job would replay epoch 0's order.)
    """

    def __init__(self, trainer: TaskTrainer) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.bucket_sampler is not None:
            self.trainer.bucket_sampler.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))


def device_arguments(args: TrainArguments, use_xla: bool, cuda: bool | None = None) -> dict[str, Any]:
    """What the device path changes in `TrainingArguments`; `cuda`: the hardware (default: torch's
    view). AdamW is the Trainer's default, fused, on CUDA."""
    if use_xla:
        # Fused AdamW refuses XLA tensors. (Every training batch is full already: the sampler sees to
        # it; drop_last would also drop the last evaluation batch, which the collator pads instead.)
        # Evaluation results move to the host after every step: kept on the device, they would be
        # concatenated into a growing tensor, a new shape (and graph) at each step.
        return {"optim": "adamw_torch", "eval_accumulation_steps": 1}
    if not on_cuda(args, use_xla, cuda):
        return {"use_cpu": True}
    return {
        "use_cpu": False,
        # Batches are copied from pinned memory without the host waiting for the copy (accelerate's
        # DataLoader moves them to the GPU; the default copy blocks the host once a step).
        "accelerator_config": {"non_blocking": True},
    }


def on_cuda(args: TrainArguments, use_xla: bool, cuda: bool | None = None) -> bool:
    """Whether this process trains on its CUDA GPU (`cuda`: whether one is visible; default: torch's view)."""
    if use_xla:
        return False
    cuda = torch.cuda.is_available() if cuda is None else cuda
    gloo = distributed.is_distributed() and distributed.backend() == "gloo"
    # A CPU job says so: accelerate treats several CPU processes as one data-parallel job only when
    # told they are CPU ones, and with transformers 4.55 it takes torch-xla's device wherever
    # torch-xla is installed (the Neuron image on a host without NeuronCores), fused AdamW and all.
    return cuda and not gloo and args.device != "cpu"


def precision_arguments(chosen: Precision, cuda: bool) -> dict[str, Any]:
    """`TrainingArguments`' bf16/fp16/tf32 for the chosen precision (tf32 is a CUDA setting only)."""
    flags = chosen.training_arguments()
    if not cuda:
        flags.pop("tf32")
    return flags


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


def build_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tokenized: dict[str, Any],
    args: TrainArguments,
    contract: TrainingContract,
    label_names: list[str],
    buckets: list[int] | None = None,
    use_xla: bool = False,
    chosen: Precision | None = None,
    shard_consumers: list[int] | None = None,
    task: str = tasks.DEFAULT,
    run: tracking.Run | None = None,
) -> TaskTrainer:
    """The Trainer for this job; `buckets` (XLA, or torch_compile) switches to fixed-shape batches;
    `chosen`: the job's precision (default: chosen here, from `args` and this machine);
    `shard_consumers`: the ranks reading each host's shard, when each host trains on its own;
    `task`: what the labels are (a byoc.tasks name), which picks the loss, the collator and the metrics;
    `run`: the job's MLflow run, which then gets every log the Trainer reports."""
    kind = tasks.get(task)
    if not kind.recipe.smooths_labels and args.label_smoothing:
        raise HyperparameterError(
            f"hyperparameter label_smoothing smooths one class per text; task {task} has no classes to smooth: "
            "remove label_smoothing"
        )
    compat.check_trainer_hooks(TaskTrainer.__mro__[1])  # the private methods overridden below
    cuda = on_cuda(args, use_xla)
    if chosen is None:
        chosen = precision.choose(args, precision.detect(use_xla, distributed.world_size()))
    compiling = chosen.compile and not use_xla
    encoder = kind.recipe.encoder_of(model)
    packing_report = packing.prepare(encoder, args, use_xla, cuda, compiling)  # (before compiling)
    if buckets is not None and compiling and args.compile_scope == "model":
        compiled_steps.static_graphs_per_bucket(buckets)
    elif compiling:  # (compile_scope=layers: the job compiles them; the Trainer compiles nothing)
        compiled_steps.compile_layers(encoder, compiled_steps.compile_mode(args, cuda))
    eval_ds = tokenized.get("eval", tokenized.get("test"))
    has_eval = eval_ds is not None
    strategy = _eval_strategy(args, has_eval)
    checkpoint_dir = contract.checkpoint_folder
    training_args = TrainingArguments(
        **args.trainer_arguments(),  # what the Trainer owns, as the user gave it; byoc decides the rest:
        output_dir=str(checkpoint_dir),
        per_device_train_batch_size=args.train_batch_size,
        length_column_name="length",
        eval_strategy=strategy,
        eval_steps=args.eval_steps or args.logging_steps,
        save_strategy=save_strategy(args, contract),
        save_on_each_node=len(contract.hosts) > 1,  # each host resumes from its own copy
        logging_strategy="steps",
        # Off: a NaN loss shows in the logged average (byoc.training.divergence fails the job on it)
        # instead of being replaced by the average before it; and on a GPU the filter's check of every
        # step's loss on the host (`if torch.isnan(loss) or ...`) costs one synchronisation a step.
        logging_nan_inf_filter=False,
        report_to="none",  # our own callbacks below: readable lines and TensorBoard in output/
        disable_tqdm=True,
        **compiled_steps.compile_arguments(args, compiling, use_xla, cuda),
        dataloader_pin_memory=cuda,
        ddp_backend=distributed.backend() if distributed.is_distributed() and not use_xla else None,
        # One label per row and equal per-rank batches: DDP's gradient average is already the global
        # mean. (transformers would otherwise scale the loss by the world size for token-count losses.)
        average_tokens_across_devices=False,
        ddp_find_unused_parameters=False,  # every trainable parameter of a classifier is used
        # (the Trainer would keep only the columns its model's forward names: a listwise reranker's takes any)
        remove_unused_columns=not kind.rows.any_columns,
        **compat.sampling_arguments(
            args.group_by_length and not args.pad_to_max_length and not use_xla,
            args.warmup_steps,
            args.warmup_ratio,
            args.gradient_checkpointing,
        ),
        **precision_arguments(chosen, cuda),
        **device_arguments(args, use_xla, cuda),
    )

    compute_metrics = TaskMetrics(task, label_names, args.threshold, choosing="eval" in tokenized)
    collator: Any
    train_collator: Any = None
    if buckets is not None:
        # Each loader's batches fill up to its own batch size: an evaluation's last, short batch with filler
        # rows; training batches are always full, and filling them up to the evaluation's 64 rows would
        # spend the compute of 64 rows on every step (and give in-batch negatives filler rows as negatives).
        collator = FixedShapeCollator(tokenizer.pad_token_id or 0, buckets, args.per_device_eval_batch_size)
        train_collator = kind.recipe.with_labels(
            FixedShapeCollator(tokenizer.pad_token_id or 0, buckets, args.train_batch_size),
            len(label_names),
        )
    else:
        # On a GPU, lengths padded to a multiple of 8: tensor-core-aligned matrices in bf16/fp16/TF32,
        # and fewer distinct shapes for the kernel and allocator caches. (On CPU, padding is pure cost.)
        collator = kind.recipe.collator(tokenizer, pad_to_multiple_of=8 if cuda else None)
    collator = kind.recipe.with_labels(collator, len(label_names))
    trainer = TaskTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=eval_ds if strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
        buckets=buckets,
        use_xla=use_xla,
        shard_consumers=shard_consumers,
        precompile=args.neuron_precompile,
        compiled=compiling,
        task=task,
        train_collator=train_collator,
    )
    trainer.add_callback(packing_report)
    for callback in (PrinterCallback, TqdmCallback):
        trainer.remove_callback(callback)
    samples_per_step = args.train_batch_size * args.gradient_accumulation_steps * training_args.world_size
    trainer.add_callback(ProgressCallback(samples_per_step))
    if trainer.is_world_process_zero():
        # Only on rank 0, which alone writes TensorBoard events (the import loads tensorboard).
        from torch.utils.tensorboard import SummaryWriter

        trainer.add_callback(TensorBoardCallback(SummaryWriter(log_dir=str(contract.paths.tensorboard_dir))))
        if run is not None:  # MLflow gets what TensorBoard gets
            trainer.add_callback(TrackedLogs(run))
    return trainer


class TrackedLogs(TrainerCallback):
    """Every `logs` the Trainer reports (a logging step's loss, learning rate and samples/s; an
    evaluation's metrics) to the job's MLflow run (byoc.training.tracking), at its step: the same
    dict TensorBoardCallback writes."""

    def __init__(self, run: tracking.Run) -> None:
        self.run = run

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero:
            self.run.log_metrics(logs, step=state.global_step)
