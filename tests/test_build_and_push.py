"""build_and_push.sh against recording stand-ins for `aws` and `docker` (ECR cannot be reached here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

SCRIPT = REPO / "build_and_push.sh"

AWS = """#!/bin/sh
echo "aws $*" >> "$RECORD"
case "$*" in
  "sts get-caller-identity"*) [ -n "$NO_CREDENTIALS" ] && { echo "Unable to locate credentials" >&2; exit 253; }
                              echo 123456789012 ;;
  "ecr describe-repositories"*) [ -n "$REPO_EXISTS" ] || { echo "RepositoryNotFoundException" >&2; exit 254; } ;;
  "ecr get-login-password"*) echo secret ;;
esac
"""

DOCKER = """#!/bin/sh
echo "docker $*" >> "$RECORD"
[ "$1" = login ] && cat > /dev/null
exit 0
"""


@pytest.fixture
def standins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("aws", AWS), ("docker", DOCKER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record.txt"
    record.touch()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), "HOME": str(tmp_path)}
    return env, record


def run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_builds_tags_and_pushes_creating_the_repository(standins):
    env, record = standins
    result = run(env, "gpu", "--region", "eu-west-1")
    assert result.returncode == 0, result.stderr
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/byoc-gpu"
    assert result.stdout.strip().splitlines()[-1] == f"{image}:0.1.0-{sha}"
    calls = record.read_text().splitlines()
    assert calls[:2] == ["docker info", "aws sts get-caller-identity --query Account --output text"]
    assert (
        "aws ecr create-repository --region eu-west-1 --repository-name byoc-gpu "
        "--image-scanning-configuration scanOnPush=true" in calls
    )
    assert "docker login --username AWS --password-stdin 763104351884.dkr.ecr.eu-west-1.amazonaws.com" in calls
    assert "docker login --username AWS --password-stdin 123456789012.dkr.ecr.eu-west-1.amazonaws.com" in calls
    build = next(c for c in calls if c.startswith("docker build"))
    assert build == (
        "docker build --file Dockerfile.gpu --build-arg BASE_IMAGE=763104351884.dkr.ecr.eu-west-1.amazonaws.com/"
        f"pytorch-training:2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker --build-arg BYOC_IMAGE={image}:0.1.0-{sha} "
        f"--tag {image}:0.1.0-{sha} --tag {image}:gpu ."
    )
    assert calls[-2:] == [f"docker push {image}:0.1.0-{sha}", f"docker push {image}:gpu"]


def test_existing_repository_custom_name_and_tag(standins):
    env, record = standins
    result = run(
        {**env, "REPO_EXISTS": "1", "AWS_REGION": "us-west-2"}, "neuron", "--repository", "team/clf", "--tag", "v7"
    )
    assert result.returncode == 0, result.stderr
    calls = record.read_text()
    assert "create-repository" not in calls
    assert "docker build --file Dockerfile.neuron" in calls and "pytorch-training-neuronx" in calls
    assert result.stdout.strip().endswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/team/clf:v7")


def test_the_serving_image_builds_on_the_public_slim_python_without_a_base_login(standins):
    env, record = standins
    result = run(env, "serve", "--region", "eu-west-1", "--tag", "v1")
    assert result.returncode == 0, result.stderr
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/byoc-serve"
    assert result.stdout.strip().splitlines()[-1] == f"{image}:v1"
    calls = record.read_text().splitlines()
    assert "aws ecr create-repository --region eu-west-1 --repository-name byoc-serve" in " ".join(calls)
    # ECR Public is pulled anonymously, and never from the region: only the account's registry is logged in to.
    assert [c for c in calls if c.startswith("docker login")] == [
        "docker login --username AWS --password-stdin 123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    ]
    build = next(c for c in calls if c.startswith("docker build"))
    assert build == (
        "docker build --file Dockerfile.serve --build-arg BASE_IMAGE=public.ecr.aws/docker/library/python:3.12-slim "
        f"--build-arg BYOC_IMAGE={image}:v1 --tag {image}:v1 --tag {image}:serve ."
    )
    assert calls[-2:] == [f"docker push {image}:v1", f"docker push {image}:serve"]


def test_dry_run_prints_instead_of_running(standins):
    env, record = standins
    result = run(env, "gpu", "--region", "us-east-1", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "+ docker build --file Dockerfile.gpu" in result.stdout and "+ docker push" in result.stdout
    assert "docker build" not in record.read_text()
    # The login pipelines are printed whole (piping one echo into another lost them, and now and
    # then killed the dry run with SIGPIPE: exit 141).
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    login = f"+ aws ecr get-login-password --region us-east-1 | docker login --username AWS --password-stdin {registry}"
    assert login in result.stdout.splitlines()


@pytest.mark.parametrize(
    "args, env_extra, message",
    [
        ((), {}, "which flavour? give gpu, neuron or serve"),
        (("cpu",), {}, "unknown argument 'cpu': the flavour is gpu, neuron or serve"),
        (("gpu",), {}, "no AWS region"),
        (("gpu", "--region", "us-east-1"), {"NO_CREDENTIALS": "1"}, "no AWS credentials"),
    ],
)
def test_fails_early_and_clearly(standins, args, env_extra, message):
    env, record = standins
    result = run({**env, **env_extra}, *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "docker build" not in record.read_text()


def test_fails_clearly_without_docker(standins, tmp_path):
    env, _ = standins
    bin_dir = Path(env["PATH"].split(":")[0])
    (bin_dir / "docker").unlink()
    for tool in ("bash", "sed", "dirname", "git", "date", "cat"):  # everything else the script uses
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = run({**env, "PATH": str(bin_dir)}, "gpu", "--region", "us-east-1")
    assert result.returncode != 0 and "docker is not installed" in result.stderr


# .ci/run installs shellcheck and sets BYOC_REQUIRE_DOCKER: there this test never skips.
@pytest.mark.skipif(
    shutil.which("shellcheck") is None and not os.environ.get("BYOC_REQUIRE_DOCKER"),
    reason="shellcheck is not installed (.ci/run installs it)",
)
def test_scripts_are_shellcheck_clean():
    result = subprocess.run(
        ["shellcheck", str(SCRIPT), str(REPO / "container" / "docker" / "entrypoint.sh")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
