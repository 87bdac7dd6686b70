"""The GPU image serves on ONNX Runtime's CUDA provider: Dockerfile.gpu swaps the onnxruntime
distribution for onnxruntime-gpu in the GPU flavour only (same module, one of the two per venv),
and pins it; every other flavour, the tests' CPU image included, keeps onnxruntime."""

from __future__ import annotations

import re
import subprocess

from helpers import REPO


def swap_command() -> str:
    dockerfile = (REPO / "Dockerfile.gpu").read_text()
    (line,) = [x for x in dockerfile.splitlines() if "onnxruntime-gpu" in x and x.startswith("RUN ")]
    return line.removeprefix("RUN ")


def requirements_after_swap(tmp_path, flavour: str) -> list[str]:
    folder = tmp_path / flavour / "tmp" / "src" / "requirements"
    folder.mkdir(parents=True)
    (folder / "runtime.txt").write_text((REPO / "requirements" / "runtime.txt").read_text())
    command = swap_command().replace("/tmp/src/", f"{tmp_path / flavour}/tmp/src/")
    subprocess.run(["sh", "-c", command], env={"FLAVOUR": flavour, "PATH": "/usr/bin:/bin"}, check=True)
    lines = (folder / "runtime.txt").read_text().splitlines()
    return [re.split(r"[<>=\[ ]", x)[0] for x in lines if x and not x.startswith("#")]


def test_only_the_gpu_flavour_installs_onnxruntime_gpu(tmp_path):
    gpu = requirements_after_swap(tmp_path, "gpu")
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu
    for flavour in ("cpu", "neuron"):
        others = requirements_after_swap(tmp_path, flavour)
        assert "onnxruntime" in others and "onnxruntime-gpu" not in others
    assert "${FLAVOUR}" in swap_command()  # the build argument decides, nothing else


def test_onnxruntime_gpu_is_pinned_for_the_gpu_image_only():
    gpu = (REPO / "requirements" / "gpu-constraints.txt").read_text()
    (pin,) = re.findall(r"^onnxruntime-gpu==([\d.]+)$", gpu, flags=re.M)
    assert tuple(int(x) for x in pin.split(".")[:2]) >= (1, 21)  # onnxruntime.preload_dlls
    for name in ("cpu-constraints.txt", "common-constraints.txt", "xla-test-constraints.txt"):
        assert "onnxruntime-gpu" not in (REPO / "requirements" / name).read_text()
