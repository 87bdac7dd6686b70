"""The serving side alone, as the serving image (Dockerfile.serve) installs it: a venv of
requirements/serve.txt (pinned by serve-constraints.txt) with byoc on top (`--no-deps`). It holds
nothing of the training side and stays small; `byoc serve` there serves a model trained by byoc, with
its own code/inference.py; a model that needs torch fails at load naming the full images, and
`byoc train` stops at once, naming them too.

The venv is `.venv-serve/` (ignored), kept between runs: its dependencies are made again only when the
requirement files or the Python change, byoc only when its sources do, so the second test tier and
later runs pay for neither."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import TEXTS, Server, model_with_code, tiny_classifier

from byoc.serving.user_code.handler_loader import FULL_IMAGE_MODULES
from helpers import REPO

VENV = REPO / ".venv-serve"
REQUIREMENTS = REPO / "requirements"
MAX_MB = 400  # the serving image's target for its environment (issue 23)
TRAINING_SIDE = ("torch", "transformers", "datasets")
TOOLS = ("pip", "setuptools", "byoc")  # what the venv holds beside the pinned requirements


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _dependencies_key() -> str:
    """What the venv's dependencies are made from: the requirement files, and this Python."""
    files = ("serve.txt", "serve-constraints.txt", "common-constraints.txt")
    return _digest(sys.version.encode(), *((REQUIREMENTS / name).read_bytes() for name in files))


def _byoc_key() -> str:
    """What byoc's install is made from (README.md is copied too, but only as the package's description)."""
    sources = [REPO / "pyproject.toml", *sorted((REPO / "container" / "byoc").rglob("*.py"))]
    return _digest(*(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() for p in sources))


def _pip(*args: str) -> None:
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "-q", *args], check=True, timeout=1200)


def _install_dependencies() -> None:
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
    _pip("install", "-c", str(REQUIREMENTS / "serve-constraints.txt"), "-r", str(REQUIREMENTS / "serve.txt"))


def _install_byoc() -> None:
    """From a copy of what Dockerfile.serve copies, so that no build output lands in the checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, source / name)
        shutil.copytree(REQUIREMENTS, source / "requirements")
        shutil.copytree(
            REPO / "container" / "byoc", source / "container" / "byoc", ignore=shutil.ignore_patterns("__pycache__")
        )
        _pip("install", "--no-deps", "--force-reinstall", str(source))


def _refresh(stamp: Path, key: str, install) -> None:
    if stamp.exists() and stamp.read_text() == key:
        return
    stamp.unlink(missing_ok=True)  # a run cut short leaves no stamp behind, so the next one redoes the step
    install()
    stamp.write_text(key)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One maker at a time: both test tiers, and other checkouts' runs, may reach here together."""
    with open(Path(tempfile.gettempdir()) / "byoc-venv-serve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def serving_venv() -> Path:
    """The serving-only venv, made or brought up to date."""
    with _locked():
        deps_key = _dependencies_key()
        if not (VENV / ".dependencies").exists() or (VENV / ".dependencies").read_text() != deps_key:
            _refresh(VENV / ".dependencies", deps_key, _install_dependencies)
            (VENV / ".byoc").unlink(missing_ok=True)
        _refresh(VENV / ".byoc", _byoc_key(), _install_byoc)
    return VENV


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _pins(path: Path) -> dict[str, str]:
    """name -> version of a constraints file, following its `-c` lines."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-c "):
            pins |= _pins(path.parent / line[3:].strip())
        elif "==" in line:
            name, version = line.split("==")
            pins[_name(name)] = version.strip()
    return pins


def _requirements(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


# --- what the serving side is (unit tests) --------------------------------------------------------------------


def test_every_serving_requirement_is_a_runtime_requirement_with_the_same_bounds():
    """serve.txt is runtime.txt's serving part: the two cannot drift apart."""
    assert set(_requirements(REQUIREMENTS / "serve.txt")) <= set(_requirements(REQUIREMENTS / "runtime.txt"))


def test_the_full_image_modules_are_what_the_serving_image_leaves_out():
    """The handler loader names the full images for an import of any of these (and only these)."""
    serve = {_name(re.split(r"[<>=\[ ]", r)[0]) for r in _requirements(REQUIREMENTS / "serve.txt")}
    runtime = {_name(re.split(r"[<>=\[ ]", r)[0]) for r in _requirements(REQUIREMENTS / "runtime.txt")}
    imported_as = {"mlflow_skinny": "mlflow"}  # the distributions whose module has another name
    left_out = {imported_as.get(n, n) for n in (name.replace("-", "_") for name in runtime - serve)}
    assert FULL_IMAGE_MODULES == left_out | {"torch"}


# --- the venv -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def venv() -> Path:
    return serving_venv()


def _installed(venv: Path) -> dict[str, str]:
    script = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, check=True)
    return {_name(name): version for name, version in json.loads(done.stdout).items()}


def _megabytes(path: Path) -> float:
    return (
        int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])
        / 1024
    )


