"""The training job as named steps, in the order `main` runs them:

    prepare(contract, args, settings)  device, model source, data, tokenizer, tokens, shards, buckets
    load_model(...)                    the classifier with the job's labels (byoc.training.model)
    make_trainer(job, model)           the Trainer for this device and precision (byoc.training.trainer)
    train_and_evaluate(job, trainer)   resume, train, final evaluation; SIGTERM saves a checkpoint
    finish(job, trainer, metrics)      predictions, metrics.json, the model folder (rank 0)

`code/train.py`, the script users copy, composes the same steps, so what they change is what is tested.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from byoc import __version__, tasks
from byoc.contract import TrainingContract
from byoc.launch import distributed
from byoc.training import packing, phases, precision, xla
from byoc.training.arguments import TrainArguments, label_column_list
from byoc.training.artifact import default_code_dir, publish_model, write_predictions
from byoc.training.buckets import choose_job_buckets, padding_efficiency
from byoc.training.checkpoints import StopOnSignal, check_job, common_resume_point, drop_after
from byoc.training.compiled_steps import COMPILE_CACHE_CHANNEL, COMPILE_CACHE_DIR, persistent_cache, wants_buckets
from byoc.training.corpus_evaluation import check_sets, evaluate_sets
from byoc.training.data import DataSpec, TaskData, load_task_data
from byoc.training.data.beir import RetrievalSet, split_retrieval_channels
from byoc.training.evaluation import Failures, decision_thresholds, final_evaluation
from byoc.training.hyperparameters import given_names
from byoc.training.metrics import metrics_line, write_report
from byoc.training.model import ModelError, ModelSource, load_tokenizer, model_max_length, resolve_model
from byoc.training.model import load_model as _load_model  # job.load_model is the step
from byoc.training.negatives import as_pairs, check_in_batch_negatives, mine_hard_negatives
from byoc.training.precision import Precision
from byoc.training.samplers import FixedShapeSampler
from byoc.training.settings import TrainingSettings
from byoc.training.shards import agree_on_shards
from byoc.training.stopping import Stopped
from byoc.training.tokenization import tokenize_splits
from byoc.training.trainer import TaskTrainer, build_trainer

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """What `prepare` found, handed to the later steps."""

    contract: TrainingContract
    args: TrainArguments  # as given, or narrowed to a precompile run
    use_xla: bool
    code_dir: Path  # the inference code copied into model/code
    source: ModelSource
    data: TaskData
    tokenizer: PreTrainedTokenizerBase
    tokenized: dict[str, Any]  # split name -> tokenized dataset
    shard_consumers: list[int] | None  # the ranks reading this host's shard (ShardedByS3Key), else None
    buckets: list[int] | None  # fixed-shape length buckets (XLA, or torch_compile)
    precision: Precision  # what the step computes in, and whether it compiles
    failures: Failures = field(default_factory=Failures)  # after training: kept until the model is saved
    run: Any = None  # the MLflow run (TrainingSettings.run), where the job is tracked
    retrieval: dict[str, RetrievalSet] = field(default_factory=dict)  # BEIR sets by split, evaluated after training
    retriever: str | None = None  # a reranker's: the embedding model retrieving what it reranks in those sets
    clock: phases.Clock = field(default_factory=phases.Clock)  # (prepare starts it: `data` ends as it returns)

    @property
    def label_names(self) -> list[str]:
        return self.data.label_names


def main(contract: TrainingContract, args: TrainArguments, settings: TrainingSettings) -> dict[str, Any]:
    """byoc's training job (or this rank's part of it), end to end; returns the final metrics.
    `byoc train` runs it under `byoc.training.entry.run_job`, as `code/train.py` runs its own `main`."""
    with stop_on_sigterm() as stop:
        job = prepare(contract, args, settings)
        model = load_model(job)
        trainer = make_trainer(job, model)
        metrics = train_and_evaluate(job, trainer, stop)
        metrics = finish(job, trainer, metrics)
    distributed.teardown()  # a job that succeeded: every rank waits for rank 0's artifact, then leaves together
    return metrics


@contextmanager
def stop_on_sigterm() -> Iterator[StopOnSignal]:
    """SIGTERM before training starts stops at once; during training it saves a checkpoint first."""
    stop = StopOnSignal()
    stop.install()
    try:
        yield stop
    finally:
        stop.uninstall()


def cache_dir_for(settings: TrainingSettings) -> Path:
    """Writable scratch for tokenized data and unpacked models; never under input/data (may be read-only)."""
    root = settings.cache_dir
    root.mkdir(parents=True, exist_ok=True)
    return root


def prepare(contract: TrainingContract, args: TrainArguments, settings: TrainingSettings | None = None) -> Job:
    """The device, the model's source, the data and its tokens; the shards and buckets every rank agrees on.
    `settings`: the job's, as `byoc.training.entry.run_job` read them; else (a `main` of an older
    code/train.py, which gets none) read from the environment here."""
    clock = phases.Clock()  # (the job's wall time by phase: metrics.json's phases_seconds)
    settings = settings or TrainingSettings.from_env()
    use_xla = settings.use_xla
    if use_xla is None:  # not through the entry (which decides once, before transformers loads)
        use_xla = xla.wants_xla(args.device, settings)
        if use_xla:
            xla.prepare_environment(contract.checkpoint_folder, settings.xla)
    if not use_xla and args.device == "cuda" and not torch.cuda.is_available():
        raise ModelError("device=cuda but no CUDA GPU is visible: use a GPU instance (ml.g5, ml.p4d...) or device=auto")
    distributed.setup(settings.rank)
    transformers.set_seed(args.seed)
    transformers.utils.logging.disable_progress_bar()  # byoc logs progress as lines
    code_dir = default_code_dir(settings.code_dir)  # fail before hours of training, not after
    cache_dir = cache_dir_for(settings)
    with distributed.host_leader_first():  # one rank per host fills the caches, the others reuse them
        source = resolve_model(args, contract, cache_dir)
        logger.info("model: %s (%s)", source.path, source.origin)
        spec = DataSpec(
            text_column=args.text_column,
            text_pair_column=args.text_pair_column,
            label_column=args.label_column,
            label_columns=label_column_list(args),
            task=args.task,
            label_delimiter=args.label_delimiter,
            validation_split=args.validation_split,
            seed=args.seed,
            max_train_samples=args.max_train_samples,
            max_eval_samples=args.max_eval_samples,
        )
        channels, retrieval = split_retrieval_channels(contract.channel_dirs)  # BEIR sets: evaluated, not rows
        data = load_task_data(channels, spec, cache_dir)
        retriever = check_sets(retrieval, data.task, contract.channel_dirs.get("miner"))  # a reranker's searcher
        # The task's defaults, now that the task is known, where the job gave none.
        given = given_names(contract.hyperparameters)
        resolved = args.for_task(data.task, len(data.train), given, len(data.label_names))
        if args.per_device_train_batch_size is None:
            logger.info(
                "per_device_train_batch_size: %d (the default for %s on %d rows, %g in the whole run)",
                resolved.train_batch_size,
                data.task,
                len(data.train),
                resolved.run_rows(len(data.train)),
            )
        for name in sorted(set(tasks.get(data.task).recipe.training_defaults(len(data.label_names))) - given):
            logger.info("%s: %s (the default for %s)", name, getattr(resolved, name), data.task)
        args = resolved
        data = mine_hard_negatives(data, source.path, args, contract.channel_dirs.get("miner"))  # (when asked)
        data = as_pairs(data)  # a reranker's pairs of an embedding model's rows
        check_in_batch_negatives(data, args.train_batch_size, distributed.world_size())  # before anything slow
        tokenizer = load_tokenizer(source, args)
        # The one input length every later step uses (tokens, buckets, the saved model): at most the model's.
        args = dataclasses.replace(args, max_length=min(args.max_length, model_max_length(tokenizer)))
        tokenized = tokenize_splits(data, tokenizer, args, cache_dir)
    shard_consumers = agree_on_shards(contract, data, tokenized)
    steps = args.planned_steps(len(tokenized["train"]), distributed.world_size())
    chosen = precision.choose(args, precision.detect(use_xla, distributed.world_size()), steps)
    logger.info("precision: %s (%s)%s", chosen.name, chosen.reason, "; step compiled" if chosen.compile else "")
    args = dataclasses.replace(args, torch_compile=chosen.compile)  # later steps see the decision
    if chosen.compile and not use_xla:
        seeds = (contract.channel_dirs.get(COMPILE_CACHE_CHANNEL), Path(source.path) / COMPILE_CACHE_DIR)
        found = tuple(Path(f) for f in seeds if f)
        cache = persistent_cache(contract.checkpoint_folder, settings.compile_cache, found, args.trust_remote_code)
        logger.info("torch.compile cache: %s", cache)
    buckets = None
    if use_xla:
        xla.initialize(contract.checkpoint_folder, settings.xla)
    if wants_buckets(chosen.compile, use_xla):
        buckets = choose_job_buckets(tokenized, args, use_xla)
    if args.neuron_precompile:
        if buckets is None:
            raise ModelError(
                "neuron_precompile=true compiles the XLA path's graphs: run on NeuronCores or set device=xla"
            )
        shapes = FixedShapeSampler(
            tokenized["train"]["length"], buckets, args.train_batch_size, args.seed, distributed.world_size()
        ).shapes()
        logger.info(
            "precompiling: one training batch of each shape %s, then one evaluation; no model is written", shapes
        )
        args = dataclasses.replace(args, max_steps=len(shapes), eval_strategy="no", save_strategy="no")
    clock.mark("data")
    return Job(
        contract,
        args,
        use_xla,
        code_dir,
        source,
        data,
        tokenizer,
        tokenized,
        shard_consumers,
        buckets,
        chosen,
        run=settings.run,
        retrieval=retrieval if args.do_eval and not args.neuron_precompile else {},
        retriever=retriever,
        clock=clock,
    )


def load_model(job: Job) -> PreTrainedModel:
    """The classifier for the job's labels (`byoc.training.model.load_model`)."""
    return _load_model(job.source, job.args, job.label_names, job.use_xla, job.data.task, job.data.paired)


