"""scripts/pip_in_steps.py: the XLA tier's venv installed one large wheel at a time, the rest after."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import pip_in_steps  # noqa: E402  (a script, not a package)


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel with one module, made by hand (no build backend, no index)."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{name.replace('-', '_')}.py": "",
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    target = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return target


def test_the_large_ones_are_torch_its_libraries_and_torch_xla():
    names = [("numpy", "2.2"), ("nvidia-cublas-cu12", "12.8"), ("torch", "2.9.0"), ("torch_xla", "2.9.0")]
    names += [("triton", "3.5"), ("torchvision", "0.24"), ("transformers", "4.55")]
    wanted = [("nvidia-cublas-cu12", "12.8"), ("torch", "2.9.0"), ("torch_xla", "2.9.0"), ("triton", "3.5")]
    assert pip_in_steps.large(names) == wanted


def test_each_step_keeps_the_options_not_the_requirements():
    args = ["--quiet", "-c", "c.txt", "torch", "-r", "runtime.txt", "--find-links", "w/", "-e", ".", "pytest"]
    assert pip_in_steps.step_options(args) == ["--quiet", "-c", "c.txt", "--find-links", "w/"]


@pytest.mark.integration  # a venv and pip
def test_installs_the_large_ones_first_then_the_rest(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "triton", "9.0")
    wheel(wheels, "nvidia-fake-cu12", "1.0")
    wheel(wheels, "small", "1.0", requires=("triton==9.0", "nvidia-fake-cu12"))
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    script = Path(pip_in_steps.__file__)
    done = subprocess.run(
        [python, str(script), "--quiet", "--no-cache-dir", "--no-index", "--find-links", str(wheels), "small"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("[pip_in_steps]")]
    assert sorted(steps) == ["[pip_in_steps] nvidia-fake-cu12==1.0", "[pip_in_steps] triton==9.0"]
    check = "import small, triton, nvidia_fake_cu12"
    assert subprocess.run([python, "-c", check], capture_output=True).returncode == 0
