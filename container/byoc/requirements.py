"""`pip install -r requirements.txt` for the user's code folder: a model's `code/` when serving
starts, the `source_dir` of a script-mode training job. One behaviour for both."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

FILE = "requirements.txt"


class RequirementsError(RuntimeError):
    """pip failed; the message is the end of pip's error output, `requirements` the file it read."""

    def __init__(self, requirements: Path, message: str) -> None:
        super().__init__(message)
        self.requirements = requirements


def lists_anything(requirements: Path) -> bool:
    """Whether the file names anything beyond blank lines and comments (pip is not started for nothing)."""
    text = requirements.read_text(encoding="utf-8", errors="replace")
    return any(line.split("#")[0].strip() for line in text.splitlines())


def install_requirements(code_dir: Path) -> Path | None:
    """Install `code_dir/requirements.txt` into this interpreter, as the sagemaker toolkits do.

    pip runs in `code_dir`, so relative entries (`./my_package`, `-e .`) mean the code's own folder
    wherever the process was started. Returns the file installed, None when there is nothing to install;
    raises RequirementsError when pip fails.
    """
    requirements = Path(code_dir) / FILE
    if not requirements.is_file() or not lists_anything(requirements):
        return None
    logger.info("installing %s", requirements)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-input", "-r", str(requirements)],
        capture_output=True,
        text=True,
        cwd=requirements.parent,
    )
    if done.returncode != 0:
        tail = " | ".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-3:])
        raise RequirementsError(requirements, tail or f"pip exited with code {done.returncode}")
    return requirements
