"""`byoc.distributed`, public API: a training script's view of its rank in a multi-process job (its
numbers, byoc's few collectives, and `teardown()`, which `code/train.py` calls once the model is
saved). It lives in byoc.launch.distributed; this module re-exports it, the same objects, by name."""

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
    teardown,
    world_size,
)

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
    "teardown",
]
