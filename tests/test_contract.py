"""The /opt/ml contract: config files, channels, checkpoints, failure file."""

import json
import sys

import pytest

from byoc.contract import ContractError, Paths, read_training_contract, write_failure


def test_reads_all_config_files(job):
    job.hyperparameters({"epochs": "1"})
    job.channel("train")
    job.channel("test", mode="FastFile")
    job.resources("algo-2", ["algo-2", "algo-1"])
    (job.root / "input/config/checkpointconfig.json").write_text(
        json.dumps({"LocalPath": "/opt/ml/checkpoints", "S3Uri": "s3://bucket/ckpt"})
    )
    contract = read_training_contract()
    assert contract.paths.base == job.root
    assert contract.hyperparameters == {"epochs": "1"}
    assert contract.channels["test"].input_mode == "FastFile"
    assert contract.channel_dirs == {"train": job.root / "input/data/train", "test": job.root / "input/data/test"}
    assert contract.hosts == ["algo-1", "algo-2"] and contract.current_host == "algo-2"
    # A relocated root keeps its checkpoints beside its other folders.
    assert contract.checkpoint_dir == job.root / "checkpoints"
    assert contract.checkpoint_s3_uri == "s3://bucket/ckpt"


def test_pipe_mode_is_refused_with_a_fix(job):
    job.hyperparameters({})
    job.channel("train", mode="Pipe")
    with pytest.raises(ContractError, match="Pipe input mode.*input_mode='File'"):
        read_training_contract()


def test_missing_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "nothing"))
    with pytest.raises(ContractError, match="SAGEMAKER_BASE_DIR"):
        read_training_contract()


def test_without_inputdataconfig_channels_are_the_data_folders(job):
    job.hyperparameters({})
    (job.root / "input/data/train").mkdir(parents=True)
    (job.root / "input/config/resourceconfig.json").unlink()
    contract = read_training_contract()
    assert list(contract.channels) == ["train"] and contract.hosts == ["algo-1"]


def test_bad_json_names_the_file(job):
    (job.root / "input/config/hyperparameters.json").write_text("{not json")
    with pytest.raises(ContractError, match="hyperparameters.json is not valid JSON"):
        read_training_contract()


@pytest.mark.parametrize(
    "name,content",
    [
        ("resourceconfig.json", "[]"),
        ("resourceconfig.json", '"algo-1"'),
        ("resourceconfig.json", "null"),
        ("inputdataconfig.json", '["train"]'),
        ("checkpointconfig.json", '["/opt/ml/checkpoints"]'),
        ("checkpointconfig.json", "42"),
        ("hyperparameters.json", '[["epochs", "1"]]'),
    ],
)
def test_valid_json_that_is_not_an_object_names_the_file(job, name, content):
    """Issue 21: these gave "unexpected error: AttributeError" from `byoc train`."""
    from byoc.training import entry

    job.hyperparameters({"epochs": "1"})
    job.channel("train")
    (job.root / "input/config" / name).write_text(content)
    with pytest.raises(ContractError, match=f"{name} must hold a JSON object of .* but it holds a JSON"):
        read_training_contract()
    assert entry.train() == 1
    failure = (job.root / "output/failure").read_text()
    assert failure.startswith(f"{name} must hold a JSON object") and "unexpected" not in failure, failure


@pytest.mark.parametrize(
    "name,config,words",
    [
        ("inputdataconfig.json", {"train": "File"}, "channel 'train' must map to a JSON object"),
        ("resourceconfig.json", {"current_host": "algo-1", "hosts": "algo-1"}, "hosts must be a list of host names"),
        ("checkpointconfig.json", {"LocalPath": ["/opt/ml/checkpoints"]}, "LocalPath must be a folder path"),
    ],
)
def test_settings_of_the_wrong_kind_name_the_file(job, name, config, words):
    job.hyperparameters({})
    job.channel("train")
    (job.root / "input/config" / name).write_text(json.dumps(config))
    with pytest.raises(ContractError, match=f"{name}: {words}"):
        read_training_contract()


def test_current_host_must_be_listed(job):
    job.hyperparameters({})
    job.resources("algo-3", ["algo-1", "algo-2"])
    with pytest.raises(ContractError, match="algo-3"):
        read_training_contract()


def test_failure_file_keeps_the_first_reason(tmp_path):
    paths = Paths(tmp_path)
    write_failure(paths, "first reason")
    write_failure(paths, "second reason")
    assert (tmp_path / "output/failure").read_text() == "first reason\n"


