"""Compiled training steps: graphs built once per input shape, and a count of them.

On XLA (Trainium) compiling is how the device runs at all. On CUDA and CPU it is `torch_compile=true` (chosen
for long bf16/fp16 jobs on one CUDA GPU: `byoc.training.precision`). Two scopes:

- `compile_scope=layers` (the default): each transformer layer compiled in inductor's default mode, its lengths
  dynamic, no CUDA graphs. This is PyTorch's regional-compilation recipe, accelerate's `compile_regions` and
  torchtitan's per-block compile. CUDA graph trees cannot pass one separately compiled region's output to the
  next in training: the next layer's replay overwrites what the previous one handed on ("accessing tensor output
  of CUDAGraphs that has been overwritten by a subsequent run", pytorch/pytorch#152887, #160281; an H200 job
  with bf16=true failed so in its first steps on 2026-11-28), so `cuda_graphs` never applies here.
- `compile_scope=model`: the whole model per fixed-shape length bucket (the XLA path's buckets), and on CUDA
  replayed as one CUDA graph a step (`cuda_graphs`, mode reduce-overhead): one graph tree a step is what
  cudagraph trees support in training. Each bucket compiles the whole model (tens of seconds on a GPU).

Graph capture is the CUDA-only part; the rest, buckets and static graphs included, runs and is tested on CPU.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import TrainerCallback

from byoc.training import xla
from byoc.training.arguments import TrainArguments
from byoc.training.settings import INDUCTOR_CACHE_ENV

logger = logging.getLogger(__name__)


def wants_buckets(compile: bool, use_xla: bool) -> bool:
    """Fixed-shape length buckets: on XLA always, elsewhere when the step is compiled."""
    return use_xla or compile


def compile_mode(args: TrainArguments, cuda: bool) -> str:
    """inductor's mode: reduce-overhead (CUDA graphs) only for a whole-model step on CUDA; compiled layers never
    replay as CUDA graphs (the module's docstring says why)."""
    whole_step = args.compile_scope == "model"
    return "reduce-overhead" if cuda and args.cuda_graphs and whole_step else "default"


def compile_arguments(args: TrainArguments, compile: bool, use_xla: bool, cuda: bool) -> dict[str, Any]:
    """`TrainingArguments` for torch.compile (none on XLA, which compiles by itself, nor where the job compiles its
    layers itself: `compile_layers`)."""
    if use_xla or not compile or args.compile_scope == "layers":
        return {"torch_compile": False}
    return {"torch_compile": True, "torch_compile_mode": compile_mode(args, cuda)}


def compile_layers(model: Any, mode: str) -> int:
    """Regional compilation (compile_scope=layers, the default): each transformer layer of `model` (the
    transformers model) compiled with its lengths dynamic. The layers are instances of one class, whose forward
    dynamo compiles once for all of them, and once for every length: the job compiles one layer's graph (and its
    backward), in seconds where the whole step took tens of seconds for each bucket shape (issue 59's H100 job).
    Embeddings, head, loss and optimizer run eagerly. `mode`: inductor's (`compile_mode`: default for layers).
    Returns the number of layers compiled."""
    from byoc.training.model import encoder_layers  # (the layer stack freeze_layers finds, found the same way)

    layers = encoder_layers(model)
    allow_recompiles(4 * len(layers) + 8)  # (a graph per layer where dynamo cannot share one: still bounded)
    for layer in layers:
        layer.compile(mode=mode, dynamic=True)
    logger.info("torch.compile: each of the %d transformer layers (%s mode), lengths dynamic", len(layers), mode)
    return len(layers)


COMPILE_CACHE_DIR = "torch-compile-cache"  # under the checkpoint folder: synced to S3, kept across spot restarts


COMPILE_CACHE_CHANNEL = "compile_cache"  # an input channel holding an earlier job's cache (its checkpoints' folder)


def persistent_cache(
    checkpoint_dir: Path, given: str | None, seeds: tuple[Path, ...] = (), trusted: bool = False
) -> Path:
    """Keep torch.compile's caches (inductor's compiled graphs and kernels, AOTAutograd's) under the
    checkpoint folder, so a spot restart or a later job with the same shapes loads its compiled steps
    instead of compiling them again (minutes). `given`: the TORCHINDUCTOR_CACHE_DIR the user set
    (the settings' `compile_cache`), which wins. An empty cache is first filled from the first of `seeds`
    that holds one (the `compile_cache` channel, a torch-compile-cache folder in the model channel): a second
    job of the same model compiles nothing either.

    A cache's entries are pickles, and loading them runs whatever they hold: a cache that comes with a model
    folder or a channel is code, used only where the job trusts code that comes with its inputs (`trusted`:
    trust_remote_code=true), as a folder's own modeling code is. The job's own checkpoint folder is its own."""
    # Private inductor modules, only when compiling: importing them loads the compiler.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    from torch._inductor.utils import clear_caches

    # torch writes its default into the variable the first time it looks: that one is not the user's.
    cache = Path(given) if given and given != default_cache_dir() else checkpoint_dir / COMPILE_CACHE_DIR
    seed = next((f for f in seeds if f.is_dir() and any(p.is_file() for p in f.rglob("*"))), None)
    if seed is not None and not any(p.is_file() for p in cache.rglob("*")):
        if trusted:
            shutil.copytree(seed, cache, dirs_exist_ok=True)
            logger.info("torch.compile cache seeded from %s (trust_remote_code=true: its pickles are loaded)", seed)
        else:
            logger.warning(
                "torch.compile cache in %s not used: its entries are pickles, which run code as they load; set "
                "trust_remote_code=true to use a cache you made yourself (the job compiles afresh meanwhile)",
                seed,
            )
    # Inductor, and the compile workers it starts, read the folder from the environment only.
    os.environ[INDUCTOR_CACHE_ENV] = str(cache)
    clear_caches()  # paths torch derived from the old directory
    return cache


def cache_counts() -> dict[str, int]:
    """Inductor graphs this process loaded from the cache (hits) and compiled (misses)."""
    inductor = counters["inductor"]
    return {"hits": int(inductor["fxgraph_cache_hit"]), "misses": int(inductor["fxgraph_cache_miss"])}


def static_graphs_per_bucket(buckets: list[int]) -> None:
    """One static graph per bucket shape: dynamo otherwise turns the second shape it sees into a
    dynamic-shape graph (slower, and never a CUDA graph), and gives up past 8 recompiles."""
    torch._dynamo.config.automatic_dynamic_shapes = False
    allow_recompiles(4 * len(buckets) + 8)  # train and evaluation graphs per bucket, and their graph breaks


def allow_recompiles(limit: int) -> None:
    """Let dynamo keep at least `limit` graphs of one function before it gives up (8 by default)."""
    for name in ("cache_size_limit", "recompile_limit"):  # the limit's name differs across torch 2.9-2.13
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(int(getattr(torch._dynamo.config, name)), limit))


