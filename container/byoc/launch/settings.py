"""The launch's settings, read from the environment once, at start, and passed down.

`LaunchSettings`: what `byoc train` reads on a host before it starts the ranks (byoc.launch.launcher).
`RankSettings`: what one rank reads of what the launcher (and torch's elastic agent under it) set for
it: its numbers, the process group's backend and timeout, where it reports a failure. The training
job (byoc.training.settings) holds one, and so does a script-mode rank (byoc.launch.script_rank).
Every variable is in docs/settings.md; a bad value stops the program naming it (byoc.environment).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from byoc.contract import ContractError
from byoc.environment import Environment, SettingError
from byoc.launch.devices import count_core_list
from byoc.launch.efa import EFA_VARIABLES
from byoc.logs import log_level

# Set by the launcher for its ranks.
PROCESS_GROUP_BACKEND_ENV = "BYOC_BACKEND"  # the ranks' process group: nccl (CUDA), xla (NeuronCores), gloo (CPU)
FAILURE_DIR_ENV = "BYOC_FAILURE_DIR"  # where each rank writes rank-N.json when it fails
HOST_ENV = "BYOC_HOST"  # the rank's host, for its failure record
PRECOMPILING_ENV = "BYOC_PRECOMPILING"  # set inside neuron_parallel_compile's run of the job
PROCESS_GROUP_BACKENDS = ("nccl", "gloo", "xla")
# The collectives' network, where the user set it: kept for the ranks instead of byoc's choice.
SOCKET_INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


class LaunchError(ContractError):
    """The processes cannot be started: the message says why and what to change."""


@dataclass(frozen=True)
class LaunchSettings:
    """`byoc train`'s settings on a host (docs/distributed.md)."""

    processes_per_host: int = 0  # 0: one per GPU or NeuronCore, else 1
    master_port: int = 0  # 0: 29500 with several hosts, a free port with one
    hosts_timeout: float = 300.0
    shutdown_timeout: int = 100
    neuron_cores: int | None = None  # what NEURON_RT_VISIBLE_CORES/NEURON_RT_NUM_CORES say; None: count the devices
    pjrt_device: str | None = None  # torch-xla's device, for messages
    precompiling: bool = False  # this run is neuron_parallel_compile's
    python_path: str | None = None  # PYTHONPATH: script mode puts the script's folder first
    network: dict[str, str] = field(default_factory=dict)  # the user's socket interfaces and libfabric variables
    log_level: str = "INFO"  # BYOC_LOG_LEVEL (byoc.logs sets it up; read here to stop on a bad value)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LaunchSettings:
        read = Environment(env, error=LaunchError)
        return cls(
            processes_per_host=read.integer("BYOC_PROCESSES_PER_HOST", 0, 0),
            master_port=read.integer("BYOC_MASTER_PORT", 0, 0, 65535),
            hosts_timeout=read.number("BYOC_HOSTS_TIMEOUT", 300.0, minimum=1),
            shutdown_timeout=int(read.number("BYOC_SHUTDOWN_TIMEOUT", 100.0, minimum=1)),
            neuron_cores=neuron_cores(read),
            pjrt_device=read.text("PJRT_DEVICE"),
            precompiling=read.flag(PRECOMPILING_ENV),
            python_path=read.text("PYTHONPATH"),
            log_level=log_level(read),
            network={
                name: value
                for name in (*SOCKET_INTERFACE_VARIABLES, *EFA_VARIABLES)
                if (value := read.text(name)) is not None
            },
        )


@dataclass(frozen=True)
class RankSettings:
    """One process's place in the job, as torch's elastic agent and byoc's launcher set it. A process
    started without them is a world of one (docs/distributed.md)."""

    rank: int = 0  # RANK
    world_size: int = 1  # WORLD_SIZE
    local_rank: int = 0  # LOCAL_RANK
    local_world_size: int = 1  # LOCAL_WORLD_SIZE
    node_rank: int = 0  # GROUP_RANK: the host's index
    backend: str | None = None  # BYOC_BACKEND; None: nccl where CUDA is, else gloo
    collective_timeout: float = 1800.0  # BYOC_COLLECTIVE_TIMEOUT, seconds
    failure_dir: Path | None = None  # BYOC_FAILURE_DIR: set for the ranks byoc's launcher starts
    host: str = "?"  # BYOC_HOST

    @property
    def launched(self) -> bool:
        """Whether byoc's launcher started this process (it then reports its failure to the launcher)."""
        return self.failure_dir is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankSettings:
        read = Environment(env)
        settings = cls(
            rank=read.integer("RANK", 0, 0),
            world_size=read.integer("WORLD_SIZE", 1, 1),
            local_rank=read.integer("LOCAL_RANK", 0, 0),
            local_world_size=read.integer("LOCAL_WORLD_SIZE", 1, 1),
            node_rank=read.integer("GROUP_RANK", 0, 0),
            backend=read.choice(PROCESS_GROUP_BACKEND_ENV, "", PROCESS_GROUP_BACKENDS) or None,
            # Long enough for rank 0 to tokenize a large dataset while the others wait at a barrier.
            collective_timeout=read.number("BYOC_COLLECTIVE_TIMEOUT", 1800.0, positive=True),
            failure_dir=read.path(FAILURE_DIR_ENV),
            host=read.text(HOST_ENV) or "?",
        )
        _check_under("RANK", settings.rank, "WORLD_SIZE", settings.world_size)
        _check_under("LOCAL_RANK", settings.local_rank, "LOCAL_WORLD_SIZE", settings.local_world_size)
        return settings


def _check_under(index_name: str, index: int, size_name: str, size: int) -> None:
    if index >= size:
        raise SettingError(
            f"{index_name}={index} is not under {size_name}={size}: torch's launcher sets both; "
            "unset them to run as one process"
        )


def neuron_cores(read: Environment) -> int | None:
    """The NeuronCores the Neuron runtime's variables give this container (None: they do not say)."""
    visible = read.parsed("NEURON_RT_VISIBLE_CORES", _core_count, "a list of cores such as 0-3,8")
    if visible is not None:
        return visible
    return read.integer("NEURON_RT_NUM_CORES", None, 0)


def _core_count(spec: str) -> int:
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not (high.isdigit() and int(high) >= int(low))):
            raise ValueError(spec)
    return count_core_list(spec)
