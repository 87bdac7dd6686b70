"""`byoc encode`: encode a corpus into Parquet shards, as a SageMaker training job (or `docker run` with a
mounted /opt/ml): the contract's hyperparameters, `corpus` and `model` channels, hosts and checkpoint folder.

The job reads the corpus once to check it (ids present and unique) and count it, cuts it into shards
(byoc.encoding.shards), deals them among its ranks, runs the ranks (this process alone, or one process per GPU
or per `processes_per_host`), then writes the manifest of this host's shards. Every failure reaches
output/failure; a SIGTERM stops the ranks between batches, keeps what is finished, and exits 143: run the job
again with the same checkpoint location and it goes on from there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from byoc import __version__
from byoc.contract import Paths, TrainingContract, read_training_contract, write_failure
from byoc.encoding import columns, encoder, processing, ranks, shards
from byoc.encoding.encoder import RankJob
from byoc.encoding.settings import EncodeError, EncodeSettings
from byoc.environment import Environment
from byoc.errors import EXIT_FAILURE, EXIT_STOPPED, describe
from byoc.model_folder import locate

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SHARDS = "shards"  # the output's subfolder of Parquet files: pyarrow, pandas and DuckDB read it whole
CACHE_DIR_ENV = (
    "BYOC_CACHE_DIR"  # where a model.tar.gz is unpacked (the variable training reads too), never the checkpoints
)
STATE = "encode"  # the checkpoint folder's subfolder holding finished shards and the job's fingerprint


def encode(root: Path | None = None, arguments: list[str] | None = None) -> int:
    """Run the encode job /opt/ml (or $SAGEMAKER_BASE_DIR, or `root`) describes, a training job's or a processing
    job's; `arguments`: settings given on the command line (a processing job's ContainerArguments), over the
    hyperparameters. The exit code."""
    paths = Paths.from_env(base=root)
    processing_job = processing.is_processing(paths.base)
    paths.failure_file.unlink(missing_ok=True)  # (an earlier attempt's, run again in the same tree: not this one's)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if processing_job:
            contract, output = processing.read_contract(paths.base)
        else:
            contract, output = read_training_contract(root), None
        given = arguments_of(arguments or [])
        settings = EncodeSettings.from_hyperparameters({**contract.hyperparameters, **given})
        if output is not None and settings.output_dir is None:
            settings = replace(settings, output_dir=str(output))
        return _run(contract, settings)
    except (Exception, encoder.Stopped) as err:
        stopped = isinstance(err, encoder.Stopped)
        message = (
            "stopped by SIGTERM: the shards finished so far are kept in the checkpoint folder; run the job again "
            "with the same checkpoint location (checkpoint_s3_uri) and it encodes only what is left"
            if stopped
            else describe(err)
        )
        if not stopped and not isinstance(err, EncodeError):
            logger.exception("encode failed")
        logger.error("encode failed: %s", message)
        write_failure(paths, message)
        if processing_job:
            processing.write_message(paths, message)
        return EXIT_STOPPED if stopped else EXIT_FAILURE
    finally:
        signal.signal(signal.SIGTERM, previous)
        encoder.stop_requested.clear()
        ranks.job_stop.clear()


def arguments_of(words: list[str]) -> dict[str, str]:
    """`--name value`, `--name=value` or `name=value` pairs from the command line, as hyperparameters."""
    out: dict[str, str] = {}
    words = list(words)
    while words:
        word = words.pop(0)
        name, equals, value = word.lstrip("-").partition("=")
        if not equals:
            if not word.startswith("--") or not words:
                raise EncodeError(
                    f"byoc encode: {word!r} is not a setting: give --name value, --name=value or name=value"
                )
            value = words.pop(0)
        out[name.replace("-", "_")] = value
    return out


def _on_sigterm(signum: int, frame: Any) -> None:
    logger.warning("SIGTERM: stopping after the batch at hand")
    ranks.stop()


def _run(contract: TrainingContract, settings: EncodeSettings) -> int:
    started = time.monotonic()
    channel = contract.channels.get("corpus")
    if channel is None:
        raise EncodeError(
            f"no `corpus` channel (channels: {', '.join(contract.channels) or 'none'}): give the job the corpus "
            "as an input channel named corpus (JSON Lines, CSV or Parquet)"
        )
    if "model" not in contract.channels:
        raise EncodeError(
            "no `model` channel: give the job the model folder (or model.tar.gz) as a channel named model"
        )
    state = contract.checkpoint_folder / STATE
    cache = Environment().path(CACHE_DIR_ENV) or Path(tempfile.gettempdir()) / "byoc-cache"  # (as training's)
    model_dir = locate(contract.channels["model"].path, cache)
    sharded = channel.distribution == "ShardedByS3Key"
    several = len(contract.hosts) > 1
    between = lambda: encoder.check_stop("while the corpus was read")  # noqa: E731
    files = shards.read_corpus(channel.path, settings, may_be_empty=sharded and several, between=between)
    every = shards.plan(files, settings.shard_size)
    gpus = ranks.gpu_ids()
    per_host = settings.processes_per_host or max(1, len(gpus))
    if several and not sharded and not settings.processes_per_host:
        logger.warning(
            "%d ranks on this host, one a GPU: every host must have as many (set processes_per_host where the "
            "hosts differ, or documents are missed or encoded twice)",
            per_host,
        )
    placed = shards.Ranks.of(per_host, contract.hosts, contract.current_host, sharded)
    out = Path(settings.output_dir) if settings.output_dir else contract.paths.model_dir
    _check_state(state / f"job-{contract.current_host}.json", settings, model_dir, files)
    documents = sum(f.documents for f in files)
    logger.info(
        "byoc %s encode: %d document(s) in %d file(s), %d shard(s) of up to %d; ranks %d-%d of %d (%s channel)",
        __version__,
        documents,
        len(files),
        len(every),
        settings.shard_size,
        placed.first,
        placed.first + per_host - 1,
        placed.world,
        channel.distribution,
    )
    cores = os.cpu_count() or 1
    jobs = [
        RankJob(
            settings,
            model_dir,
            tuple(shards.owned(every, placed.first + local, placed.world)),
            state,
            out / SHARDS,
            placed.first + local,
            threads=max(1, cores // per_host) if per_host > 1 else None,
            device=gpus[local % len(gpus)] if gpus else None,  # (more ranks than GPUs: they share)
        )
        for local in range(per_host)
    ]
    mine = [shard for job in jobs for shard in job.shards]
    _remove_others(out / SHARDS, {shard.name for shard in mine})
    if per_host == 1:
        encoder.run(jobs[0])
    else:
        ranks.run(jobs)
    manifest = write_manifest(out, mine, settings, model_dir, contract)
    logger.info(
        "encoded %d document(s) into %d shard(s) in %s in %.1f s",
        manifest["documents"],
        len(mine),
        out,
        time.monotonic() - started,
    )
    return 0


def _remove_others(folder: Path, names: set[str]) -> None:
    """Shard files in the output that this job does not write (an earlier run's, in the same tree) go: the
    output holds this job's shards alone."""
    for path in folder.glob("*.parquet") if folder.is_dir() else []:
        if path.name not in names:
            logger.info("removing %s from the output: this job writes no shard of that name", path.name)
            path.unlink()


def _check_state(path: Path, settings: EncodeSettings, model_dir: Path, files: list[shards.CorpusFile]) -> None:
    """The checkpoint folder holds shards of this very job, or none: a job whose model, settings or corpus changed
    must not mix its vectors with an earlier one's. `path`: this host's record of the job (every host syncs the
    same checkpoint location)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ignored = ("processes_per_host", "output_dir", "batch_size")  # (how the work is cut, not what it gives)
    kept = {name: value for name, value in asdict(settings).items() if name not in ignored}
    corpus = [[f.source, f.path.stat().st_size, f.documents, f.digest] for f in files]
    fingerprint = {"settings": kept, "model": _model_fingerprint(model_dir), "corpus": corpus}
    if path.exists():
        try:
            before = json.loads(path.read_text())
        except ValueError:
            before = {"settings": {}}  # (unreadable: another job's, for all this one knows)
        if before != fingerprint and any(path.parent.glob("*.parquet")):
            changed = sorted(k for k in set(before["settings"]) | set(kept) if before["settings"].get(k) != kept.get(k))
            what = (
                f"settings changed ({', '.join(changed)})"
                if changed
                else "the model changed"
                if before.get("model") != fingerprint["model"]
                else "the corpus changed"
                if before.get("corpus")
                else "its record is unreadable"
            )
            raise EncodeError(
                f"the checkpoint folder {path.parent} holds shards of another encode job ({what}): give this job a new "
                "checkpoint location (checkpoint_s3_uri), or empty it to encode everything again"
            )
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(fingerprint, indent=1, sort_keys=True))
    os.replace(partial, path)


def _model_fingerprint(model_dir: Path) -> str:
    """The model's files by name and size, and its config.json's text: what a restart sees the same."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(model_dir).as_posix()}:{path.stat().st_size}\n".encode())
    config = model_dir / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return digest.hexdigest()[:16]