def test_failure_message_works_when_imports_are_broken(monkeypatch):
    """A SIGTERM can cut `import torch` short; the failure path must not import anything heavy."""
    from byoc.launch.launcher import LaunchError
    from byoc.training.entry import failure_message
    from byoc.training.stopping import Stopped

    for name in (
        "torch",
        "transformers",
        "byoc.training.job",
        "byoc.training.model",
        "byoc.training.checkpoints",
        "byoc.training.data",
    ):
        monkeypatch.setitem(sys.modules, name, None)  # any import of them now raises ImportError
    assert failure_message(Stopped(None, phase="starting the job")).startswith("stopped by SIGTERM while starting")
    assert failure_message(LaunchError("host algo-2 did not resolve")) == "host algo-2 did not resolve"
    assert failure_message(KeyError("x")).startswith("unexpected error: KeyError")


def _raised_in(function_name: str) -> BaseException:
    """A MemoryError raised inside a function of that name (the Trainer's, or byoc's)."""
    namespace: dict = {}
    exec(f"def {function_name}():\n    raise MemoryError()", {"__name__": "byoc.training.data.pretokenized"}, namespace)
    try:
        namespace[function_name]()
    except MemoryError as err:
        return err
    raise AssertionError("not raised")


def test_out_of_memory_blames_the_batch_size_only_in_a_training_step():
    """Issue 21: a MemoryError in the final evaluation (or in building label names) said "out of memory
    while training: lower per_device_train_batch_size"; now the message says where it happened."""
    from byoc.training.entry import failure_message

    in_step = failure_message(_raised_in("training_step"))
    assert in_step.startswith("out of memory in a training step: lower per_device_train_batch_size"), in_step
    metrics = failure_message(_raised_in("compute_metrics"))
    assert metrics.startswith("out of memory while computing the evaluation metrics"), metrics
    evaluating = failure_message(_raised_in("prediction_step"))
    assert evaluating.startswith("out of memory in an evaluation step: lower per_device_eval_batch_size"), evaluating
    elsewhere = failure_message(_raised_in("build_pretokenized"))
    assert elsewhere.startswith(
        "out of memory in byoc.training.data.pretokenized.build_pretokenized, not in a training step"
    )
    for text in (metrics, evaluating, elsewhere):
        assert "per_device_train_batch_size" not in text, text
    assert failure_message(MemoryError()).startswith("out of memory outside the training steps")


def test_user_errors_are_known_by_class_not_by_name():
    """Every error whose message tells the user what to change derives from byoc.errors.UserError,
    so its message reaches output/failure as it is, whatever the class is called."""
    from byoc.contract import ContractError
    from byoc.errors import UserError
    from byoc.launch.launcher import LaunchError
    from byoc.launch.script import ScriptError
    from byoc.serving.user_code.handler_loader import HandlerError
    from byoc.training.arguments import HyperparameterError
    from byoc.training.checkpoints import CheckpointMismatch
    from byoc.training.data import DataError
    from byoc.training.entry import failure_message
    from byoc.training.model import ModelError

    for cls in (
        HyperparameterError,
        CheckpointMismatch,
        ContractError,
        DataError,
        HandlerError,
        LaunchError,
        ScriptError,
        ModelError,
    ):
        assert issubclass(cls, UserError), cls
        assert failure_message(cls("set text_column")) == "set text_column", cls

    class RenamedByALaterRefactoring(DataError):
        pass

    assert failure_message(RenamedByALaterRefactoring("no label column")) == "no label column"
    assert failure_message(ValueError("no label column")).startswith("unexpected error: ValueError")


@pytest.mark.parametrize("char", ["x", "é", "€", "😀"])
def test_the_failure_file_holds_at_most_1024_bytes_of_whole_characters(tmp_path, char):
    """SageMaker keeps 1024 bytes of output/failure; every writer goes through write_failure, which cuts
    (before, a launcher's message was written uncut, and failure_message cut characters, not bytes)."""
    from byoc.contract import Paths, write_failure

    paths = Paths(tmp_path)
    write_failure(paths, "rank 1 failed:\n" + char * 5000)
    data = paths.failure_file.read_bytes()
    assert len(data) <= 1024 and data.endswith(b"...\n")
    assert data.decode("utf-8").startswith("rank 1 failed: " + char)  # one line, whole characters


def test_a_launcher_failure_is_cut_too(tmp_path):
    from byoc.contract import Paths
    from byoc.training import entry

    paths = Paths(tmp_path)
    assert entry._finish(paths, 1, "rank 0 on algo-1 failed: " + "ValueError: " * 1000) == 1
    assert len(paths.failure_file.read_bytes()) <= 1024
