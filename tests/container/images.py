"""What the container tests need: the test images, built offline on a real Docker engine (the CPU
image from Dockerfile.gpu, the serving image from Dockerfile.serve), and the SageMaker SDK venvs of
the local-mode tests. The tests make each when it is missing; `.ci/run` makes them ahead, beside the
other venvs (`python tests/container/images.py images|sdk`).

Neither the DLC bases nor the official Python image can be pulled here, so the images are built on
stand-in bases (`Dockerfile.cpu-base`: Debian bookworm from debootstrap + Python 3.11, and for the CPU
image the torch CPU wheel), with every Python dependency from a wheelhouse made on the host
(`wheels/`): pip inside a container cannot reach PyPI through this network's TLS proxy. Each step is
skipped when its result already exists; the two bases share their apt layer.

Every image built here carries the label LABEL, and so does every container run from one: each
build replaces the last one's images, and `prune()` removes what earlier runs left behind
(stopped containers, the replaced images). Without it each CI run on the same engine kept about
2.5 GB, until the disk filled.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "wheels"
DEBIAN = "local/debian:bookworm"
BASE = "byoc-test/cpu-base"
IMAGE = "byoc-test/cpu"
DEPS = "byoc-test/cpu-deps"  # Dockerfile.gpu's deps stage, tagged so that it is replaced, not orphaned
SLIM_BASE = "byoc-test/python-slim"  # the stand-in for public.ecr.aws/docker/library/python:3.12-slim
SERVE = "byoc-test/serve"
SERVE_DEPS = "byoc-test/serve-deps"  # Dockerfile.serve's deps stage, tagged for the same reason
LABEL = "byoc-test=1"


def docker(*args: str, check: bool = True, timeout: int = 1800, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=check, timeout=timeout, capture_output=True, text=True, **kwargs)


def engine_error() -> str | None:
    """None when a Docker engine answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker command"
    result = subprocess.run(["docker", "info"], capture_output=True, text=True)
    return None if result.returncode == 0 else f"no Docker engine answers: {result.stderr.strip()[:300]}"


def has_image(name: str) -> bool:
    return docker("image", "inspect", name, check=False).returncode == 0


def _log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def debian_base() -> None:
    if has_image(DEBIAN):
        return
    _log("debootstrap bookworm (about a minute)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(root), "http://deb.debian.org/debian"],
            check=True,
            capture_output=True,
            timeout=1200,
        )
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", DEBIAN], stdin=tar.stdout, check=True, capture_output=True)
        tar.wait()


def wheelhouse() -> None:
    """Every wheel the image installs, built for this platform (sdists turned into wheels here)."""
    # Downloaded again (pip keeps the wheels it has) whenever the requirements change.
    stamp = WHEELS / ".requirements.sha256"
    wanted = hashlib.sha256(
        b"".join(
            (REPO / "requirements" / name).read_bytes()
            for name in ("runtime.txt", "cpu-constraints.txt", "common-constraints.txt", "serve.txt")
        )
    ).hexdigest()
    if any(WHEELS.glob("torch-*.whl")) and stamp.exists() and stamp.read_text() == wanted:
        return
    _log("downloading the wheelhouse into wheels/")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [
            *pip,
            "download",
            "-q",
            "-d",
            str(WHEELS),
            "torch==2.13.0",
            "setuptools",
            "wheel",
            "-r",
            str(REPO / "requirements" / "runtime.txt"),
            "-r",
            str(REPO / "requirements" / "serve.txt"),  # a part of runtime.txt (tested), listed in case it is not
            "-c",
            str(REPO / "requirements" / "cpu-constraints.txt"),
        ],
        check=True,
        timeout=1800,
    )
    for sdist in [p for p in WHEELS.iterdir() if p.name.endswith((".tar.gz", ".zip"))]:
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(WHEELS), str(sdist)], check=True, timeout=600)
        sdist.unlink()
    stamp.write_text(wanted)


def prune() -> str:
    """Remove the stopped containers and the untagged images of earlier builds (LABEL only; the
    current images stay, as the next build's cache). Returns what docker said it reclaimed."""
    said = []
    for kind in ("container", "image"):
        result = docker(kind, "prune", "--force", "--filter", f"label={LABEL}", check=False)
        said.append(f"{kind}s: {(result.stdout.strip().splitlines() or ['?'])[-1]}")
    return "; ".join(said)


_BASE_BUILD = ("build", "--network=host", "-q", "--label", LABEL, "-f", "tests/container/Dockerfile.cpu-base")


def _timed(timings: dict[str, float], name: str, step: Callable[[], object]) -> None:
    started = time.monotonic()
    step()
    timings[name] = time.monotonic() - started


def _base(name: str, *target: str) -> None:
    if not has_image(name):
        _log(f"building {name}")
        docker(*_BASE_BUILD, *target, "-t", name, ".", cwd=REPO)


