"""The training job's entry points: `byoc train` on a host (`train`), one process of the job
(`run_job`: a launched rank, the only process, or `code/train.py`'s own `main`), and the failure
contract they share.

Every failure ends with a non-zero exit and a one-line `output/failure` saying what is wrong and
how to fix it (SageMaker shows its first 1024 characters as the job's FailureReason); the full
traceback of an unexpected error goes to the log, not the failure file.

Only light modules are imported at the top (no torch, no transformers), so that a SIGTERM handler is
in place before anything slow loads, and the serving image can say at once that it does not train.
"""

from __future__ import annotations

# Imported where used: `byoc train` on a host only launches the ranks and must not load torch or
# transformers, and the failure path must still work when a SIGTERM cut an import short.
import dataclasses
import inspect
import logging
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from byoc import __version__
from byoc.errors import EXIT_FAILURE, EXIT_STOPPED, UserError, describe
from byoc.logs import mask_hyperparameters
from byoc.training import stopping
from byoc.training.stopping import Stopped

if TYPE_CHECKING:  # imported where each entry point runs (see run_job and train)
    from byoc.launch.settings import LaunchSettings
    from byoc.training.settings import TrainingSettings

logger = logging.getLogger(__name__)


def failure_message(err: BaseException) -> str:
    """One line for output/failure: the user-facing message of known errors, where memory ran out
    (the batch-size advice only for a training step), a summary otherwise."""
    text = str(err) if isinstance(err, Stopped) else describe(err)
    return " ".join(text.split())  # write_failure cuts it to what SageMaker keeps


def train() -> int:
    """Run the training job on this host (launching its ranks if there are several); return the exit code."""
    from byoc.contract import Paths, read_training_contract  # light imports

    paths = Paths.from_env()
    _stop_before_training()  # before anything slow: from here on SIGTERM ends the job with its failure message
    try:
        _require_training_packages()
        from byoc.launch.launcher import launch, main_command, plan_launch
        from byoc.launch.script import is_script_mode, run_script
        from byoc.launch.settings import LaunchSettings
        from byoc.training.settings import TrainingSettings

        settings = LaunchSettings.from_env()  # read once; a bad value fails here, naming the variable
        contract = read_training_contract()
        paths = contract.paths
        logger.info(
            "byoc %s: training job %s on %s (%d host(s))",
            __version__,
            contract.job_name,
            contract.current_host,
            len(contract.hosts),
        )
        if is_script_mode(contract.hyperparameters):  # the user's script: launch's, whole
            # (raise_if_stopped: a SIGTERM a finalizer swallowed means do not launch)
            code, message = run_script(contract, settings, before_launch=stopping.raise_if_stopped)
        else:
            from byoc.training.hyperparameters import parse_hyperparameters

            shown = mask_hyperparameters(contract.hyperparameters)
            logger.info("hyperparameters: %s", " ".join(f"{name}={value}" for name, value in sorted(shown.items())))
            args = parse_hyperparameters(contract.hyperparameters)  # bad input fails here, before any launch
            job_settings = TrainingSettings.from_env()  # what each rank reads: checked before any launch
            if args.neuron_precompile and (wrapped := _precompile_command(settings)):
                code, message = _run_precompile(wrapped)
                return _finish(paths, code, message)
            plan = plan_launch(contract, settings, device=args.device)
            if plan.world_size == 1:  # nothing to launch: train in this process
                return run_job(settings=job_settings)
            stopping.raise_if_stopped()
            code, message = launch(plan, contract, main_command(), settings)
    except (Exception, Stopped) as err:  # every failure must reach output/failure, whatever raised it
        return _fail(paths, err)
    return _finish(paths, code, message)


class ServingOnly(UserError, RuntimeError):
    """`byoc train` where torch or transformers is missing: the serving image (Dockerfile.serve)."""


def _require_training_packages() -> None:
    """Stop at once, naming the images that train, where the training side is not installed."""
    import importlib.util

    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise ServingOnly(
            f"byoc train needs {' and '.join(missing)}, which this image does not have (the serving image, "
            "Dockerfile.serve, only serves): train with a full image, Dockerfile.gpu (`./build_and_push.sh gpu`) "
            "or Dockerfile.neuron (`./build_and_push.sh neuron`)"
        )


def _finish(paths, code: int, message: str | None) -> int:
    from byoc.contract import write_failure

    if code:
        logger.error("training failed: %s", message)
        write_failure(paths, message or f"training exited with code {code}")
        return code
    logger.info("training finished")
    return 0


def _precompile_command(settings: LaunchSettings) -> list[str] | None:
    from byoc.training import xla

    return xla.parallel_compile_command(
        [sys.executable, "-m", "byoc.cli", "train"], settings.precompiling, settings.neuron_cores
    )


