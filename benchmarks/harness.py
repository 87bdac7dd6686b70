"""What every benchmark shares: its results file written with the provenance of its figures, and its scenarios
alternated in rounds.

- `write_results(path, results)` writes `{"provenance": ..., "results": results}`: the commit measured (and
  whether the work tree held changes), the date, the machine (CPU model, its vector instructions, cores, memory,
  GPUs) and the versions of the libraries that decide the figures. A figure in README.md or docs/ then names
  where it comes from without anyone copying it by hand. No absolute path of the machine goes into a results
  file (they are tracked): each is written as its last part, and the run's output says where (the figures are
  kept).
- `alternate(scenarios, rounds)` runs each declared scenario once a round, in an order that rotates from round
  to round, so a machine that slows down hits every scenario alike; `medians` reduces the rounds, and
  `scenarios(declared, rounds)` does both for nested figures (every script takes `--rounds`: `add_rounds`).
  Ratios between scenarios of one run are the figures to read: these machines are noisy.

Only the standard library here: the harness runs in every venv a benchmark uses (the competitors' included).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The libraries whose versions decide the figures (those installed are recorded; the others are left out).
PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnx",
    "tokenizers",
    "numpy",
    "datasets",
    "accelerate",
    "uvicorn",
    "starlette",
    "torch-xla",
    "torch-neuronx",
)
_MACHINE_PATHS = re.compile(r"(?<![\w.])(/(?:home|root|tmp|work|Users|var/folders|private)/[^\s\"']*)")


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """Where these figures come from: the commit and the date when the benchmark started (this module's import:
    the code it loaded; a tree changed later does not change what ran), the machine, library versions and the
    command that ran."""
    return {
        **_STARTED,
        "written": _now(),
        "machine": machine(),
        "versions": {"python": platform.python_version(), **versions()},
        "command": command(sys.argv if argv is None else argv),
    }


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "--short=12", "HEAD"), "work_tree_changed": bool(changed)}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine() -> dict[str, Any]:
    """CPU model and vector instructions, cores (the machine's and those this process may use), memory and GPUs,
    read without torch."""
    return {
        "cpu": _cpu_model(),
        "cpu_features": cpu_features(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": _gpus(),
        "system": f"{platform.system()} {platform.machine()}",
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The CPU flags that decide a CPU benchmark's figures: the widths of its vector arithmetic, and the bf16 and
# int8 instructions torch and ONNX Runtime pick kernels by. One cloud "2-core AMD EPYC" is not another: the same
# model ran 2-2.7x apart on two days (docs/benchmarks.md), and a file that names these can say why.
_FEATURES = re.compile(r"avx2|fma|avx512(f|bw|vl|_bf16|_fp16|_vnni)|avx_vnni|amx_\w+")


def cpu_features() -> list[str]:
    """The vector-arithmetic flags of the first CPU in /proc/cpuinfo (_FEATURES), sorted; none where unreadable."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(flag for flag in line.split(":", 1)[1].split() if _FEATURES.fullmatch(flag))
    except OSError:
        pass
    return []


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpus() -> list[str]:
    """The NVIDIA GPUs nvidia-smi names (none where there is no driver), and the Neuron devices."""
    found: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            found += [line.strip() for line in done.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    neuron = sorted(Path("/dev").glob("neuron[0-9]*"))
    if neuron:
        found.append(f"{len(neuron)} Neuron device(s)")
    return found


def versions() -> dict[str, str]:
    """The installed versions of PACKAGES, from their metadata (nothing is imported)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def command(argv: list[str]) -> str:
    """The command as it ran, each path shown relative to the repository (or by its name alone)."""
    shown = []
    for arg in argv:
        key, sep, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        shown.append(key + sep + _relative(value) if value.startswith("/") else arg)
    return " ".join(shown)


def _relative(value: str) -> str:
    path = Path(value)
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def without_machine_paths(value: Any, where: str = "results") -> tuple[Any, list[str]]:
    """`value` with each absolute path of a machine in its strings replaced by the path's last part, and where
    that was done (the keys, as results["a"][0] names them)."""
    if isinstance(value, Mapping):
        pairs = [(k, without_machine_paths(v, f"{where}[{json.dumps(str(k))}]")) for k, v in value.items()]
        return {k: v for k, (v, _) in pairs}, [hit for _, (_, hits) in pairs for hit in hits]
    if isinstance(value, (list, tuple)):
        items = [without_machine_paths(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return [v for v, _ in items], [hit for _, hits in items for hit in hits]
    if isinstance(value, str) and _MACHINE_PATHS.search(value):
        return _MACHINE_PATHS.sub(lambda m: Path(m.group(1)).name, value), [where]
    return value, []


def write_results(path: Path, results: Any, argv: list[str] | None = None) -> Path:
    """`results` written to `path` as JSON under their provenance ({"provenance": ..., "results": ...}). An
    absolute path of this machine in them is written as its last part, and the output says where."""
    results, scrubbed = without_machine_paths(results)
    if scrubbed:
        print(f"machine paths written as their last part at: {', '.join(scrubbed[:8])}", flush=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": provenance(argv), "results": results}, indent=1) + "\n")
    print(f"written to {_relative(str(path.resolve()))}", flush=True)
    return path


def peak_rss_mib() -> float:
    """This process's peak resident memory since its program started, in MiB: VmHWM, which exec resets. Not
    getrusage's ru_maxrss: Linux keeps that across fork and exec, so a job a benchmark starts reads at least the
    benchmark's own peak (bench-encode's jobs read 733 MiB, the benchmark's, where their own was 385 MiB)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # (no /proc: a Mac's ru_maxrss is in bytes, elsewhere in KiB)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)


