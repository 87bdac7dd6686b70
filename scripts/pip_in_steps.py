"""`pip install ARGS`, the large wheels one at a time: pip keeps every wheel it downloads until the
last is installed, so the XLA tier's venv (torch's CUDA build and its NVIDIA libraries: 3.3 GB of
wheels, 8 GB installed) needed 11 GB of disk at its peak; one at a time, 9 GB.

usage: PYTHON scripts/pip_in_steps.py [pip install arguments]  (PYTHON: the venv's interpreter)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# What makes the disk peak: torch's CUDA build and what it brings (the NVIDIA libraries, triton) and torch-xla.
LARGE = re.compile(r"^(nvidia-.*|torch|torch-xla|triton)$")


def planned(pip: list[str], args: list[str]) -> list[tuple[str, str]]:
    """(name, version) of every distribution `pip install args` would install, resolved without
    installing (pip reads the index's metadata files, not the wheels)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([*pip, "install", "--dry-run", "--quiet", "--report", str(report), *args], check=True)
        items = json.loads(report.read_text())["install"]
    return [(item["metadata"]["name"], item["metadata"]["version"]) for item in items]


def large(names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The large ones, in the order pip resolved them."""
    return [(name, version) for name, version in names if LARGE.match(name.lower().replace("_", "-"))]


# pip install's options that take a value, and which of them name requirements (left out of each step).
VALUED = {"-c", "--constraint", "-f", "--find-links", "-i", "--index-url", "--extra-index-url"}
REQUIREMENTS = {"-r", "--requirement", "-e", "--editable"}


def step_options(args: list[str]) -> list[str]:
    """`args` without what it asks to install (requirements, -r files, -e folders): the options of each step."""
    kept: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg in REQUIREMENTS:
            next(rest, None)
        elif arg in VALUED:
            kept += [arg, next(rest, "")]
        elif arg.startswith("-"):
            kept.append(arg)
    return kept


def main(args: list[str]) -> None:
    pip = [sys.executable, "-m", "pip"]
    options = step_options(args)
    for name, version in large(planned(pip, args)):
        print(f"[pip_in_steps] {name}=={version}", flush=True)
        subprocess.run([*pip, "install", *options, "--no-deps", f"{name}=={version}"], check=True)
    subprocess.run([*pip, "install", *args], check=True)  # the rest, the large ones already in place


if __name__ == "__main__":
    main(sys.argv[1:])
