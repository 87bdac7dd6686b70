"""The XLA device path: Trainium NeuronCores, or torch-xla on CPU (`PJRT_DEVICE=CPU`) to try it.

Which path a job takes, the environment torch-xla and the Neuron compiler need before they load,
and what torch-xla's own metrics say about compilation. Every import of `torch_xla` (and of
the Neuron libraries) happens inside a function, so byoc imports and its tests run where they
are absent.

A compiler builds one graph per input shape; the trainer keeps shapes few with fixed-shape
buckets (`byoc.training.buckets`), and the trainer's `CompileReport` counts, with `compiled_graphs`, the
graphs torch-xla compiled in each epoch and each evaluation, so a job shows that nothing
recompiles after its first epoch.
"""

from __future__ import annotations

# Imported where used: torch_xla exists only in the Neuron image (and the XLA test tier).
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from byoc.errors import UserError
from byoc.launch.devices import device_counts
from byoc.training.settings import TrainingSettings, XlaSettings

logger = logging.getLogger(__name__)

COMPILE_CACHE_DIR = "neuron-compile-cache"  # under the checkpoint folder: synced to S3, kept across spot restarts


class XlaError(UserError, RuntimeError):
    """The XLA path cannot run as asked (e.g. the Neuron SDK's tools are missing)."""


def wants_xla(device: str, settings: TrainingSettings) -> bool:
    """device=xla; or auto where NeuronCores are visible (or the launcher chose them)."""
    if device == "xla":
        return True
    if device != "auto":
        return False
    if settings.rank.backend == "xla":
        return True
    return device_counts("local", settings.xla.neuron_cores)[1] > 0


def parallel_compile_command(command: list[str], precompiling: bool, neuron_cores: int | None) -> list[str] | None:
    """neuron_precompile on NeuronCores: the job's command under the Neuron SDK's
    `neuron_parallel_compile`, which traces the graphs and compiles them in parallel into the
    compile cache. None elsewhere (torch-xla on CPU compiles into its cache as the job runs), and
    inside that run (`precompiling`). `neuron_cores`: the launch settings'."""
    if precompiling or not device_counts("local", neuron_cores)[1]:
        return None
    tool = shutil.which("neuron_parallel_compile")
    if tool is None:
        raise XlaError(
            "neuron_precompile=true needs the Neuron SDK's neuron_parallel_compile, which is not on PATH: "
            "use the Neuron image (Dockerfile.neuron), or drop neuron_precompile"
        )
    return [tool, *command]


def keep_off_xla() -> None:
    """For a job not on the XLA path where torch-xla is installed (the Neuron image on CPU, the XLA
    test venv): transformers and accelerate would otherwise move it to XLA on their own. Call
    before they are imported."""
    os.environ["USE_TORCH_XLA"] = "0"


def pjrt_device(settings: XlaSettings) -> str:
    """torch-xla's device: PJRT_DEVICE as set, else NEURON where NeuronCores are visible, else CPU."""
    return settings.pjrt_device or ("NEURON" if device_counts("local", settings.neuron_cores)[1] else "CPU")


def on_neuron(settings: XlaSettings) -> bool:
    return pjrt_device(settings).upper() == "NEURON"


def compile_cache(checkpoint_dir: Path, settings: XlaSettings) -> str:
    """Where the Neuron compiler keeps its graphs: NEURON_COMPILE_CACHE_URL as set, else the checkpoint folder's."""
    return settings.neuron_compile_cache or str(checkpoint_dir / COMPILE_CACHE_DIR)


