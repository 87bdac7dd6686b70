"""Build the CPU test image from Dockerfile.gpu, offline, on a real Docker engine.

The DLC bases cannot be pulled here, so the image is built on a stand-in base (Debian bookworm
from debootstrap + Python 3.11 + the torch CPU wheel, `Dockerfile.cpu-base`), with every Python
dependency from a wheelhouse made on the host (`wheels/`): pip inside a container cannot reach
PyPI through this network's TLS proxy. Each step is skipped when its result already exists.

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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "wheels"
DEBIAN = "local/debian:bookworm"
BASE = "byoc-test/cpu-base"
IMAGE = "byoc-test/cpu"
DEPS = "byoc-test/cpu-deps"  # Dockerfile.gpu's deps stage, tagged so that it is replaced, not orphaned
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
            for name in ("runtime.txt", "cpu-constraints.txt", "common-constraints.txt")
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


def build() -> dict[str, float]:
    """Build (or refresh) the test image; return the seconds each step took."""
    timings: dict[str, float] = {}
    for name, step in (("debian", debian_base), ("wheelhouse", wheelhouse)):
        started = time.monotonic()
        step()
        timings[name] = time.monotonic() - started
    started = time.monotonic()
    if not has_image(BASE):
        _log(f"building {BASE}")
        docker(
            "build",
            "--network=host",
            "-q",
            "--label",
            LABEL,
            "-f",
            "tests/container/Dockerfile.cpu-base",
            "-t",
            BASE,
            ".",
            cwd=REPO,
        )
    timings["cpu-base"] = time.monotonic() - started
    started = time.monotonic()
    _log(f"building {IMAGE} from Dockerfile.gpu")
    args = [
        "--network=host",
        "-q",
        "--label",
        LABEL,
        "-f",
        "Dockerfile.gpu",
        "--build-arg",
        f"BASE_IMAGE={BASE}",
        "--build-arg",
        "FLAVOUR=cpu",
        "--build-arg",
        "PIP_OPTIONS=--no-index",
    ]
    # The deps stage first, under a tag: otherwise the legacy builder leaves it as an untagged image
    # that no label marks as ours. The full build then takes it from the cache.
    docker("build", *args, "--target", "deps", "-t", DEPS, ".", cwd=REPO)
    docker("build", *args, "-t", IMAGE, ".", cwd=REPO)
    timings["image"] = time.monotonic() - started
    _log(f"removed what earlier builds left: {prune()}")
    return timings


if __name__ == "__main__":
    error = engine_error()
    if error:
        sys.exit(error)
    for step, seconds in build().items():
        print(f"{step}: {seconds:.0f} s")
    print(docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}", IMAGE).stdout.strip())
