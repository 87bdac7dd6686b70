"""Script mode: an Estimator's entry_point/source_dir runs under byoc's launcher."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from helpers import CPU_ONLY, Job, run_train_process

SCRIPT = """
import argparse, json, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.add_argument("--name")
parser.add_argument("--fail")
parser.add_argument("--hf_token")
args, _ = parser.parse_known_args()  # credentials under other names (test_secret_looking_...)
if args.fail == "exception":
    raise ValueError("column 'review' not found")
if args.fail == "exit":
    sys.exit(3)
if args.fail == "noisy":
    for _ in range(40):
        print("x" * 500_000, file=sys.stderr)
    raise ValueError("column 'review' not found after 20 MB of noise")
rank = os.environ.get("RANK")
out = {"epochs": args.epochs, "name": args.name, "rank": rank, "world": os.environ.get("WORLD_SIZE"),
       "train": os.environ["SM_CHANNEL_TRAIN"], "hosts": json.loads(os.environ["SM_HOSTS"]), "cwd": os.getcwd()}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(out, f)
"""


def script_job(
    tmp_path: Path, *, fail: str | None = None, requirements: str | None = None, script: str = SCRIPT
) -> Job:
    source = tmp_path / "src"
    source.mkdir(parents=True)
    (source / "train.py").write_text(script)
    if requirements:
        (source / "requirements.txt").write_text(requirements)
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in source.iterdir():
            tar.add(path, arcname=path.name)
    job = Job(tmp_path / "opt-ml").resources()
    (job.channel("train") / "data.csv").write_text("text,label\nhi,1\n")
    # As the SDK sends them for an Estimator with entry_point/source_dir: JSON-encoded strings.
    hps = {
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps(str(archive)),
        "sagemaker_region": json.dumps("us-east-1"),
        "epochs": "3",
        "name": json.dumps("my run"),
    }
    if fail:
        hps["fail"] = json.dumps(fail)
    job.hyperparameters(hps)
    return job


@pytest.mark.integration  # a real job in processes
def test_the_users_script_runs_on_every_rank_with_its_arguments(tmp_path):
    job = script_job(tmp_path, requirements="numpy\n")
    result = run_train_process(job.root, env={"BYOC_PROCESSES_PER_HOST": "2", **CPU_ONLY})  # two CPU ranks
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = [json.loads((job.model_dir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, out in enumerate(outputs):
        assert out == {
            "epochs": 3,
            "name": "my run",
            "rank": str(rank),
            "world": "2",
            "train": str(job.root / "input" / "data" / "train"),
            "hosts": ["algo-1"],
            "cwd": str(job.root / "code"),
        }
    assert "installing" in result.stdout and "requirements.txt" in result.stdout


@pytest.mark.integration  # a real job in processes
def test_a_failing_script_keeps_its_error_and_exit_code(tmp_path):
    job = script_job(tmp_path / "a", fail="exception")
    result = run_train_process(job.root)
    assert result.returncode == 1
    assert job.failure.strip() == (
        "rank 0 on algo-1 failed: the process exited with code 1; its last error: ValueError: column 'review' not found"
    )
    job = script_job(tmp_path / "b", fail="exit")
    assert run_train_process(job.root).returncode == 3
    assert job.failure.startswith("rank 0 on algo-1 failed: the process exited with code 3")


@pytest.mark.integration  # a real job in processes
def test_missing_entry_point_and_bad_requirements_fail_clearly(tmp_path):
    job = script_job(tmp_path / "a")
    hps = json.loads((job.root / "input/config/hyperparameters.json").read_text())
    hps["sagemaker_program"] = json.dumps("trian.py")
    job.hyperparameters(hps)
    assert run_train_process(job.root).returncode == 1
    assert job.failure.startswith("the entry point 'trian.py' is not in the source directory"), job.failure

    job = script_job(tmp_path / "b", requirements="./no-such-folder\n")
    assert run_train_process(job.root).returncode == 1
    assert job.failure.startswith("pip could not install requirements.txt from source_dir"), job.failure


@pytest.mark.integration  # a real job in processes
def test_a_noisy_script_fills_no_disk_and_its_last_error_is_quoted(tmp_path):
    """A script that writes 20 MB to stderr: it all reaches the log, nothing is copied to disk (the
    launcher teed each rank's stderr into a temporary file without a cap), and the failure quotes
    the last error from a tail kept in memory."""
    job = script_job(tmp_path / "a", fail="noisy")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = run_train_process(job.root, env={"TMPDIR": str(scratch)})
    assert result.returncode == 1
    assert job.failure.strip() == (
        "rank 0 on algo-1 failed: the process exited with code 1; "
        "its last error: ValueError: column 'review' not found after 20 MB of noise"
    )
    assert len(result.stdout) + len(result.stderr) > 20_000_000  # the noise was passed through
    big = [(p, p.stat().st_size) for p in scratch.rglob("*") if p.is_file() and p.stat().st_size > 1_000_000]
    assert not big, big


# Issue 21: hfToken, awsSecretAccessKey and a password starting with "--" reached the log.
SECRETS = {
    "hf_token": "hf_SeCrEt123",
    "hfToken": "hf_SeCrEt456",
    "awsSecretAccessKey": "wJalrXUtnFEMI-SeCrEt",
    "db-password": "--SeCrEt-x",
    "APIKEY": "SeCrEt-apikey",
    "empty_token": "",
}


@pytest.mark.integration  # a real job in processes
def test_secret_looking_hyperparameters_stay_out_of_the_log(tmp_path):
    job = script_job(tmp_path)
    hps = json.loads((job.root / "input/config/hyperparameters.json").read_text())
    job.hyperparameters({**hps, **{name: json.dumps(value) for name, value in SECRETS.items()}})
    result = run_train_process(job.root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in SECRETS:
        assert f"--{name} ***" in result.stdout, name
    assert "SeCrEt" not in result.stdout + result.stderr


# A script whose argparse refuses the arguments it does not know, quoting them in its error.
STRICT_SCRIPT = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--epochs")
parser.parse_args()
"""


@pytest.mark.integration  # a real job in processes
def test_a_secret_that_an_argparse_error_quotes_stays_out_of_the_failure_file(tmp_path):
    """`unrecognized arguments: --db_password VALUE` put VALUE into output/failure, which SageMaker
    shows in its console and DescribeTrainingJob."""
    job = script_job(tmp_path, script=STRICT_SCRIPT)
    hps = json.loads((job.root / "input/config/hyperparameters.json").read_text())
    secrets = {"db_password": "Hunter2-SeCrEt", "dbUrl": "postgres://me:Url-SeCrEt@db:5432/app"}
    job.hyperparameters({**hps, **{name: json.dumps(value) for name, value in secrets.items()}})
    result = run_train_process(job.root)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "unrecognized arguments: " in job.failure and "--db_password ***" in job.failure, job.failure
    assert "postgres://me:***@db:5432/app" in job.failure and "SeCrEt" not in job.failure, job.failure
    assert "SeCrEt" not in result.stdout + result.stderr  # byoc's log lines and the script's output


# Issue 39: the script's own output quoted the secret arguments unmasked (its stderr passed through as written).
LOUD_SCRIPT = """
import argparse, sys
print("my arguments:", " ".join(sys.argv[1:]))  # stdout, a write per piece (python -u)
for step in range(3):
    sys.stdout.write(f"\\r{step + 1}/3 [{'#' * (step + 1):<3}]")  # a progress bar: \\r updates, no newline
    sys.stdout.flush()
print()
parser = argparse.ArgumentParser()
parser.add_argument("--epochs")
parser.parse_args()
"""


@pytest.mark.integration  # a real job in processes
def test_a_script_that_quotes_the_secret_arguments_has_them_masked_in_its_output(tmp_path):
    """argparse's `unrecognized arguments: --db_password VALUE` on the script's stderr, its own print
    of them on stdout: both reach the job's log masked, the rest of each line and the progress bar's
    carriage returns intact, the exit code the script's."""
    job = script_job(tmp_path, script=LOUD_SCRIPT)
    hps = json.loads((job.root / "input/config/hyperparameters.json").read_text())
    secrets = {"db_password": "hunter2-SeCrEt", "SECRETKEY": "Sk-SeCrEt-9", "dbUrl": "postgres://me:Url-SeCrEt@db/app"}
    job.hyperparameters({**hps, **{name: json.dumps(value) for name, value in secrets.items()}})
    result = run_train_process(job.root)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "SeCrEt" not in result.stdout + result.stderr
    error = next(line for line in result.stderr.splitlines() if "unrecognized arguments:" in line)
    assert error.startswith("train.py: error: unrecognized arguments: "), error
    assert "--SECRETKEY *** " in error and "--db_password *** " in error, error
    assert "--dbUrl postgres://me:***@db/app" in error and "--name my run" in error, error
    said = next(line for line in result.stdout.splitlines() if line.startswith("my arguments:"))
    assert "--db_password *** " in said and "--SECRETKEY *** " in said, said
    # The bar's \r updates read as \n here (text=True); test_script_rank sees them intact.
    assert "\n1/3 [#  ]\n2/3 [## ]\n3/3 [###]\n" in result.stdout


def test_hyperparameters_of_the_built_in_job_are_logged_masked(job, caplog):
    from byoc.training import entry

    job.hyperparameters({"epochs": "1", "hfToken": json.dumps("hf_SeCrEt"), "db-password": "--SeCrEt"})
    with caplog.at_level("INFO", logger="byoc"):
        assert entry.train() == 1  # an unknown hyperparameter: refused, naming it but not its value
    assert "db-password=*** epochs=1 hfToken=***" in caplog.text
    assert "SeCrEt" not in caplog.text + job.failure and "unknown hyperparameter 'hfToken'" in job.failure


def test_which_names_are_secret():
    from byoc.logs import is_secret

    secret = ["hf_token", "hfToken", "HfToken", "HF-TOKEN", "HFTOKEN", "--WANDB_API_KEY", "wandbApiKey", "db-password"]
    secret += ["awsSecretAccessKey", "AWS_SECRET_ACCESS_KEY", "apiKey", "APIKEY", "APIKey", "api-key", "aws_secret"]
    secret += ["auth", "authToken", "passwd", "Credentials", "private_key", "x_api_key2", "dbpassword"]
    # Unmasked before (issue 28): glued, all-caps or abbreviated names.
    secret += ["SECRETKEY", "privatekey", "openaikey", "wandbAPIkey", "dbPwd", "githubPAT", "bearer"]
    assert [name for name in secret if not is_secret(name)] == []
    plain = ["keyword", "monkey", "hockey", "author", "tokenizer_name", "epochs", "max_tokens", "MaxTokens"]
    plain += ["num_tokens", "learning_rate", "model_id", "sagemaker_program", "patience", "path", "db_url"]
    assert [name for name in plain if is_secret(name)] == []


def test_secret_values_are_masked_whatever_they_look_like():
    from byoc.logs import mask_secrets

    args = ["--api_key", "abc", "--epochs", "3", "--password=hunter2", "--db-password", "--x", "--hfToken", ""]
    args += ["--awsSecretAccessKey", "--name=value", "--name", "run", "--token=", "--auth"]
    assert mask_secrets(args) == [
        "--api_key",
        "***",
        "--epochs",
        "3",
        "--password=***",
        "--db-password",
        "***",
        "--hfToken",
        "***",
        "--awsSecretAccessKey",
        "***",
        "--name",
        "run",
        "--token=***",
        "--auth",
    ]


# A train.py on byoc's runtime (as code/train.py): rank 1 ends abnormally after its work, or in it.
ABORTS = """
import atexit, os, sys
from byoc.launch import distributed
from byoc.training.entry import run_job

def main(contract, args, settings):
    distributed.setup(settings.rank)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{distributed.rank()}.txt"), "w") as f:
        f.write("saved")
    distributed.teardown()
    if distributed.rank() == 1:
        if os.environ["ABORT"] == "at-exit":
            atexit.register(os.abort)  # as torch's collective library at exit: SIGABRT once main has returned
        else:
            os.abort()
    return {}

sys.exit(run_job(main))
"""


@pytest.mark.integration  # a real job in processes
def test_a_rank_aborting_as_it_exits_after_the_job_finished_does_not_fail_the_job(tmp_path):
    """Seen once in CI: a two-rank job saved its model, then rank 1 died by SIGABRT at interpreter exit
    ("terminate called without an active exception", torch's collective library); the job failed."""
    results = {}
    for when in ("at-exit", "in-main"):
        job = script_job(tmp_path / when, script=ABORTS)
        hps = json.loads((job.root / "input/config/hyperparameters.json").read_text())
        job.hyperparameters({k: v for k, v in hps.items() if k != "name"})  # byoc's job reads them: its own only
        env = {"BYOC_PROCESSES_PER_HOST": "2", "ABORT": when, **CPU_ONLY}
        results[when] = (job, run_train_process(job.root, env=env))
    job, result = results["at-exit"]
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert not (job.root / "output" / "failure").exists()
    assert {p.name for p in job.model_dir.glob("rank-*.txt")} == {"rank-0.txt", "rank-1.txt"}
    assert "rank 1 on algo-1 finished its work, then failed as its process exited" in log
    assert "SIGABRT" in log
    job, result = results["in-main"]  # before run_job returned: the work was not finished
    assert result.returncode == 134, (result.stdout + result.stderr)[-3000:]
    assert job.failure.startswith("rank 1 on algo-1 failed: the process was killed by SIGABRT"), job.failure