@pytest.mark.integration
def test_the_serving_venv_holds_no_training_side_only_pinned_packages_and_stays_small(venv):
    installed = _installed(venv)
    assert not [name for name in TRAINING_SIDE if name in installed]
    pins = _pins(REQUIREMENTS / "serve-constraints.txt")
    unpinned = {name: v for name, v in installed.items() if name not in TOOLS and pins.get(name) != v}
    assert not unpinned, f"installed but not pinned (at that version) in serve-constraints.txt: {unpinned}"
    size = _megabytes(venv)
    print(f"serving venv: {size:.0f} MB, {len(installed)} distributions")
    assert size <= MAX_MB


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir) -> Path:
    """A byoc model with its own code/inference.py: the template every model `byoc train` writes carries."""
    classifier = tiny_classifier(tmp_path_factory, tiny_model_dir)
    return model_with_code(
        classifier,
        tmp_path_factory.mktemp("slim-model"),
        (REPO / "code" / "inference.py").read_text() + "\n# this model's own change: its code is imported\n",
    )


def _byoc(venv: Path) -> Path:
    return venv / "bin" / "byoc"


def _healthcheck(venv: Path, tmp: Path) -> int:
    """`byoc healthcheck` as the image's HEALTHCHECK runs it, finding the server through `tmp` (TMPDIR)."""
    return subprocess.run([str(_byoc(venv)), "healthcheck"], env={"TMPDIR": str(tmp)}, timeout=300).returncode


@pytest.mark.integration
def test_byoc_serve_in_the_serving_venv_serves_a_model_with_its_own_code(venv, model, tmp_path):
    assert _healthcheck(venv, tmp_path) == 0  # no server yet: a container that does not serve is healthy
    server = Server(model, env={"TMPDIR": str(tmp_path)}, byoc=_byoc(venv))
    try:
        server.wait_ready()
        answer = server.invoke({"inputs": TEXTS})
        assert answer.status_code == 200, answer.text
        assert [a["label"] in ("negative", "positive") for a in answer.json()] == [True] * len(TEXTS)
        assert _healthcheck(venv, tmp_path) == 0
    finally:
        log = server.stop()
    assert "code/inference.py (predict_fn overridden)" in log and "onnxruntime on cpu" in log, log[-3000:]
    assert _healthcheck(venv, tmp_path) == 1  # the port it served on answers no more


def test_the_serving_venv_serves_an_exported_sentence_transformers_folder_as_embeddings(venv, tmp_path):
    """All-MiniLM-L6-v2 as the Hub has it, after `byoc export-onnx`: pooling inside the graph, so the image
    without torch answers sentence-transformers' vectors."""
    import shutil

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    folder = Path(shutil.copytree(bundled_model_dir(), tmp_path / "st" / "model"))
    assert onnx_graph.export(folder) is not None
    server = Server(folder, env={"TMPDIR": str(tmp_path)}, byoc=_byoc(venv))
    try:
        server.wait_ready()
        answer = server.invoke({"inputs": TEXTS})
        assert answer.status_code == 200, answer.text
    finally:
        log = server.stop()
    got = np.asarray(answer.json())
    expected = SentenceTransformer(str(bundled_model_dir()), device="cpu").encode(TEXTS)
    assert (got * expected).sum(axis=1).min() >= 0.9999 and "onnxruntime on cpu" in log, log[-3000:]


def _failed_start(venv: Path, model_dir: Path, tmp: Path, env: dict | None = None) -> str:
    server = Server(model_dir, env={"TMPDIR": str(tmp), **(env or {})}, byoc=_byoc(venv))
    code, log = server.wait_exit()
    assert code != 0, log[-3000:]
    return log


@pytest.mark.integration
def test_a_model_whose_code_imports_torch_fails_at_load_naming_the_full_image(venv, model, tmp_path):
    source = "import torch\n\n" + (model / "code" / "inference.py").read_text()
    log = _failed_start(venv, model_with_code(model, tmp_path, source), tmp_path)
    assert "No module named 'torch'" in log and "not in the serving image, Dockerfile.serve" in log, log[-3000:]
    assert "Dockerfile.gpu (`./build_and_push.sh gpu`" in log


@pytest.mark.integration
@pytest.mark.parametrize("case", ["no model.onnx", "BYOC_INFERENCE_BACKEND=torch", "BYOC_INFERENCE_PRECISION=bf16"])
def test_a_model_only_torch_can_serve_fails_at_load_naming_the_full_image(venv, model, tmp_path, case):
    copy = model_with_code(model, tmp_path, (model / "code" / "inference.py").read_text())
    if case == "no model.onnx":
        (copy / "model.onnx").unlink()
    env = dict([case.split("=")]) if "=" in case else {}
    log = _failed_start(venv, copy, tmp_path, env)
    assert "this image has no torch" in log and "Dockerfile.gpu (`./build_and_push.sh gpu`" in log, log[-3000:]
    assert "ModuleNotFoundError" not in log  # the reason, not a bare import error


@pytest.mark.integration
def test_int8_without_a_graph_made_ahead_says_how_to_make_one(venv, model, tmp_path):
    log = _failed_start(venv, model, tmp_path, {"BYOC_INFERENCE_PRECISION": "int8"})
    assert "byoc export-onnx --int8" in log and "onnx package" in log, log[-3000:]


@pytest.mark.integration
def test_byoc_train_in_the_serving_venv_stops_at_once_naming_the_full_images(venv, tmp_path):
    root = tmp_path / "opt-ml"
    done = subprocess.run(  # the timeout only guards against a hang
        [str(_byoc(venv)), "train"], env={"SAGEMAKER_BASE_DIR": str(root)}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "training job" not in done.stdout + done.stderr  # at once: before the job's contract is even read
    failure = (root / "output" / "failure").read_text()
    assert "needs torch and transformers" in failure and "Dockerfile.gpu" in failure and "Dockerfile.neuron" in failure
