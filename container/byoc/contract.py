"""A typed view of the SageMaker training contract: the `/opt/ml` tree and its config files.

SageMaker writes `input/config/{hyperparameters,inputdataconfig,resourceconfig,checkpointconfig}.json`
under `/opt/ml` (relocated by `SAGEMAKER_BASE_DIR`, as the sagemaker-training toolkit does),
mounts each channel at `input/data/<channel>`, and collects `model/` and `output/`.
This module reads all of that once, at call time (the toolkit freezes its paths at import time,
which breaks tests and relocated roots).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from byoc.environment import Environment
from byoc.errors import UserError
from byoc.logs import mask_text, remember_secrets

logger = logging.getLogger(__name__)

DEFAULT_BASE_DIR = "/opt/ml"
INPUT_MODES = ("File", "FastFile", "Pipe")


class ContractError(UserError, ValueError):
    """The job's configuration files are missing or malformed. The message says how to fix it."""


@dataclass(frozen=True)
class Paths:
    """Every location of the contract, derived from one base directory (`from_env`: the one the
    environment names, with the toolkit's SM_MODEL_DIR and SM_OUTPUT_DATA_DIR where they are set)."""

    base: Path
    model_dir_override: Path | None = None  # SM_MODEL_DIR
    output_data_dir_override: Path | None = None  # SM_OUTPUT_DATA_DIR

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, base: Path | None = None) -> Paths:
        """`base` (default: `base_dir(env)`) and the variables that move its folders."""
        read = Environment(env, error=ContractError)
        return cls(
            base or base_dir(env),
            model_dir_override=read.path("SM_MODEL_DIR"),
            output_data_dir_override=read.path("SM_OUTPUT_DATA_DIR"),
        )

    @property
    def config_dir(self) -> Path:
        return self.base / "input" / "config"

    @property
    def data_dir(self) -> Path:
        return self.base / "input" / "data"

    @property
    def model_dir(self) -> Path:
        return self.model_dir_override or self.base / "model"

    @property
    def output_dir(self) -> Path:
        return self.base / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_data_dir_override or self.output_dir / "data"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / "tensorboard"


@dataclass(frozen=True)
class Channel:
    """One input channel as `inputdataconfig.json` describes it."""

    name: str
    path: Path
    input_mode: str = "File"
    distribution: str = "FullyReplicated"
    content_type: str | None = None


@dataclass
class TrainingContract:
    """What a training container learns from SageMaker at start."""

    paths: Paths
    hyperparameters: dict[str, Any]  # raw values as found in hyperparameters.json
    channels: dict[str, Channel]
    current_host: str = "algo-1"
    hosts: list[str] = field(default_factory=lambda: ["algo-1"])
    network_interface_name: str = "eth0"
    instance_type: str = "local"
    checkpoint_dir: Path | None = None
    checkpoint_s3_uri: str | None = None
    job_name: str = "local"

    @property
    def channel_dirs(self) -> dict[str, Path]:
        return {name: ch.path for name, ch in self.channels.items()}

    @property
    def checkpoint_folder(self) -> Path:
        """Where checkpoints (and the XLA compile cache) go: checkpointconfig.json's LocalPath, else
        /opt/ml/checkpoints."""
        return self.checkpoint_dir or self.paths.base / "checkpoints"


def base_dir(env: Mapping[str, str] | None = None) -> Path:
    """The root of the contract: `$SAGEMAKER_BASE_DIR`, else `/opt/ml` (also when it is empty)."""
    return Environment(env).path("SAGEMAKER_BASE_DIR") or Path(DEFAULT_BASE_DIR)


def read_training_contract(root: Path | None = None, env: Mapping[str, str] | None = None) -> TrainingContract:
    """Read the config files under `root` (default: `base_dir(env)`) into a `TrainingContract`;
    `env`: the variables (default: this process's)."""
    paths = Paths.from_env(env, base=root)
    if not paths.config_dir.is_dir():
        raise ContractError(
            f"{paths.config_dir} does not exist: run inside a SageMaker training job, mount a prepared "
            "tree at /opt/ml, or point SAGEMAKER_BASE_DIR at one (it needs input/config/hyperparameters.json)"
        )
    hyperparameters = _read_object(paths.config_dir / "hyperparameters.json", "name -> value", default={})
    remember_secrets(hyperparameters)  # masked from here on in this process's log lines and failure text
    channels = _read_channels(paths)
    resources = _read_object(paths.config_dir / "resourceconfig.json", "settings (hosts, current_host...)")
    if resources is None:
        logger.warning("no resourceconfig.json: assuming a single host 'algo-1'")
        resources = {}
    hosts = _hosts(resources)
    current = resources.get("current_host", hosts[0])
    if current not in hosts:
        raise ContractError(f"resourceconfig.json: current_host {current!r} is not in hosts {hosts}")
    checkpoint_dir, checkpoint_s3 = _read_checkpoint_config(paths)
    return TrainingContract(
        paths=paths,
        hyperparameters=hyperparameters,
        channels=channels,
        current_host=current,
        hosts=sorted(hosts),
        network_interface_name=resources.get("network_interface_name", "eth0"),
        instance_type=resources.get("current_instance_type", "local"),
        checkpoint_dir=checkpoint_dir,
        checkpoint_s3_uri=checkpoint_s3,
        job_name=Environment(env).text("TRAINING_JOB_NAME") or "local",
    )