def make_trainer(job: Job, model: PreTrainedModel) -> TaskTrainer:
    """The Trainer for this job's device and precision, with its shards and precompile mode."""
    trainer = build_trainer(
        model,
        job.tokenizer,
        job.tokenized,
        job.args,
        job.contract,
        job.label_names,
        job.buckets,
        job.use_xla,
        job.precision,
        job.shard_consumers,
        task=job.data.task,
        run=job.run,
    )
    job.clock.steps.graphs = trainer.compile_report.count if trainer.compile_report else None
    trainer.add_callback(job.clock.steps)
    job.clock.mark("model")
    return trainer


def train_and_evaluate(job: Job, trainer: TaskTrainer, stop: StopOnSignal) -> dict[str, Any]:
    """Resume from the newest complete checkpoint, train, evaluate; on SIGTERM save and raise `Stopped`."""
    args = job.args
    checkpoint_dir = job.contract.checkpoint_folder  # the Trainer's output_dir
    # A precompile run neither resumes nor leaves checkpoints: it shares only the compile cache.
    resume = None if args.neuron_precompile else common_resume_point(checkpoint_dir)
    if trainer.is_local_process_zero() and not args.neuron_precompile:
        check_job(checkpoint_dir, _job_fingerprint(args, job.data, job.source, trainer.args.world_size))
        drop_after(checkpoint_dir, resume)
    distributed.barrier()
    trainer.add_callback(stop)
    if resume is not None:
        logger.info("resuming from %s", resume)
    if resume is not None and _finished(resume):
        # Stopped during the final evaluation: training is complete, only the evaluation is left.
        train_metrics = trainer.resume_finished(resume)
    else:
        train_metrics = trainer.train(resume_from_checkpoint=str(resume) if resume else None).metrics
    if stop.stopped_at is not None:
        raise Stopped(
            stop.stopped_at,
            trainer.state.max_steps,
            checkpoint_dir,
            "during an evaluation" if stop.evaluation_stopped else "training",
        )
    if not args.neuron_precompile:  # a precompile run's weights are a cache's by-product, not a model
        trainer.divergence.check(trainer.model)  # a NaN loss or NaN weights: fail, publish nothing
    metrics: dict[str, Any] = dict(train_metrics)
    stop.arm("the final evaluation")
    if stop.stop_now():  # SIGTERM came as training ended
        stop.evaluation_stopped = True
    else:
        with job.failures.kept("the final evaluation"):  # never at the cost of the trained model
            metrics.update(final_evaluation(trainer, job.tokenized, args))
    if stop.evaluation_stopped:  # training is done: keep it, and evaluate again on the rerun
        trainer.save_final_checkpoint()
        raise Stopped(trainer.state.global_step, trainer.state.max_steps, checkpoint_dir, "the final evaluation")
    stop.arm("writing predictions")  # seconds from the end: finish rather than stop
    job.clock.mark("training")
    return metrics