def write_manifest(
    out: Path, mine: list[shards.Shard], settings: EncodeSettings, model_dir: Path, contract: TrainingContract
) -> dict[str, Any]:
    """manifest.json (manifest-HOST.json where several hosts each write their own): the model, the settings,
    and each shard's file, documents and sha256, with the columns' widths."""
    entries, made, widths = [], {}, {}
    for shard in sorted(mine, key=lambda s: s.name):
        path = out / SHARDS / shard.name
        facts = columns.read_metadata(path)
        widths = facts.pop("widths")
        made = {k: v for k, v in facts.items() if k != "rows"}
        entries.append(
            {
                "file": f"{SHARDS}/{shard.name}",
                "source": shard.file.source,
                "documents": facts["rows"],
                "sha256": _sha256(path),
            }
        )
    manifest = {
        "format": "byoc-encode/1",
        "byoc": __version__,
        "model": {"folder": model_dir.name, **made},
        "settings": {k: v for k, v in asdict(settings).items() if k != "output_dir"},
        "dimensions": widths,
        "documents": sum(e["documents"] for e in entries),
        "shards": entries,
        "host": contract.current_host,
        "hosts": contract.hosts,
    }
    name = MANIFEST if len(contract.hosts) == 1 else f"manifest-{contract.current_host}.json"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(manifest, indent=1))
    return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
