"""One rank of `byoc encode`: the model loaded as `byoc serve` loads it (byoc.serving.default_pipeline, the same
backend choice, length-sorted passes and answers, so the vectors are serving's), then the rank's shards encoded
in order, each written whole (byoc.encoding.columns) to the checkpoint folder and linked into the output.

A shard already in the checkpoint folder (an earlier run's, restored by SageMaker after a spot interruption) is
skipped. A SIGTERM stops the rank between two batches; the shard at hand is dropped, none half-written is left.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from byoc import sentence_folder, tasks
from byoc.encoding import columns, corpus
from byoc.encoding.settings import EncodeError, EncodeSettings
from byoc.encoding.shards import CorpusFile, Shard
from byoc.serving import default_pipeline
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import InferenceSettings
from byoc.tasks.kinds import Kind

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 30.0
stop_requested = threading.Event()  # set by this process's SIGTERM handler (byoc.encoding.entry); read between batches
# The job's stop, shared with ranks of their own (a multiprocessing Event, set by the job's process): a rank
# started after the SIGTERM came, which its own handler never saw, stops too (byoc.encoding.ranks).
shared_stop: Any = None


def stopping() -> bool:
    return stop_requested.is_set() or (shared_stop is not None and shared_stop.is_set())


def check_stop(where: str) -> None:
    """Raise Stopped where a stop was asked for: between two files, two batches, before the model loads."""
    if stopping():
        raise Stopped(f"stopped by SIGTERM {where}")


class Stopped(BaseException):
    """The rank stopped on SIGTERM; what it finished is kept. A BaseException, as KeyboardInterrupt."""


@dataclass(frozen=True)
class RankJob:
    """What a rank needs, read once by the job (byoc.encoding.entry) and handed down (picklable: ranks are
    processes of their own)."""

    settings: EncodeSettings
    model_dir: Path
    shards: tuple[Shard, ...]  # this rank's
    state_dir: Path  # finished shards (the checkpoint folder's encode/)
    output_dir: Path
    rank: int
    threads: int | None = None  # the model's threads (cores / ranks on the CPU)
    device: str | None = None  # the GPU this rank runs on, as CUDA_VISIBLE_DEVICES names it


def done(shard: Shard, state_dir: Path) -> bool:
    """Whether `shard` was written whole before (a file under its name is whole: ShardWriter renames it there)."""
    path = state_dir / shard.name
    try:
        return path.is_file() and pq.ParquetFile(path).metadata.num_rows == shard.documents
    except Exception:  # (unreadable: encoded again)
        return False


def run(job: RankJob) -> int:
    """Encode the rank's shards not done yet; the documents encoded."""
    todo = [shard for shard in job.shards if not done(shard, job.state_dir)]
    for shard in job.shards:
        if shard not in todo:
            publish(job.state_dir / shard.name, job.output_dir)
    if len(todo) < len(job.shards):
        logger.info(
            "rank %d: %d of its %d shard(s) finished before: skipped",
            job.rank,
            len(job.shards) - len(todo),
            len(job.shards),
        )
    if not todo:
        return 0
    check_stop("before the model loaded")
    model, parameters = load(job)
    progress = Progress(job.rank, sum(shard.documents for shard in todo))
    for shard, documents in shard_documents(todo, job.settings.shard_size):
        encode_shard(shard, documents, model, parameters, job, progress)
        publish(job.state_dir / shard.name, job.output_dir)
    progress.log(final=True)
    return progress.done