def finish(job: Job, trainer: TaskTrainer, metrics: dict[str, Any]) -> dict[str, Any]:
    """Test predictions (every rank takes part), then on rank 0 metrics.json and the model folder.

    A failure of the final evaluation or of the predictions fails the job only once the model is saved."""
    args, tokenized, failures = job.args, job.tokenized, job.failures
    predictions = None
    if args.do_predict and "test" in tokenized and failures.agreed() is None:
        with failures.kept("the test predictions"):
            predictions = trainer.predict(tokenized["test"], metric_key_prefix="test")
    if not trainer.is_world_process_zero():
        return metrics
    paths = job.contract.paths
    if predictions is not None:
        with failures.kept("writing the test predictions"):  # at the thresholds the model is saved with
            cuts = decision_thresholds(trainer)
            write_predictions(
                predictions, tokenized["test"], job.label_names, paths.output_data_dir, job.data.task, cuts
            )
    if job.retrieval and failures.first is None:
        with failures.kept("the evaluation on the retrieval set"):
            ranked = evaluate_sets(job.retrieval, job.data.task, trainer.model, args, job.tokenizer, job.retriever)
            logger.info(metrics_line(ranked))  # a [metrics] line: what the metric definitions read
            metrics = {**metrics, **ranked}
    summary = {**metrics, **_job_summary(job, trainer)}
    if failures.first:
        summary["evaluation_failure"] = failures.first
    report = write_report(paths.output_data_dir, summary, trainer.state.log_history)
    logger.info(metrics_line({k: v for k, v in summary.items() if isinstance(v, (int, float))}, tag="final"))
    if args.neuron_precompile:  # the weights saw a handful of steps: a cache, not a model
        logger.info(
            "precompiled %d graph(s) into the compile cache; train without neuron_precompile to get a model",
            summary.get("xla_graphs_compiled", 0),
        )
        failures.raise_after_saving(None)
        return summary
    # The artifact comes last and whole: assembled in a staging folder, then moved into model/.
    job.clock.mark("evaluation")  # (the test predictions, a retrieval set, the report)
    publish_model(
        trainer,
        job.tokenizer,
        job.code_dir,
        paths.model_dir,
        serving_graph=args.serving_graph,
        serving_int8=args.serving_int8,
        max_length=args.max_length,
        trust_remote_code=args.trust_remote_code,
    )
    job.clock.mark("saving")
    job.clock.steps.measured = xla.compile_seconds() if job.use_xla else None
    job.clock.report(report, trainer.state.log_history)
    logger.info("model saved to %s; metrics in %s", paths.model_dir, report)
    failures.raise_after_saving(paths.model_dir)
    return summary


