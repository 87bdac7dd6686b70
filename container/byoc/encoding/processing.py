"""`byoc encode` as a SageMaker Processing job: /opt/ml/config/processingjobconfig.json and resourceconfig.json
read into the contract a training job gives (byoc.contract.TrainingContract), so the job runs the same way.

A processing job has inputs and outputs instead of channels and a model folder: each `ProcessingInput` is a
channel named by its `InputName` (`corpus`, `model`) at its `LocalPath` (under /opt/ml/processing/), with its
S3DataDistributionType; the shards go to the one `ProcessingOutput`'s `LocalPath` (where there are several,
the one named `shards`). It has no hyperparameters: settings are the container's arguments
(`ContainerArguments`: `--batch_size 64 --prompt_name document`). Its failure text goes to /opt/ml/output/message
too, which SageMaker shows as the job's ExitMessage. Its checkpoints are not synced: a processing job stopped
starts over (a training job resumes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from byoc.contract import DEFAULT_BASE_DIR, Channel, Paths, TrainingContract, cut_to_bytes
from byoc.encoding.settings import EncodeError
from byoc.logs import mask_text

CONFIG = Path("config") / "processingjobconfig.json"
RESOURCES = Path("config") / "resourceconfig.json"
MESSAGE_LIMIT = 1024  # bytes of output/message SageMaker keeps as the ExitMessage
OUTPUT_NAME = "shards"


def is_processing(base: Path) -> bool:
    """Whether `base` (/opt/ml) is a processing job's: its config, and no training job's input/config."""
    return (base / CONFIG).is_file() and not (base / "input" / "config").is_dir()


def read_contract(base: Path) -> tuple[TrainingContract, Path | None]:
    """The job's contract (its inputs as channels, its hosts) and the folder its output is uploaded from."""
    config = _read(base / CONFIG, "the processing job's settings")
    channels = {}
    for item in config.get("ProcessingInputs") or []:
        source = item.get("S3Input") or item.get("DatasetDefinition") or {}
        local = source.get("LocalPath")
        if not item.get("InputName") or not local:
            continue
        channels[item["InputName"]] = _channel(item["InputName"], _relocated(base, local), source)
    outputs = [o for o in (config.get("ProcessingOutputConfig") or {}).get("Outputs") or [] if o.get("S3Output")]
    chosen = next((o for o in outputs if o.get("OutputName") == OUTPUT_NAME), outputs[0] if len(outputs) == 1 else None)
    if outputs and chosen is None:
        names = ", ".join(str(o.get("OutputName")) for o in outputs)
        raise EncodeError(f"the processing job has several outputs ({names}): name the shards' one `{OUTPUT_NAME}`")
    resources = _read(base / RESOURCES, "the hosts") if (base / RESOURCES).is_file() else {}
    hosts = sorted(resources.get("hosts") or [resources.get("current_host", "algo-1")])
    contract = TrainingContract(
        paths=Paths(base),
        hyperparameters={},
        channels=channels,
        current_host=resources.get("current_host", hosts[0]),
        hosts=hosts,
        job_name=str(config.get("ProcessingJobName") or "local"),
    )
    return contract, _relocated(base, chosen["S3Output"]["LocalPath"]) if chosen else None


def write_message(paths: Paths, message: str) -> None:
    """/opt/ml/output/message: the failure as the processing job's ExitMessage (its first 1 KB, UTF-8)."""
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    text = mask_text(" ".join(message.split()))
    (paths.output_dir / "message").write_bytes(cut_to_bytes(text, MESSAGE_LIMIT - 1) + b"\n")


def _channel(name: str, path: Path, source: dict[str, Any]) -> Channel:
    return Channel(
        name, path, source.get("S3InputMode", "File"), source.get("S3DataDistributionType", "FullyReplicated")
    )


def _relocated(base: Path, local: str) -> Path:
    """A path under /opt/ml, under `base` where the tree was moved (SAGEMAKER_BASE_DIR: tests, local runs)."""
    path = Path(local)
    if base != Path(DEFAULT_BASE_DIR) and path.is_relative_to(DEFAULT_BASE_DIR):
        return base / path.relative_to(DEFAULT_BASE_DIR)
    return path


def _read(path: Path, holding: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EncodeError(f"cannot read {path} ({holding}): {err}") from None
    if not isinstance(value, dict):
        raise EncodeError(f"{path} must hold a JSON object ({holding})")
    return value
