"""`byoc.distributed`: the rank's side of a multi-process job, at the path copies of `code/train.py`
made before the package had rooms import it from (`distributed.teardown()`). It lives in
byoc.launch.distributed; this module only re-exports it."""

from byoc.launch.distributed import *  # noqa: F403
from byoc.launch.distributed import teardown

__all__ = ["teardown"]