def _job_summary(job: Job, trainer: TaskTrainer) -> dict[str, Any]:
    """What metrics.json says of the job besides its metrics: labels, sizes, where and how it ran."""
    xla_figures: dict[str, Any] = {}
    if job.buckets:
        xla_figures = {
            "buckets": job.buckets,
            "padding_efficiency": round(padding_efficiency(job.tokenized["train"]["length"], job.buckets), 4),
            **(trainer.compile_report.summary() if trainer.compile_report else {}),
        }
    return {
        "task": job.data.task,
        **({"metric_notes": dict(notes)} if (notes := tasks.get(job.data.task).evaluation.metric_notes) else {}),
        "num_labels": len(job.label_names),
        "labels": job.label_names,
        "train_samples": len(job.tokenized["train"]),
        "world_size": trainer.args.world_size,
        "device": trainer.args.device.type,  # cuda, cpu or xla: where the job really ran
        "precision": job.precision.name,  # fp32, tf32, bf16 or fp16
        "precision_reason": job.precision.reason,
        "model": job.source.origin,
        **xla_figures,
        **packing.summary(trainer),
        "hyperparameters": job.args.as_dict(),
        "versions": {
            "byoc": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }


def _finished(checkpoint: Path) -> bool:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state.get("max_steps", 0) > 0 and state.get("global_step", 0) >= state["max_steps"]


# Settings that change what is trained; the others (logging, evaluation, saving) may change on resume.
_NOT_TRAJECTORY = {
    "logging_steps",
    "eval_strategy",
    "eval_steps",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "do_eval",
    "do_predict",
    "do_train",
    "output_dir",
    "dataloader_num_workers",
    "max_eval_samples",
}


def _job_fingerprint(args: TrainArguments, data: TaskData, source: ModelSource, world_size: int) -> dict[str, Any]:
    job = {k: v for k, v in args.as_dict().items() if k not in _NOT_TRAJECTORY}
    job.update(labels=data.label_names, train_rows=len(data.train), model=source.origin, world_size=world_size)
    return job
