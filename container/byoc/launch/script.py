"""Script mode: run the user's own training script (an Estimator with `entry_point`/`source_dir`).

The SDK sends `sagemaker_program` (the script) and `sagemaker_submit_directory` (an S3 or local
`sourcedir.tar.gz`, or a folder) among the hyperparameters. As the sagemaker-training toolkit
does, byoc unpacks the code into `/opt/ml/code`, installs its `requirements.txt`, exports the
`SM_*` variables, and runs the script with the other hyperparameters as `--name value`
arguments: here under byoc's launcher, so it gets one process per device, SIGTERM forwarding,
real exit codes and a failure message quoting its first error.
"""

from __future__ import annotations

# Imported where used: only script mode needs the sagemaker-training toolkit.
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from byoc.contract import ContractError, TrainingContract
from byoc.launch.launcher import launch, plan_launch
from byoc.launch.settings import LaunchSettings, RankSettings
from byoc.logs import mask_secrets
from byoc.requirements import RequirementsError, install_requirements
from byoc.sdk_values import loads as decode  # JSON where it parses, else the raw string, as the toolkit does

logger = logging.getLogger(__name__)


class ScriptError(ContractError):
    """The user's script cannot be prepared (missing, or its requirements fail to install)."""


def is_script_mode(hyperparameters: dict[str, Any]) -> bool:
    return "sagemaker_program" in hyperparameters


def user_arguments(hyperparameters: dict[str, Any]) -> list[str]:
    """`--name value` for every hyperparameter the SDK did not add, in the toolkit's format."""
    from sagemaker_training.mapping import to_cmd_args

    return to_cmd_args({k: decode(v) for k, v in hyperparameters.items() if not k.startswith("sagemaker_")})


def fetch_code(contract: TrainingContract) -> Path:
    """Unpack sagemaker_submit_directory into <base>/code (once); return that folder."""
    from sagemaker_training.files import download_and_extract

    code_dir = contract.paths.base / "code"
    submit = decode(contract.hyperparameters.get("sagemaker_submit_directory") or "")
    if submit:
        source = submit[len("file://") :] if submit.startswith("file://") else submit
        if not source.startswith("s3://") and not Path(source).exists():
            raise ScriptError(
                f"sagemaker_submit_directory {submit!r} does not exist: pass source_dir as a local "
                "folder or an S3 URI of a sourcedir.tar.gz"
            )
        try:
            download_and_extract(source, str(code_dir))
        except Exception as err:
            raise ScriptError(f"cannot fetch the code from sagemaker_submit_directory {submit!r}: {err}") from None
    return code_dir


def sm_environment(contract: TrainingContract) -> dict[str, str]:
    """The toolkit's SM_* variables (SM_MODEL_DIR, SM_CHANNEL_TRAIN, SM_HPS, ...) for this job."""
    from sagemaker_training import environment

    variables = environment.Environment().to_env_vars()
    variables.update(
        {"SM_MODEL_DIR": str(contract.paths.model_dir), "SM_OUTPUT_DATA_DIR": str(contract.paths.output_data_dir)}
    )
    for name, channel in contract.channels.items():
        variables[f"SM_CHANNEL_{name.upper()}"] = str(channel.path)
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in variables.items()}


def run_script(
    contract: TrainingContract, settings: LaunchSettings, before_launch: Callable[[], None] = lambda: None
) -> tuple[int, str | None]:
    """Script mode, whole: each rank's settings checked, the code prepared, then (after `before_launch`:
    `byoc train`'s last look for a SIGTERM) the script launched on the plan byoc's own job gets.
    Returns the launch's exit code and failure message."""
    RankSettings.from_env()  # what each rank reads: checked before any launch
    command = prepare_script(contract, settings)
    before_launch()
    return launch(plan_launch(contract, settings), contract, command, settings)


def prepare_script(contract: TrainingContract, settings: LaunchSettings) -> list[str]:
    """Fetch the code, install its requirements, export SM_*; return the command each rank runs."""
    program = str(decode(contract.hyperparameters["sagemaker_program"]))
    code_dir = fetch_code(contract)
    script = code_dir / program
    if not script.is_file():
        found = ", ".join(sorted(p.name for p in code_dir.iterdir())[:10]) if code_dir.is_dir() else "nothing"
        raise ScriptError(
            f"the entry point {program!r} is not in the source directory {code_dir} (found: {found}): "
            "check entry_point and source_dir"
        )
    try:
        install_requirements(code_dir)
    except RequirementsError as err:
        raise ScriptError(f"pip could not install {err.requirements.name} from source_dir: {err}") from None
    for folder in (contract.paths.model_dir, contract.paths.output_data_dir):  # SageMaker creates them too
        folder.mkdir(parents=True, exist_ok=True)
    # The ranks get this process's environment (byoc.launch.launcher): the toolkit's variables go there.
    os.environ.update(sm_environment(contract))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code_dir), settings.python_path]))
    os.chdir(code_dir)  # the toolkit runs scripts from their folder
    args = user_arguments(contract.hyperparameters)
    logger.info("script mode: running %s %s", program, " ".join(mask_secrets(args)))
    if script.suffix == ".py":
        command = [sys.executable, "-u", str(script), *args]
    elif script.suffix == ".sh":
        command = [shutil.which("bash") or "/bin/sh", str(script), *args]
    else:
        command = [str(script), *args]
    return [sys.executable, "-m", "byoc.launch.script_rank", *command]  # masks its output, quotes its last error
