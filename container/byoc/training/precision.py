"""Which precision a training job computes in, and whether it compiles: one decision, from the
hyperparameters and a description of the hardware, made once when the job starts.

What was measured (docs/training.md, DESIGN's H100 figures: BERT-base, batch 32 x 32 tokens): a step
at these batch sizes is bound by kernel launches and host work. Eagerly, bf16 autocast *adds* kernels
(a cast per weight) and ran slower than fp32 (955 against 1,275 samples/s); compiled with CUDA graphs
it ran 4,928. TF32 pays where matrix multiplies dominate (2.2x fp32 at 32 x 128 tokens). So:

- `precision=auto` (the default) on a CUDA GPU from Ampere on: TF32 eagerly, bf16 when the step is
  compiled with CUDA graphs (`torch_compile=true`); before Ampere (T4, V100): fp32 eagerly, fp16
  compiled. On CPU: fp32. On Trainium (XLA): fp32 weights and compute as written, unless bf16=true.
- Half precision on a CUDA GPU compiles by default (`torch_compile` unset): the job takes the
  fixed-shape bucket path and replays each step as a CUDA graph, which is where bf16 is a speed-up.
  With several processes this is not turned on for you (not yet measured there): set
  torch_compile=true.
- Unless the job is too short to repay the compilation (`PAYS_AFTER_STEPS`): then bf16/fp16 train as
  the default does (TF32 eagerly), which is the faster whole job; `torch_compile=true` compiles anyway.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from byoc import tasks
from byoc.training.arguments import TrainArguments

logger = logging.getLogger(__name__)

# The steps after which a compiled half-precision step has repaid its compilation, for each graph compiled
# (compile_scope). Issue 59's H100 figures, BERT-base at batch 32: 715 samples/s eagerly (the default), 1,627
# compiled in bf16, so a compiled step saves about 25 ms; the whole model took about 30 s to compile for each
# bucket shape (1,200 steps each); one layer, compiled once for every length, a few seconds (about 200 steps).
# Estimates until `make bench-gpu` measures them on a GPU.
PAYS_AFTER_STEPS = {"layers": 200, "model": 1200}


@dataclass(frozen=True)
class Hardware:
    """What the choice depends on: the device kind and, for a CUDA GPU, its compute capability."""

    device: str  # cpu, cuda or xla
    capability: tuple[int, int] | None = None  # CUDA compute capability: (8, 0) A100, (9, 0) H100, (7, 5) T4
    processes: int = 1  # training processes in the job (world size)
    name: str = ""

    @property
    def ampere(self) -> bool:
        """TF32 and bf16 tensor cores (Ampere, compute capability 8.0, and later)."""
        return self.device == "cuda" and self.capability is not None and self.capability >= (8, 0)


@dataclass(frozen=True)
class Precision:
    """The decision: `name` is fp32, tf32, bf16 or fp16; `compile` says whether torch.compile runs."""

    name: str
    compile: bool
    reason: str
    tf32: bool = False  # TF32 matrix multiplies: under tf32, and under bf16/fp16 for what autocast leaves in fp32

    def training_arguments(self) -> dict[str, Any]:
        """The `TrainingArguments` precision flags."""
        return {"bf16": self.name == "bf16", "fp16": self.name == "fp16", "tf32": self.tf32}


def detect(use_xla: bool, processes: int = 1) -> Hardware:
    """This machine's description (asks torch; only on the training path, where torch is loaded)."""
    if use_xla:
        return Hardware("xla", processes=processes)
    # Only here: the rest of the module is a pure function of the hardware it is given, used without torch.
    import torch

    if not torch.cuda.is_available():
        return Hardware("cpu", processes=processes)
    return Hardware("cuda", torch.cuda.get_device_capability(), processes, torch.cuda.get_device_name())


def requested(args: TrainArguments) -> str:
    """The precision asked for: `precision`, or what the tutorials' bf16/fp16/tf32 switches say."""
    if args.precision != "auto":
        return args.precision
    if args.bf16:
        return "bf16"
    if args.fp16:
        return "fp16"
    if args.tf32 is not None:
        return "tf32" if args.tf32 else "fp32"
    return "auto"


