"""`byoc.distributed`, public API: a training script's view of its rank in a multi-process job (its
numbers, byoc's few collectives, and `teardown()`, which `code/train.py` calls once the model is
saved). `setup(RankSettings.from_env())` takes the process's place in the job: `job.prepare` calls it,
and a script launched on several ranks that does not use `prepare` calls it before asking its rank.
It lives in byoc.launch.distributed; this module re-exports it, the same objects, by name."""

from byoc.launch.distributed import (
    all_gather,
    any_rank,
    barrier,
    host_leader_first,
    is_distributed,
    local_rank,
    local_world_size,
    node_rank,
    rank,
    setup,
    teardown,
    world_size,
)
from byoc.launch.settings import RankSettings

__all__ = [
    "world_size",
    "rank",
    "local_rank",
    "local_world_size",
    "node_rank",
    "is_distributed",
    "any_rank",
    "all_gather",
    "barrier",
    "host_leader_first",
    "setup",
    "teardown",
    "RankSettings",
]