def _run_precompile(command: list[str]) -> tuple[int, str | None]:
    """This job again, under neuron_parallel_compile. A SIGTERM ends both (a precompile run keeps no
    checkpoints: there is nothing to save)."""
    import subprocess

    from byoc.environment import child_environment
    from byoc.launch.settings import PRECOMPILING_ENV

    logger.info("precompiling with %s", " ".join(command))
    done = subprocess.run(command, env=child_environment({PRECOMPILING_ENV: "1"}))
    return (
        done.returncode,
        None if done.returncode == 0 else f"neuron_parallel_compile exited with code {done.returncode}",
    )


def _stop_before_training() -> None:
    """Until training takes over the signal (or the launcher forwards it), SIGTERM stops the job cleanly."""
    import signal

    def stop(signum, frame):
        stopping.stop("starting the job")

    stopping.guard_finalizers()
    signal.signal(signal.SIGTERM, stop)


def _choose_xla(contract, args, settings: TrainingSettings) -> bool:
    """Whether the job runs on XLA, decided once, before transformers loads (it imports torch-xla where
    installed): the XLA path's environment, or, off that path, the word that keeps transformers from
    moving the job to XLA. The settings carry the decision on (`use_xla`)."""
    from byoc.training import xla

    chosen = xla.wants_xla(args.device, settings)
    if chosen:
        xla.prepare_environment(contract.checkpoint_folder, settings.xla)
    else:
        xla.keep_off_xla()
    return chosen


def _fail(paths, err: BaseException) -> int:
    from byoc.contract import write_failure

    message = failure_message(err)
    if not _is_user_error(err):
        logger.error("%s", traceback.format_exc())
    logger.error("training failed: %s", message)
    write_failure(paths, message)
    return EXIT_STOPPED if isinstance(err, Stopped) else EXIT_FAILURE


def run_job(main: Callable[..., object] | None = None, settings: TrainingSettings | None = None) -> int:
    """Run a job's `main(contract, args, settings)` in this process with the failure contract; return
    the exit code. `main`: `code/train.py`'s own; by default byoc's job (`byoc.training.job.main`).

    This is how `byoc train` runs a one-process job and each launched rank, and how `code/train.py`
    runs its own steps. The device's environment is set before `main` runs, so `main` must import
    transformers (byoc.training.job) itself, after that: transformers reads it when it loads. A rank
    launched by `byoc train` leaves its failure for the launcher; a job on its own writes output/failure.
    `settings`: the job's (`byoc.training.settings.TrainingSettings`), else read from the environment
    here, once, and passed to `main` (a `main(contract, args)` of an older train.py gets none).
    """
    from byoc.contract import Paths
    from byoc.launch.launcher import write_rank_failure, write_rank_finished
    from byoc.training import tracking
    from byoc.training.settings import TrainingSettings

    paths = Paths.from_env()
    rank = None  # this process's place in the job, once its settings are read
    run = None  # the MLflow run, once started
    _stop_before_training()  # until training takes the signal over
    try:
        from byoc.contract import read_training_contract
        from byoc.training.hyperparameters import parse_hyperparameters

        settings = settings or TrainingSettings.from_env()
        rank = settings.rank
        contract = read_training_contract()
        paths = contract.paths
        args = parse_hyperparameters(contract.hyperparameters)
        use_xla = _choose_xla(contract, args, settings)
        stopping.raise_if_stopped()
        if main is None:
            from byoc.training import job  # after _choose_xla (above)

            main = cast(Callable[..., object], job.main)
        run = tracking.start(settings, contract, args)  # MLflow, where MLFLOW_TRACKING_URI is set (rank 0)
        settings = dataclasses.replace(settings, use_xla=use_xla, run=run)  # down to the job's steps
        result = main(contract, args, settings) if _takes_settings(main) else main(contract, args)
        tracking.finish(run, result)
    except (Exception, Stopped) as err:
        tracking.fail(run, failure_message(err))
        if rank is None or not rank.launched:
            return _fail(paths, err)
        message = failure_message(err)
        if not _is_user_error(err):
            logger.error("%s", traceback.format_exc())
        code = EXIT_STOPPED if isinstance(err, Stopped) else EXIT_FAILURE
        logger.error("rank failed: %s", message)
        write_rank_failure(rank, message, code)
        return code
    if not rank.launched:  # the launcher says it for its ranks
        logger.info("training finished")
    write_rank_finished(rank)  # a crash as the process exits, after this, does not fail the job
    return 0


def _takes_settings(main: Callable[..., object]) -> bool:
    """Whether `main` has room for a third argument, the settings (code/train.py's before they were
    passed down take two)."""
    try:
        signature = inspect.signature(main)
    except (TypeError, ValueError):  # a builtin or an odd callable: call it as the contract always did
        return False
    kinds = [p.kind for p in signature.parameters.values()]
    positional = sum(k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
    return positional >= 3 or inspect.Parameter.VAR_POSITIONAL in kinds


# Errors whose message already says what is wrong and how to fix it (no traceback needed).
def _is_user_error(err: BaseException) -> bool:
    """By class (byoc.errors): a renamed error keeps its user-facing message."""
    return isinstance(err, (UserError, Stopped))
