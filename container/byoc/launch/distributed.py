"""Inside one training process: its rank, the process group, and the few collectives byoc needs.

`byoc.launch.launcher` starts one process per device through torch's elastic launcher, which sets RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the host's index) and MASTER_ADDR/PORT.
A process started without them is a world of one, and every helper here is then a no-op.

Every training module asks here where its process stands. Like torch.distributed's process group,
which it joins, that is this module's state, given once as the rank starts: `setup(rank)`, with the
settings the job read at its entry point (`byoc.training.settings.TrainingSettings.rank`). This
module never reads the environment: until `setup`, a process is alone, a world of one (what
byoc's own pieces, a benchmark or a test, run outside a job, are); a script launched on several
ranks calls `setup` (`job.prepare` does) before it asks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from byoc import compat
from byoc.launch.settings import RankSettings

logger = logging.getLogger(__name__)


@dataclass
class _Place:
    """This process's place in the job: one per process, as torch.distributed's process group is."""

    rank: RankSettings = field(default_factory=RankSettings)  # as setup was given it; alone until then
    # byoc's own decisions (stop on SIGTERM? which shards?) travel over a CPU group. Under NCCL a
    # collective on a CUDA tensor followed by .item() waits for the GPU, and the stop check runs after
    # every step: the host would wait for the GPU once a step, and could never queue work ahead.
    control_group: Any = None


_place = _Place()


def settings() -> RankSettings:
    """This process's rank settings, as `setup` was given them (a world of one before)."""
    return _place.rank


def world_size() -> int:
    return settings().world_size


def rank() -> int:
    return settings().rank


def local_rank() -> int:
    return settings().local_rank


def local_world_size() -> int:
    return settings().local_world_size


def node_rank() -> int:
    return settings().node_rank


def backend() -> str | None:
    """The process group's backend the launcher chose (BYOC_BACKEND): nccl, xla or gloo; None without one."""
    return settings().backend


def host_ranks() -> list[int]:
    """The global ranks running on this host (the elastic launcher numbers them host by host)."""
    first = node_rank() * local_world_size()
    return list(range(first, first + local_world_size()))


def is_distributed() -> bool:
    return world_size() > 1


def setup(rank_settings: RankSettings) -> None:
    """Take this rank's place in the job and join the process group (once); accelerate and the
    Trainer then reuse it."""
    _place.rank = rank_settings
    if not is_distributed() or dist.is_initialized():
        return
    chosen = settings()
    backend = chosen.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    elif backend == "gloo":  # CPU ranks: their checkpoints must load back with map_location="cpu:0"
        compat.restore_indexed_cpu_locations()
    elif backend == "xla":  # NeuronCores: the base image's torch-xla registers the "xla" backend
        import torch_xla.distributed.xla_backend  # noqa: F401
    timeout = timedelta(seconds=chosen.collective_timeout)
    dist.init_process_group(backend=backend, timeout=timeout)
    _place.control_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    logger.info(
        "rank %d of %d (local rank %d on host %d) joined the %s process group",
        rank(),
        world_size(),
        local_rank(),
        node_rank(),
        backend,
    )


def _device() -> torch.device:
    """Where a control tensor lives: the CPU, unless the only group is one that needs the device."""
    if dist.is_initialized() and _place.control_group is None and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """True on every rank if it is True on any rank: decisions every rank must take together."""
    if not dist.is_initialized():
        return flag
    value = torch.tensor([1 if flag else 0], device=_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=_place.control_group)
    return bool(value.item())


def all_gather(value: Any) -> list[Any]:
    """Every rank's `value` (any picklable object), in rank order."""
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value, group=_place.control_group)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier(group=_place.control_group)


def teardown() -> None:
    """Leave the process group together. A rank that exits while its peers still talk to it can
    abort in the collective library's threads ("terminate called without an active exception",
    exit 134) even though its work is done."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _place.control_group = None


@contextlib.contextmanager
def host_leader_first() -> Iterator[None]:
    """Local rank 0 runs the block first (filling on-disk caches); the host's other ranks then reuse it."""
    leader = local_rank() == 0
    if not leader:
        barrier()
    try:
        yield
    finally:
        if leader:
            barrier()