def load(job: RankJob) -> tuple[Any, dict[str, Any]]:
    """The model, loaded as byoc serve loads it, and the request parameters every batch is encoded with."""
    if job.device is not None:  # (before torch is imported, on loading: the rank sees its own GPU only)
        os.environ["CUDA_VISIBLE_DEVICES"] = job.device
    inference = replace(
        InferenceSettings.from_env(),
        backend=job.settings.backend,
        precision=job.settings.precision,
        threads=job.threads,
        cpu_while_loading=False,  # (the job waits for its own backend: nothing answers in between)
        max_length=job.settings.max_length,
    )
    with default_pipeline.serving_with(inference):
        model = default_pipeline.model_fn(str(job.model_dir))
    model.max_answer_values = None  # (a request's limit: a corpus has none)
    task = tasks.TASKS[model["task"]]
    parameters = _parameters(job.settings, task, job.model_dir)
    kind = task.head.kind_of(parameters)
    if kind not in columns.ENCODED and kind != Kind.OUTPUTS:
        raise EncodeError(
            f"the model in {job.model_dir.name} is {task.described}, which answers {kind.described}: byoc encode "
            "writes vectors, sparse terms or token vectors; give it an embedding, sparse, multi-vector or hybrid "
            "(bge-m3) model folder"
        )
    where = f"{model['backend']} on {model['device']}, {model['precision']}"
    logger.info("rank %d: encoding as %s with %s", job.rank, task.described, where)
    return model, parameters


def _parameters(settings: EncodeSettings, task: Any, model_dir: Path) -> dict[str, Any]:
    """The request parameters the settings ask for; one the model's task does not take is refused now. Vectors
    are unit length as sentence-transformers' encode gives them (where the folder ends in Normalize), unless the
    settings say."""
    asked = {
        "prompt_name": settings.prompt_name,
        "dimensions": settings.dimensions,
        "output": settings.outputs(),
        "normalize": settings.normalize,
    }
    parameters = {name: value for name, value in asked.items() if value is not None}
    for name in parameters:
        if name not in task.head.parameters:
            raise EncodeError(
                f"hyperparameter {name} does not apply to {task.described} "
                f"(of byoc encode's, it takes {', '.join(n for n in asked if n in task.head.parameters) or 'none'})"
            )
    if "normalize" in task.head.parameters and settings.normalize is None:
        as_folder = {**parameters, "normalize": "Normalize" in sentence_folder.module_kinds(model_dir)}
        try:
            task.head.check_values(as_folder)
            parameters = as_folder
        except tasks.BadParameter:  # (a model whose vectors are always unit length: as it gives them)
            pass
    return parameters


def encode_shard(
    shard: Shard,
    documents: Iterator[tuple[str, str]],
    model: Any,
    parameters: dict[str, Any],
    job: RankJob,
    progress: Progress,
) -> None:
    """Encode one shard batch by batch, each batch written as a row group as it comes (memory holds a batch)."""
    writer = columns.ShardWriter(job.state_dir / shard.name, {"byoc": facts(model, job.settings)})
    written = 0
    try:
        while True:
            check_stop(f"in shard {shard.name}")
            batch = list(itertools.islice(documents, job.settings.batch_size))
            if not batch:
                break
            request = {"inputs": [text for _, text in batch], "parameters": parameters}
            try:
                answers = default_pipeline.predict_fn(request, model)
            except InputError as err:
                raise EncodeError(f"the model refused the job's settings: {err}") from None
            kinds = kinds_of(answers, parameters, model)
            if Kind.SPARSE_TERMS in kinds.values() and "vocabulary" not in writer.metadata:
                writer.metadata["vocabulary"] = vocabulary(model)
            writer.write(columns.table([doc_id for doc_id, _ in batch], answers, kinds, job.settings.dtype))
            progress.advance(len(batch))
            written += len(batch)
        if written < shard.documents:  # (a short shard is never kept: a restart would take it as whole)
            raise changed(shard)
        writer.close()
    finally:
        writer.abort()


def kinds_of(answers: Any, parameters: dict[str, Any], model: Any) -> dict[str | None, Kind]:
    """Each output's kind, by name (one output: named None)."""
    task = tasks.TASKS[model["task"]]
    kind = getattr(answers, "kind", None) or task.head.kind_of(parameters)
    if kind != Kind.OUTPUTS:
        return {None: kind}
    return {name: task.head.kind_of({"output": name}) for name in (answers[0] if answers else {})}


