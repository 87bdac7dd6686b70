"""The training job's settings: what one process of the job (a launched rank, or the single process)
reads from the environment, once, as it starts, and passes down.

`byoc.training.entry.run_job` reads them (`TrainingSettings.from_env`) and passes them to the job's
`main(contract, args, settings)`, which passes them to its steps (`prepare`). An older `code/train.py`
whose `main` takes two parameters still works: `prepare` then reads them itself. The rank's own part
(its numbers, the process group) is `byoc.launch.settings.RankSettings`, which the launcher's side
shares. Every variable is in docs/settings.md; a bad value stops the job naming it (byoc.environment).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from byoc.environment import Environment
from byoc.launch.settings import RankSettings, neuron_cores
from byoc.logs import log_level

CACHE_DIR_ENV = "BYOC_CACHE_DIR"
CODE_DIR_ENV = "BYOC_CODE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # torch.compile's cache (byoc.training.compiled_steps)
TRACKING_TIMEOUT_ENV = "BYOC_TRACKING_TIMEOUT"  # seconds one MLflow call may take (byoc.training.tracking)
# Cast the weights and optimizer state to bf16 too (torch-xla's): byoc warns, since small updates get lost.
BF16_CAST_VARIABLES = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")


@dataclass(frozen=True)
class XlaSettings:
    """What the XLA path (byoc.training.xla) finds set for torch-xla and the Neuron compiler."""

    pjrt_device: str | None = None  # PJRT_DEVICE; None: NEURON where NeuronCores are visible, else CPU
    neuron_cores: int | None = None  # NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES; None: count the devices
    neuron_cc_flags: str = ""  # NEURON_CC_FLAGS
    neuron_compile_cache: str | None = None  # NEURON_COMPILE_CACHE_URL (a folder or an s3:// URL)
    bf16_casts: tuple[str, ...] = ()  # those of BF16_CAST_VARIABLES set on

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> XlaSettings:
        read = Environment(env)
        return cls(
            pjrt_device=read.text("PJRT_DEVICE"),
            neuron_cores=neuron_cores(read),
            neuron_cc_flags=read.text("NEURON_CC_FLAGS") or "",
            neuron_compile_cache=read.text("NEURON_COMPILE_CACHE_URL"),
            bf16_casts=tuple(name for name in BF16_CAST_VARIABLES if read.flag(name)),
        )


@dataclass(frozen=True)
class TrackingSettings:
    """Where the job reports its run (byoc.training.tracking): MLflow, where MLFLOW_TRACKING_URI is set."""

    mlflow_uri: str | None = None  # MLFLOW_TRACKING_URI: a URL, or a SageMaker managed MLflow ARN
    experiment: str = "byoc"  # MLFLOW_EXPERIMENT_NAME
    image: str | None = None  # BYOC_IMAGE: the image's URI, which build_and_push.sh builds into it (a tag)
    timeout: float = 10.0  # BYOC_TRACKING_TIMEOUT: seconds one call may take before tracking turns off

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrackingSettings:
        read = Environment(env)
        return cls(
            mlflow_uri=read.text("MLFLOW_TRACKING_URI"),
            experiment=read.text("MLFLOW_EXPERIMENT_NAME") or cls.experiment,
            image=read.text("BYOC_IMAGE"),
            timeout=read.number(TRACKING_TIMEOUT_ENV, cls.timeout, positive=True),
        )


@dataclass(frozen=True)
class TrainingSettings:
    """One process of the training job: its rank, its scratch and code folders, its compile caches."""

    rank: RankSettings = RankSettings()
    cache_dir: Path = Path(tempfile.gettempdir()) / "byoc-cache"  # tokenized data, unpacked models
    code_dir: Path | None = None  # the inference code for model/code; None: the image's or the checkout's
    compile_cache: str | None = None  # TORCHINDUCTOR_CACHE_DIR as the user set it; None: with the checkpoints
    xla: XlaSettings = field(default_factory=XlaSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    log_level: str = "INFO"  # BYOC_LOG_LEVEL (byoc.logs sets it up; read here to stop on a bad value)
    # The MLflow run this process reports to (byoc.training.tracking.start, in the entry), not from the
    # environment: handed down with the settings to the Trainer's logging callback. None: not tracked.
    run: Any = None
    # Whether the job runs on XLA, as the entry decided it before transformers loaded; None: not decided
    # yet (a `main` of an older code/train.py gets no settings, and `prepare` decides).
    use_xla: bool | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrainingSettings:
        read = Environment(env)
        return cls(
            rank=RankSettings.from_env(env),
            cache_dir=read.path(CACHE_DIR_ENV) or cls.cache_dir,
            code_dir=read.path(CODE_DIR_ENV),
            compile_cache=read.text(INDUCTOR_CACHE_ENV),
            xla=XlaSettings.from_env(env),
            tracking=TrackingSettings.from_env(env),
            log_level=log_level(read),
        )
