"""byoc.compat on the installed torch and transformers (the suite runs on both ends of the range),
and the launcher's SIGTERM grace, which torch 2.9 has no setting for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from byoc import compat
from helpers import CPU_ONLY, REPO, Job, build_tiny_bert


def test_this_tier_runs_inside_the_supported_range():
    tomllib = pytest.importorskip("tomllib")
    import torch
    import transformers
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    supported = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["byoc"]["supported"]
    for name, installed in (("torch", torch.__version__), ("transformers", transformers.__version__)):
        assert Version(Version(installed).base_version) in SpecifierSet(supported[name]), (name, installed)


def test_launch_config_leaves_out_what_this_torch_lacks():
    from torch.distributed.launcher.api import LaunchConfig

    config = compat.launch_config(
        min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="job", shutdown_timeout=77, keyword_of_a_future_torch=1
    )
    assert isinstance(config, LaunchConfig) and config.nproc_per_node == 2
    assert not hasattr(config, "keyword_of_a_future_torch")
    if compat.launcher_has_shutdown_timeout():  # torch >= 2.13
        assert config.shutdown_timeout == 77
    else:  # torch 2.9-2.11: passing it raised TypeError at every multi-process launch
        assert not hasattr(config, "shutdown_timeout")


def test_shutdown_grace_sets_the_agents_wait_where_the_config_cannot(monkeypatch):
    import inspect

    from torch.distributed.elastic.multiprocessing.api import PContext

    original = PContext.close
    monkeypatch.setattr(compat, "launcher_has_shutdown_timeout", lambda: False)
    with compat.shutdown_grace(77):
        assert inspect.signature(PContext.close).parameters["timeout"].default == 77
    assert PContext.close is original
    monkeypatch.setattr(compat, "launcher_has_shutdown_timeout", lambda: True)
    with compat.shutdown_grace(77):
        assert PContext.close is original  # the config carries it


def test_training_arguments_in_this_transformers_names(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        report_to="none",
        **compat.sampling_arguments(True, 0, 0.25, gradient_checkpointing=True),
    )
    assert compat.is_length_grouped(args)
    assert args.get_warmup_steps(100) == 25
    assert True in (getattr(args, "activation_checkpointing", None), getattr(args, "gradient_checkpointing", None))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        report_to="none",
        **compat.sampling_arguments(False, 7, 0.25, gradient_checkpointing=False),
    )
    assert not compat.is_length_grouped(args)
    assert args.get_warmup_steps(100) == 7
    assert not getattr(args, "activation_checkpointing", None) and not args.gradient_checkpointing


def test_the_trainer_still_has_the_private_methods_byoc_overrides():
    compat.check_trainer_hooks()  # the installed transformers

    class Renamed:
        def _get_train_sampler(self, dataset=None):
            pass

    with pytest.raises(
        RuntimeError,
        match=r"Trainer\._get_train_sampler\(dataset\); byoc overrides "
        r"_get_train_sampler\(train_dataset\)",
    ):
        compat.check_trainer_hooks(Renamed)


def test_a_half_precision_checkpoint_is_fine_tuned_in_float32(tmp_path):
    """transformers 5 loads a checkpoint in its saved type: a Hub model saved in fp16 trained with fp16
    weights (AdamW's small updates rounded away) until byoc asked for float32."""
    import torch
    from transformers import AutoModel

    from byoc.training.arguments import TrainArguments
    from byoc.training.model import ModelSource, load_model

    half = tmp_path / "half"
    AutoModel.from_pretrained(build_tiny_bert(tmp_path / "full")).half().save_pretrained(half)
    assert AutoModel.from_pretrained(half, **compat.fp32_weights()).dtype == torch.float32
    model = load_model(ModelSource(str(half), "test"), TrainArguments(), ["a", "b"])
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_checkpoints_load_onto_an_indexed_cpu_device(tmp_path):
    """What transformers 4.55 does when a multi-process CPU job resumes (map_location=args.device)."""
    import torch

    torch.save({"step": torch.arange(3)}, tmp_path / "optimizer.pt")
    compat.restore_indexed_cpu_locations()
    compat.restore_indexed_cpu_locations()  # twice: registered once
    state = torch.load(tmp_path / "optimizer.pt", map_location=torch.device("cpu", 0), weights_only=True)
    assert state["step"].tolist() == [0, 1, 2] and state["step"].device.type == "cpu"


# A user script (script mode) that needs `seconds` to save after SIGTERM.
SLOW_SAVER = """
import os, signal, sys, time
out = os.environ["SM_MODEL_DIR"]
rank = os.environ["RANK"]
def save(*_):
    time.sleep(float(os.environ["SAVE_SECONDS"]))
    open(os.path.join(out, f"saved-{rank}"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
open(os.path.join(out, f"ready-{rank}"), "w").close()
while True:
    time.sleep(0.1)
"""


def _slow_saver_job(root: Path) -> Job:
    source = root.parent / "src"
    source.mkdir(parents=True)
    (source / "train.py").write_text(SLOW_SAVER)
    archive = root.parent / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "train.py", arcname="train.py")
    job = Job(root).resources()
    (job.channel("train") / "data.csv").write_text("text,label\nhi,1\n")
    job.hyperparameters(
        {"sagemaker_program": json.dumps("train.py"), "sagemaker_submit_directory": json.dumps(str(archive))}
    )
    return job


def _stop_after_ready(job: Job, env: dict[str, str]) -> None:
    full = {**os.environ, "SAGEMAKER_BASE_DIR": str(job.root), "BYOC_PROCESSES_PER_HOST": "2", **CPU_ONLY, **env}
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "byoc"), "train"],
        env=full,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not all((job.model_dir / f"ready-{r}").exists() for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in (137, 143), out[-3000:]


def test_after_sigterm_ranks_get_byoc_shutdown_timeout_to_save_on_every_torch(tmp_path):
    # Within the grace: both ranks finish saving.
    job = _slow_saver_job(tmp_path / "in-time" / "opt-ml")
    _stop_after_ready(job, {"SAVE_SECONDS": "3", "BYOC_SHUTDOWN_TIMEOUT": "20"})
    assert {p.name for p in job.model_dir.glob("saved-*")} == {"saved-0", "saved-1"}
    # Past the grace: killed when it ends, not at torch 2.9's fixed 30 s (nor after the 8 s save).
    job = _slow_saver_job(tmp_path / "too-slow" / "opt-ml")
    _stop_after_ready(job, {"SAVE_SECONDS": "8", "BYOC_SHUTDOWN_TIMEOUT": "2"})
    assert not list(job.model_dir.glob("saved-*"))