def facts(model: Any, settings: EncodeSettings) -> dict[str, Any]:
    """How a shard was made, in its metadata (the manifest reads it back)."""
    asked = {"prompt_name": settings.prompt_name, "dimensions": settings.dimensions, "max_length": settings.max_length}
    return {
        "task": model["task"],
        "backend": model["backend"],
        "device": model["device"],
        "precision": model["precision"],
        **{name: value for name, value in asked.items() if value is not None},
    }


def vocabulary(model: Any) -> list[str]:
    """The tokenizer's tokens by index (a sparse term's `indices` name them)."""
    by_id = {index: token for token, index in model["tokenizer"].get_vocab().items()}
    return [by_id.get(index, "") for index in range(max(by_id) + 1)] if by_id else []


def publish(path: Path, output_dir: Path) -> None:
    """The finished shard in the output folder too: a hard link where both are on one file system, else a copy;
    made beside its name and renamed there, so that the output holds this shard whole, never an earlier run's
    file of the same name or a copy cut short."""
    output_dir.mkdir(parents=True, exist_ok=True)
    target = output_dir / path.name
    if target.exists() and os.path.samefile(path, target):
        return
    partial = output_dir / f".{path.name}.partial"
    partial.unlink(missing_ok=True)
    try:
        os.link(path, partial)
    except OSError:
        shutil.copyfile(path, partial)
    os.replace(partial, target)


def shard_documents(shards: list[Shard], shard_size: int) -> Iterator[tuple[Shard, Iterator[tuple[str, str]]]]:
    """Each shard with its documents as a stream, read from the file as they are encoded (memory holds a batch,
    never a shard). A file is read once, from its start: its shards are consecutive runs of `shard_size`
    documents; those of other ranks, or finished before, are read past and never held. A shard's documents must
    be read before the next shard is asked for (what is left of them is read past then)."""
    by_file: dict[Path, dict[int, Shard]] = {}
    for shard in shards:
        by_file.setdefault(shard.file.path, {})[shard.index] = shard
    for wanted in by_file.values():
        file: CorpusFile = next(iter(wanted.values())).file
        stream = corpus.documents(file.path, file.fields)
        position = 0
        for index in sorted(wanted):
            shard, start = wanted[index], index * shard_size
            if _read_past(stream, start - position) < start - position:
                raise changed(shard)
            documents = itertools.islice(stream, shard.documents)
            yield shard, documents
            _read_past(documents, shard.documents)  # (what the caller left: nothing, unless it stopped)
            position = start + shard.documents


def _read_past(documents: Iterator[Any], count: int) -> int:
    """Read up to `count` documents without holding them; how many there were."""
    return sum(1 for _ in itertools.islice(documents, max(count, 0)))


def changed(shard: Shard) -> EncodeError:
    """A file that ended before a shard the job planned from it did: it changed since the job counted it."""
    return EncodeError(
        f"{shard.file.source} ended before the end of its shard {shard.name} ({shard.file.documents} document(s) "
        "when the job read it first): the file changed while the job ran; run the job again on a corpus that does "
        "not change while it is encoded"
    )


class Progress:
    """Documents encoded, their rate and the time left, logged every PROGRESS_EVERY_S seconds and at the end
    (`documents_per_second=`: what the metric definitions read, byoc.encoding.METRIC_DEFINITIONS)."""

    def __init__(self, rank: int, total: int) -> None:
        self.rank, self.total, self.done = rank, total, 0
        self.started = self.logged = time.monotonic()

    def advance(self, documents: int) -> None:
        self.done += documents
        if time.monotonic() - self.logged >= PROGRESS_EVERY_S:
            self.log()

    def log(self, final: bool = False) -> None:
        self.logged = time.monotonic()
        elapsed = max(self.logged - self.started, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate else float("inf")
        logger.info(
            "rank %d: %s %d of %d documents; documents_per_second=%.1f; eta_seconds=%.0f",
            self.rank,
            "encoded" if final else "encoding:",
            self.done,
            self.total,
            rate,
            left,
        )
