"""Which precision a training job computes in, and whether it compiles: one decision, from the
hyperparameters, the job's length and a description of the hardware, made once when the job starts.

What was measured (docs/training.md): at BERT's batch sizes a step is bound by kernel launches and host work.
Eagerly, bf16 autocast *adds* kernels (a cast per weight) and is slower than TF32: on an H200 (2026-11-28)
BERT-base trained 604 samples/s in eager bf16 against 995 in TF32. Compiling fuses the kernels, but costs
seconds first; on a CUDA GPU byoc compiles each transformer layer once (`compile_scope=layers`, no CUDA graphs:
`byoc.training.compiled_steps` says why). So the rule is the shortest whole job:

- `precision=auto` (the default) on a CUDA GPU from Ampere on: TF32 eagerly, unless the job is long enough to
  repay compiling (`PAYS_AFTER_STEPS`) on one process: then bf16 with its layers compiled. Before Ampere (T4,
  V100): fp32. On CPU: fp32. On Trainium (XLA): fp32 weights and compute as written, unless bf16=true.
- `bf16=true` / `fp16=true` alone (`torch_compile` unset) never make the whole job longer than the default: they
  compile where the job repays it, and otherwise train as the default does (TF32 eagerly), saying so in the log.
  Where the step cannot be compiled (several processes, the cached loss, a loss that runs the model itself) that
  is the default too. `torch_compile=true` compiles whatever the length; `torch_compile=false` keeps eager half
  precision (slower, but what was asked: for memory, say).
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
# (compile_scope). Estimates until `make bench-gpu` measures them on a GPU. layers: compiling one layer forward and
# backward, lengths dynamic, took 15.5 s on a 2-core CPU (MiniLM, 2026-11-28) and is taken as 15 s on a GPU host;
# compiled bf16 (default mode, no CUDA graphs) stepped 24 ms against TF32 eager's 29 ms (DESIGN's H100 figures,
# BERT-base at 32 x 32 tokens): 5 ms saved a step, so about 3,000 steps. model: a whole-step CUDA graph stepped
# 6.5 ms (22 ms saved) for about 30 s of compiling a bucket: about 1,500 steps a bucket.
PAYS_AFTER_STEPS = {"layers": 3000, "model": 1500}


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
    eager = tasks.recipe_eager(args.recipe)  # a recipe setting whose loss runs the model itself (cached negatives)
    if chosen.compile and eager:
        chosen = dataclasses.replace(chosen, compile=False, reason=f"{chosen.reason}; eager: {eager}")
    if chosen.compile and args.task in tasks.TASKS and tasks.get(args.task).recipe.loss_runs_model:
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
    # the fastest eager recipe (the default, and every fallback), unless tf32=false asks for full fp32 products
    eager = "tf32" if hw.ampere and args.tf32 is not False else "fp32"
    if asked not in ("auto", "bf16", "fp16"):
        return Precision(asked, bool(args.torch_compile), f"{asked} requested")
    half = asked if asked != "auto" else ("bf16" if hw.ampere else "fp16")
    if args.torch_compile:  # asked to compile: in half precision, where compiling pays most
        return Precision(half, True, f"{asked}: {half}, the step compiled (torch_compile=true)")
    if args.torch_compile is False:
        if asked == "auto":
            return Precision(eager, False, f"auto: {eager} eagerly (torch_compile=false)")
        logger.warning(
            "%s without torch_compile: eager autocast is usually slower than %s at small batches", asked, eager
        )
        return Precision(asked, False, f"{asked} requested, eager (torch_compile=false)")
    if asked == "auto" and not hw.ampere:  # (fp16 needs loss scaling: only when asked for)
        return Precision(eager, False, "auto: fp32 (no TF32 or bf16 on this GPU; fp16=true for half precision)")
    blocker = _compile_blocker(asked, args, hw, steps)
    if blocker is None:
        why = f"{asked}: {half} with the step compiled: {steps} steps repay compiling it (about {pays_after(args)})"
        if steps is None:  # (a code/train.py's own Trainer: the length is not known here)
            why = f"{asked}: {half} with the step compiled (the job's length unknown)"
        logger.info("%s; torch_compile=false opts out", why)
        return Precision(half, True, why)
    why = f"{asked}: {eager} eagerly, the faster whole job: {blocker}"
    if asked != "auto":  # the user asked for half precision and gets the default: say why, and how to insist
        logger.warning("%s (torch_compile=true compiles anyway; torch_compile=false keeps eager %s)", why, asked)
    return Precision(eager, False, why)


def _compile_blocker(asked: str, args: TrainArguments, hw: Hardware, steps: int | None) -> str | None:
    """Why compiling half precision would not give the shortest whole job here (None: it would). Eager half
    precision is slower than eager TF32, so a step that is not compiled trains in TF32."""
    if hw.processes > 1:
        return (
            f"with {hw.processes} processes the step is compiled only when asked (torch_compile=true): "
            "not yet measured there"
        )
    eager = tasks.recipe_eager(args.recipe)
    if eager:
        return eager
    if args.task in tasks.TASKS and tasks.get(args.task).recipe.loss_runs_model:
        return f"the {args.task} loss runs the model itself, which is not compiled"
    needed = pays_after(args)
    if steps is None:
        return "the job's length is unknown" if asked == "auto" else None  # (asked for: as asked)
    if steps < needed:
        return f"{steps} steps are too few to repay compiling the step (about {needed})"
    return None