def _image(dockerfile: str, base: str, deps: str, name: str, *build_args: str) -> None:
    _log(f"building {name} from {dockerfile}")
    args = ["--network=host", "-q", "--label", LABEL, "-f", dockerfile, "--build-arg", f"BASE_IMAGE={base}"]
    for arg in (*build_args, "PIP_OPTIONS=--no-index"):
        args += ["--build-arg", arg]
    # The deps stage first, under a tag: otherwise the legacy builder leaves it as an untagged image
    # that no label marks as ours. The full build then takes it from the cache.
    docker("build", *args, "--target", "deps", "-t", deps, ".", cwd=REPO)
    docker("build", *args, "-t", name, ".", cwd=REPO)


def build() -> dict[str, float]:
    """Build (or refresh) the CPU test image (Dockerfile.gpu); return the seconds each step took."""
    timings: dict[str, float] = {}
    _timed(timings, "debian", debian_base)
    _timed(timings, "wheelhouse", wheelhouse)
    _timed(timings, "cpu-base", lambda: _base(BASE))
    _timed(timings, "image", lambda: _image("Dockerfile.gpu", BASE, DEPS, IMAGE, "FLAVOUR=cpu"))
    _log(f"removed what earlier builds left: {prune()}")
    return timings


def build_serve() -> dict[str, float]:
    """Build (or refresh) the serving image (Dockerfile.serve) on the slim Python stand-in; return the
    seconds each step took. It reuses the CPU image's wheelhouse and apt layer."""
    timings: dict[str, float] = {}
    _timed(timings, "debian", debian_base)
    _timed(timings, "wheelhouse", wheelhouse)
    _timed(timings, "python-slim-base", lambda: _base(SLIM_BASE, "--target", "slim-python"))
    _timed(timings, "image", lambda: _image("Dockerfile.serve", SLIM_BASE, SERVE_DEPS, SERVE))
    _log(f"removed what earlier builds left: {prune()}")
    return timings


def size_mb(name: str) -> float:
    return int(docker("image", "inspect", "--format", "{{.Size}}", name).stdout) / 1e6


# The SageMaker Python SDK's local mode, v2 and v3, each in a venv of its own (their pins differ from the runtime's).
SDK_VENV, SDK_VERSION = REPO / ".venv-sdk", "2.257.7"
SDK3_VENV, SDK3_VERSION = REPO / ".venv-sdk3", "3.27.0"


def sdk_venv(venv: Path, version: str) -> Path:
    """The Python of a venv holding exactly that sagemaker version, (re)made when it does not."""
    python = venv / "bin" / "python"
    check = f"import importlib.metadata as m; assert m.version('sagemaker') == '{version}'"
    if not (python.exists() and subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0):
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"sagemaker=={version}"], check=True, timeout=1200)
    return python


def remove() -> str:
    """Everything made here, for a disk too small for the next tier (.ci/run): the images (ours and
    the Debian base), the builder's cache, the SDK venvs, the wheelhouse. Returns what went."""
    ours = docker("images", "--quiet", "--filter", f"label={LABEL}", check=False).stdout.split()
    docker("rm", "--force", *docker("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split(), check=False)
    docker("rmi", "--force", *ours, DEBIAN, check=False)
    docker("builder", "prune", "--all", "--force", check=False)
    for folder in (SDK_VENV, SDK3_VENV):
        shutil.rmtree(folder, ignore_errors=True)
    for made in WHEELS.glob("*.whl"):
        made.unlink()
    (WHEELS / ".requirements.sha256").unlink(missing_ok=True)
    return f"{len(ours)} test images, {DEBIAN}, the builder cache, the SDK venvs and the wheelhouse"


def main(what: list[str]) -> None:
    """python tests/container/images.py [cpu|serve|images|sdk|remove ...]: the CPU test image (the
    default), the serving image, both images, the SDK venvs; remove: everything these made."""
    if what == ["remove"]:
        print(f"removed {remove()}", flush=True)
        return
    what = what or ["cpu"]
    cpu, serve = (build, IMAGE), (build_serve, SERVE)
    builds = {"cpu": [cpu], "serve": [serve], "images": [cpu, serve]}
    steps = [step for name in what for step in builds.get(name, [])]
    if steps:
        error = engine_error()
        if error:
            sys.exit(error)
    for make, name in steps:
        timings = make()
        print(f"{name}: {size_mb(name):.0f} MB ({', '.join(f'{k} {v:.0f} s' for k, v in timings.items())})", flush=True)
    if "sdk" in what:
        print(f"SDK venvs: {sdk_venv(SDK_VENV, SDK_VERSION)}, {sdk_venv(SDK3_VENV, SDK3_VERSION)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