def choose(args: TrainArguments, hardware: Hardware, steps: int | None = None) -> Precision:
    """The precision and compile setting for this job on this hardware (fallbacks logged as warnings);
    `steps`: the training steps the job will take, where known (a short job is not compiled by itself)."""
    asked = requested(args)
    if hardware.device == "xla":
        return _xla(asked)
    chosen = _cpu(asked, args.torch_compile) if hardware.device == "cpu" else _cuda(asked, args, hardware, steps)
    if chosen.compile and args.mini_batch_size:  # the cached loss runs the model itself, in mini-batches
        chosen = dataclasses.replace(chosen, compile=False, reason=f"{chosen.reason}; eager: mini_batch_size")
    if chosen.compile and args.task in tasks.TASKS and tasks.get(args.task).loss_runs_model:
        chosen = dataclasses.replace(chosen, compile=False, reason=f"{chosen.reason}; eager: the {args.task} loss")
    if hardware.device == "cpu":
        return chosen
    tf32 = chosen.name == "tf32" or (chosen.name in ("bf16", "fp16") and hardware.ampere and args.tf32 is not False)
    return dataclasses.replace(chosen, tf32=tf32)


def _xla(asked: str) -> Precision:
    if asked == "bf16":
        return Precision("bf16", False, "bf16=true: bf16 autocast, fp32 weights and optimizer state")
    if asked in ("fp16", "tf32"):
        logger.warning("%s is for CUDA GPUs; on Trainium use bf16=true. Training runs in fp32", asked)
    return Precision("fp32", False, "fp32 weights as written (bf16=true for bf16 autocast)")


def _cpu(asked: str, torch_compile: bool | None) -> Precision:
    compile = bool(torch_compile)
    if asked == "bf16":
        logger.warning("bf16 on a CPU: correct, but slower than fp32 on CPUs without AMX")
        return Precision("bf16", compile, "bf16=true")
    if asked in ("fp16", "tf32"):
        logger.warning("%s needs a CUDA GPU; none here, so training runs in fp32", asked)
    return Precision("fp32", compile, "a CPU: fp32")


def pays_after(args: TrainArguments) -> int:
    """The training steps after which compiling the step repays its compilation (all its graphs)."""
    graphs = 1 if args.compile_scope == "layers" else max(1, args.max_buckets)
    return PAYS_AFTER_STEPS[args.compile_scope] * graphs


def _cuda(asked: str, args: TrainArguments, hw: Hardware, steps: int | None = None) -> Precision:
    if asked == "bf16" and not hw.ampere:
        logger.warning("this GPU (%s) has no bf16; training runs in fp32 (try fp16=true)", hw.name or hw.capability)
        asked = "fp32"
    if asked == "tf32" and not hw.ampere:
        logger.warning("TF32 needs a GPU from Ampere on; this one (%s) trains in fp32", hw.name or hw.capability)
        asked = "fp32"
    if asked == "auto":
        graphs = bool(args.torch_compile) and args.cuda_graphs
        if graphs:
            half = "bf16" if hw.ampere else "fp16"
            return Precision(half, True, f"auto: {half}, compiled with CUDA graphs (where half precision pays)")
        name = "tf32" if hw.ampere else "fp32"
        return Precision(name, bool(args.torch_compile), f"auto: {name} (eager half precision is slower here)")
    if asked in ("bf16", "fp16"):
        needed = pays_after(args)
        if args.torch_compile is None and hw.processes == 1 and steps is not None and steps < needed:
            name = "tf32" if hw.ampere else "fp32"
            why = (
                f"{asked} requested, but {steps} steps are too few to repay compiling the step (about {needed}), and "
                f"{asked} eagerly is slower than {name}: {name} eagerly, the faster whole job (torch_compile=true "
                "compiles anyway)"
            )
            logger.warning(why)
            return Precision(name, False, why)
        return Precision(asked, _compile_half(asked, args, hw), f"{asked} requested")
    return Precision(asked, bool(args.torch_compile), f"{asked} requested")


def _compile_half(name: str, args: TrainArguments, hw: Hardware) -> bool:
    """Half precision compiles unless told not to: eagerly its casts make a launch-bound step slower."""
    if args.torch_compile is not None:
        if not args.torch_compile:
            logger.warning(
                "%s without torch_compile: eager autocast is usually slower than fp32 at small batches", name
            )
        return args.torch_compile
    if hw.processes > 1:
        logger.warning(
            "%s with %d processes runs eagerly, usually slower than fp32 at small batches: set torch_compile=true "
            "to compile the step with CUDA graphs (on by itself only for one process, where it was measured)",
            name,
            hw.processes,
        )
        return False
    logger.info(
        "%s: compiling the training step (fixed-shape buckets, CUDA graphs); torch_compile=false opts out", name
    )
    return True