def prepare_environment(checkpoint_dir: Path, settings: XlaSettings) -> None:
    """Set what must be set before torch_xla loads (transformers imports it with itself, so before
    that too): the PJRT device, how scalars enter graphs, the Neuron compiler's flags, and a
    persistent compile cache under the checkpoint folder (synced to checkpoint_s3_uri, so a spot
    restart or a later job with the same shapes compiles nothing). Idempotent. torch-xla and the
    Neuron tools read these variables themselves: they are written here, from `settings`."""
    # torch-xla bakes the scalars 0 and 1 into a graph as constants instead of inputs: the warm-up's
    # first learning rate (0) would compile a step graph of its own.
    os.environ.setdefault("XLA_NO_SPECIAL_SCALARS", "1")
    os.environ["USE_TORCH_XLA"] = "1"  # this job is on XLA, whatever keep_off_xla said to its launcher
    os.environ["PJRT_DEVICE"] = pjrt_device(settings)
    if on_neuron(settings):
        flags = settings.neuron_cc_flags
        if "--model-type" not in flags:  # encoders compile best as transformers
            os.environ["NEURON_CC_FLAGS"] = f"{flags} --model-type=transformer".strip()
        os.environ["NEURON_COMPILE_CACHE_URL"] = compile_cache(checkpoint_dir, settings)


def initialize(checkpoint_dir: Path, settings: XlaSettings) -> Any:
    """Import torch-xla (after `prepare_environment`) and return this process's XLA device."""
    import torch_xla
    import torch_xla.runtime as xr

    for name in settings.bf16_casts:
        logger.warning(
            "%s casts the weights and optimizer state to bf16 too, which the tutorials warn loses small updates; "
            "byoc's bf16=true keeps fp32 weights with bf16 compute instead. Unset %s unless you mean it.",
            name,
            name,
        )

    if not on_neuron(settings):  # the Neuron runtime keeps its own cache (NEURON_COMPILE_CACHE_URL)
        cache = checkpoint_dir / COMPILE_CACHE_DIR
        try:
            cache.mkdir(parents=True, exist_ok=True)
            xr.initialize_cache(str(cache), readonly=False)
        except (RuntimeError, OSError) as err:  # already initialised in this process, or not writable
            logger.info("torch-xla's persistent compile cache is not used: %s", err)
    for handler in logging.getLogger().handlers:  # torch-xla's root-logger line at every logging step
        handler.addFilter(_quiet_rendezvous)
    device = torch_xla.device()
    logger.info(
        "XLA device %s (PJRT_DEVICE=%s), compile cache %s",
        device,
        pjrt_device(settings),
        compile_cache(checkpoint_dir, settings),
    )
    return device


def _quiet_rendezvous(record: logging.LogRecord) -> bool:
    return not (record.name == "root" and str(record.msg).startswith("Joining rendezvous"))


def decay_with_device_tensors(optimizer: Any) -> None:
    """Apply AdamW's decoupled weight decay (`param *= 1 - lr * weight_decay`, before the update,
    exactly as AdamW does) with the factor as a device tensor instead of a Python number.

    torch-xla turns Python numbers (and 0-d tensors) into graph inputs, and equal numbers into one
    shared input: late in a decaying schedule the factor rounds to 1.0 in fp32, shares its input
    with another 1.0 of the step, and the last steps of the job compile graphs of their own. A
    one-element tensor stays an input of its own."""
    import torch

    for group in optimizer.param_groups:
        group["byoc_weight_decay"], group["weight_decay"] = group.get("weight_decay", 0.0), 0.0

    def decay(opt, args, kwargs) -> None:
        with torch.no_grad():
            for group in opt.param_groups:
                rate = group.get("byoc_weight_decay", 0.0)
                params = [p for p in group["params"] if p.grad is not None]  # what AdamW updates
                if rate and params:
                    # One element, not a 0-d tensor: torch-xla treats 0-d tensors as numbers.
                    factor = torch.tensor([1.0 - group["lr"] * rate], dtype=params[0].dtype, device=params[0].device)
                    for param in params:
                        param.mul_(factor.reshape([1] * param.dim()))

    optimizer.register_step_pre_hook(decay)


def compiled_graphs() -> int:
    """Graphs torch-xla compiled so far in this process (its `UncachedCompile` counter)."""
    import torch_xla.debug.metrics as met

    return int(met.counter_value("UncachedCompile") or 0)


def compile_seconds() -> float:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return float(data[1]) / 1e9 if data else 0.0