def alternate(scenarios: Mapping[str, Callable[[], Any]], rounds: int) -> dict[str, list[Any]]:
    """Each scenario run once a round, the order rotating each round (round r starts at the r-th scenario):
    {name: [its result in each round]}. Fewer than one round is refused: no figure could be reduced from it."""
    if rounds < 1:
        raise SystemExit(f"--rounds must be at least 1 (got {rounds})")
    names = list(scenarios)
    runs: dict[str, list[Any]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(scenarios[name]())
    return runs


def add_rounds(parser: Any, default: int = 1) -> None:
    """The `--rounds` option every script takes: how many times its scenarios run, alternated."""
    parser.add_argument(
        "--rounds", type=int, default=default, help=f"rounds of the scenarios, alternated (default {default})"
    )


def scenarios(declared: Mapping[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """The declared scenarios run over `rounds` alternated rounds: {name: its figures}, each number the median of
    its rounds (one round: the figures as they came)."""
    return {name: median_of(runs) for name, runs in alternate(declared, rounds).items()}


def median_of(rounds: list[Any]) -> Any:
    """One figure from its rounds: numbers by their median (whole numbers by the lower middle one, a round's
    own), mappings key by key (the first round's keys), and anything else (text, lists, answers) as the first
    round had it."""
    first = rounds[0]
    if len(rounds) == 1 or all(r == first for r in rounds):
        return first
    if all(isinstance(r, int) and not isinstance(r, bool) for r in rounds):
        return statistics.median_low(rounds)  # (a count stays a count: the lower middle of an even number)
    if all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rounds):
        return statistics.median(rounds)
    if all(isinstance(r, Mapping) for r in rounds):
        return {key: median_of([r[key] for r in rounds if key in r]) for key in first}
    return first


def medians(runs: Mapping[str, list[Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Each scenario's figures, the median over its rounds (the figures every round recorded)."""
    out = {}
    for name, rounds in runs.items():
        keys = [k for k in rounds[0] if all(isinstance(r.get(k), (int, float)) for r in rounds)]
        out[name] = {k: round(statistics.median(r[k] for r in rounds), 3) for k in keys}
    return out


_STARTED = {**_commit(), "date": _now()}  # (read as the benchmark starts: see provenance)