def _read_json(path: Path, default: Any) -> Any:
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ContractError(f"{path.name} is not valid JSON ({err}); fix or regenerate it") from None


def _read_object(path: Path, holding: str, default: Any = None) -> Any:
    """A config file that must hold a JSON object (valid JSON of another kind fails naming the file)."""
    if not path.exists():
        return default
    value = _read_json(path, default)
    if not isinstance(value, dict):
        raise ContractError(
            f"{path.name} must hold a JSON object of {holding}, but it holds a JSON {_json_kind(value)} "
            f"({path}): fix or regenerate it"
        )
    return value


def _json_kind(value: Any) -> str:
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _hosts(resources: dict[str, Any]) -> list[str]:
    hosts = resources.get("hosts") or [resources.get("current_host", "algo-1")]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ContractError(f"resourceconfig.json: hosts must be a list of host names, got {hosts!r}")
    return list(hosts)


def _read_channels(paths: Paths) -> dict[str, Channel]:
    """Channels from inputdataconfig.json; without it, every folder under input/data (local runs)."""
    config = _read_object(paths.config_dir / "inputdataconfig.json", "channel -> settings")
    if config is None:
        found = sorted(p for p in paths.data_dir.iterdir() if p.is_dir()) if paths.data_dir.is_dir() else []
        return {p.name: Channel(p.name, p) for p in found}
    channels = {}
    for name, spec in config.items():
        spec = spec or {}
        if not isinstance(spec, dict):
            raise ContractError(
                f"inputdataconfig.json: channel {name!r} must map to a JSON object of settings "
                f"(TrainingInputMode, S3DistributionType...), got a JSON {_json_kind(spec)}: fix or regenerate it"
            )
        mode = spec.get("TrainingInputMode", "File")
        if mode not in INPUT_MODES:
            raise ContractError(f"channel {name!r}: unknown TrainingInputMode {mode!r} (expected File or FastFile)")
        if mode == "Pipe":
            raise ContractError(
                f"channel {name!r} uses Pipe input mode, which this image does not read: "
                "use input_mode='File' (or 'FastFile') for the channel in your TrainingInput"
            )
        channels[name] = Channel(
            name=name,
            path=paths.data_dir / name,
            input_mode=mode,
            distribution=spec.get("S3DistributionType", "FullyReplicated"),
            content_type=spec.get("ContentType"),
        )
    return channels


def _read_checkpoint_config(paths: Paths) -> tuple[Path | None, str | None]:
    config = _read_object(paths.config_dir / "checkpointconfig.json", "settings (LocalPath, S3Uri)")
    if config:
        if not isinstance(config.get("LocalPath") or "", str):
            raise ContractError(f"checkpointconfig.json: LocalPath must be a folder path, got {config['LocalPath']!r}")
        local = Path(config.get("LocalPath") or "/opt/ml/checkpoints")
        if paths.base != Path(DEFAULT_BASE_DIR) and local.is_relative_to(DEFAULT_BASE_DIR):
            local = paths.base / local.relative_to(DEFAULT_BASE_DIR)  # relocated root
        return local, config.get("S3Uri")
    # Without checkpointconfig.json SageMaker still syncs /opt/ml/checkpoints when configured
    # through the SDK; a relocated root keeps its checkpoints beside its other folders.
    return paths.base / "checkpoints", None


FAILURE_LIMIT = 1024  # bytes: what SageMaker keeps of output/failure as the FailureReason


def write_failure(paths: Paths, message: str) -> None:
    """Write `output/failure`: the message on one line, cut to FAILURE_LIMIT bytes of UTF-8
    (newline included; "..." marks a cut). Every failure of every entry point comes through here.

    Like the toolkit, an existing failure file is kept: the first, most specific reason wins.
    """
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    if paths.failure_file.exists() and paths.failure_file.stat().st_size > 0:
        return
    text = mask_text(" ".join(message.split()))  # no secret of the job's in what the console shows
    paths.failure_file.write_bytes(cut_to_bytes(text, FAILURE_LIMIT - 1) + b"\n")


def cut_to_bytes(text: str, limit: int) -> bytes:
    """`text` as UTF-8 of at most `limit` bytes, ending in "..." when cut, never inside a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return data
    return data[: limit - 3].decode("utf-8", errors="ignore").encode("utf-8") + b"..."
