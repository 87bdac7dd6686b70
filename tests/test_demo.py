"""The README's first command: the demo job runs end to end and learns its task."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real jobs in processes: not in make test-fast

REPO = Path(__file__).resolve().parents[1]


def test_demo_trains_and_predicts(tmp_path):
    env = {**os.environ, "BYOC_DEMO_DIR": str(tmp_path)}
    env.pop("SAGEMAKER_BASE_DIR", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", done.stdout).group(1))
    assert accuracy >= 0.8, done.stdout[-2000:]
    assert "-> shipping" in done.stdout and "-> billing" in done.stdout
    assert (tmp_path / "opt-ml" / "model" / "model.safetensors").exists()