def dynamo_graphs() -> int:
    """Graphs torch.compile built so far in this process."""
    return int(counters["stats"]["unique_graphs"])


class CompileReport(TrainerCallback):
    """Counts the graphs compiled in each training epoch and each evaluation, and logs them: a
    job shows that nothing recompiles after its first epoch."""

    def __init__(self, use_xla: bool) -> None:
        self.use_xla = use_xla
        self.name, self.prefix = ("XLA", "xla") if use_xla else ("torch.compile", "torch_compile")
        self.count: Callable[[], int] = xla.compiled_graphs if use_xla else dynamo_graphs
        self.per_epoch: list[int] = []
        self.evaluations: list[int] = []
        self._mark = 0

    def _take(self) -> int:
        now = self.count()
        new, self._mark = now - self._mark, now
        return new

    def on_train_begin(self, args, state, control, **kwargs):
        self._mark = self.count()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.per_epoch.append(self._take())
        logger.info(
            "%s: %d graph(s) compiled in epoch %d (%d in all)",
            self.name,
            self.per_epoch[-1],
            len(self.per_epoch),
            self.count(),
        )

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations.append(self._take())

    def on_log(self, args, state, control, **kwargs):
        if self.use_xla:
            # Logging resets the loss accumulator; run that now, or it joins the next step's graph and
            # makes a second variant of every bucket's step.
            import torch_xla  # only on the XLA path, where it is installed

            torch_xla.sync()

    def summary(self) -> dict[str, Any]:
        out = {
            f"{self.prefix}_graphs_compiled": self.count(),
            f"{self.prefix}_graphs_per_epoch": self.per_epoch,
            f"{self.prefix}_graphs_per_evaluation": self.evaluations,
        }
        if self.use_xla:
            out["xla_compile_seconds"] = round(xla.compile_seconds(), 1)
        else:
            counts = cache_counts()
            out["torch_compile_cache_hits"], out["torch_compile_cache_misses"] = counts["hits"], counts["misses"]
        return out
