"""The launcher: one training process per device on every host, through torch's elastic agent.

`byoc train` plans the launch from the contract (`plan_launch`): how many processes on this host
(GPUs, NeuronCores, or `BYOC_PROCESSES_PER_HOST` CPU processes), which host is the master, which
network interface the collectives use. One process on one host runs in-process (nothing to
launch); anything else goes through `torch.distributed.launcher` (what `torchrun` runs) with a
static rendezvous: hosts = nodes, index of `current_host` = node rank, first host = master.

The agent forwards SIGTERM to every rank and waits for them (they save a checkpoint); when a rank
fails it stops the others. Each rank leaves a one-line record of its failure in a folder the
launcher reads afterwards, so `output/failure` names the host, the rank and the first error, and
the job exits with that rank's real exit code.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from byoc import compat
from byoc.contract import TrainingContract
from byoc.errors import EXIT_STOPPED
from byoc.launch import efa
from byoc.launch.devices import device_counts
from byoc.launch.settings import (
    FAILURE_DIR_ENV,
    HOST_ENV,
    PROCESS_GROUP_BACKEND_ENV,
    LaunchError,
    LaunchSettings,
    RankSettings,
)
from byoc.safe_files import write_atomically

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchPlan:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    device: str  # cuda | neuron | xla (torch-xla on another PJRT device) | cpu
    backend: str  # nccl | xla | gloo
    threads_per_process: int
    network_interface: str | None
    hosts_timeout: float  # for the other hosts' names to resolve and for them to join
    shutdown_timeout: int  # after SIGTERM, how long ranks may take to save before SIGKILL

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def plan_launch(
    contract: TrainingContract,
    settings: LaunchSettings,
    cpu_count: int | None = None,
    counts: tuple[int, int] | None = None,
    device: str = "auto",
) -> LaunchPlan:
    """How to start this host's processes; `device` is the hyperparameter (auto, cpu, cuda, xla).
    `cpu_count`, `counts` (GPUs, NeuronCores) are for tests."""
    cpu_count = cpu_count or len(os.sched_getaffinity(0))
    gpus, cores = counts if counts is not None else device_counts(contract.instance_type, settings.neuron_cores)
    requested = settings.processes_per_host
    if device == "cuda" and not gpus:
        raise LaunchError("device=cuda but no CUDA GPU is visible: use a GPU instance or device=auto")
    if cores and device in ("auto", "xla"):
        device, backend, available = "neuron", "xla", cores
    elif gpus and device in ("auto", "cuda"):
        device, backend, available = "cuda", "nccl", gpus
    elif device == "xla":  # torch-xla without NeuronCores (PJRT_DEVICE, e.g. CPU): a trial of the Trainium path
        device, backend, available = "xla", "xla", 1
    else:
        device, backend, available = "cpu", "gloo", 1  # one process uses every core best
    if requested and device in ("cuda", "neuron") and requested > available:
        raise LaunchError(
            f"BYOC_PROCESSES_PER_HOST={requested} but this host has only {available} "
            f"{'GPUs' if device == 'cuda' else 'NeuronCores'}: use at most {available}, or unset it"
        )
    nproc = requested or available
    if device == "xla" and nproc > 1:
        raise LaunchError(
            f"BYOC_PROCESSES_PER_HOST={requested} with device=xla and no NeuronCores: torch-xla's "
            f"{settings.pjrt_device or 'CPU'} backend has no collectives between processes "
            "(pytorch/xla#9089), so its ranks could not share gradients. Run one process, or run on "
            "NeuronCores (one process per core)"
        )
    master_port = settings.master_port
    if not master_port:
        master_port = _free_port() if len(contract.hosts) == 1 else DEFAULT_PORT
    interface = contract.network_interface_name if len(contract.hosts) > 1 else None
    return LaunchPlan(
        nproc_per_node=nproc,
        nnodes=len(contract.hosts),
        node_rank=contract.hosts.index(contract.current_host),
        master_addr=contract.hosts[0] if len(contract.hosts) > 1 else "127.0.0.1",
        master_port=master_port,
        device=device,
        backend=backend,
        threads_per_process=max(1, cpu_count // nproc)
        if device in ("cpu", "xla")
        else max(1, min(8, cpu_count // nproc)),
        network_interface=interface,
        hosts_timeout=settings.hosts_timeout,
        shutdown_timeout=settings.shutdown_timeout,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_environment(
    plan: LaunchPlan,
    host: str,
    failure_dir: Path,
    efa_devices: efa.EfaDevices | None = None,
    network: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What every rank gets on top of the launcher's environment (the agent adds RANK & co.);
    `efa_devices`: what `efa.find_efa` found on a host of a multi-host GPU or Neuron job; `network`:
    the socket interface and libfabric variables the user set (`LaunchSettings.network`), which win."""
    network = network or {}
    env = {
        # Ranks on one host share its cores: oversubscribed OpenMP threads slow everything several-fold.
        "OMP_NUM_THREADS": str(plan.threads_per_process),
        "MKL_NUM_THREADS": str(plan.threads_per_process),
        PROCESS_GROUP_BACKEND_ENV: plan.backend,
        FAILURE_DIR_ENV: str(failure_dir),
        HOST_ENV: host,
    }
    if plan.network_interface:  # the collectives talk over SageMaker's interface, not docker0 or lo
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env[name] = network.get(name, plan.network_interface)
    if plan.nnodes > 1 and plan.device in ("cuda", "neuron"):
        env.update(efa.efa_environment(network, efa_devices))
    return env


def wait_for_hosts(
    hosts: list[str], timeout: float, resolve: Callable[[str], str] = socket.gethostbyname, interval: float = 1.0
) -> None:
    """Wait until every host name resolves (SageMaker's DNS can lag behind the container start)."""
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending:
        for host in list(pending):
            try:
                resolve(host)
                pending.remove(host)
            except OSError:
                pass
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"host(s) {', '.join(pending)} did not resolve within {timeout:g} s, so the job cannot form: "
                "check the instances started (the other hosts' logs), or raise BYOC_HOSTS_TIMEOUT"
            )
        logger.info("waiting for host(s) %s to resolve", ", ".join(pending))
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Failure records: each rank writes one when it fails; the launcher reads the first.


def rank_failure_recorded(rank: RankSettings) -> bool:
    """Whether this rank has already left a failure record."""
    return rank.failure_dir is not None and (rank.failure_dir / f"rank-{rank.rank}.json").exists()


def write_rank_failure(rank: RankSettings, message: str, exit_code: int) -> None:
    """Called by a failing rank launched by `launch` (no-op otherwise: `rank.launched` is False)."""
    if rank.failure_dir is None:
        return
    record = {
        "rank": rank.rank,
        "host": rank.host,
        "message": message[:8192],  # the failure file keeps 1 KB of it
        "exit_code": exit_code,
        "time": time.time(),
    }
    write_atomically(rank.failure_dir / f"rank-{rank.rank}.json", json.dumps(record))


def write_rank_finished(rank: RankSettings) -> None:
    """Called by a rank whose job returned without error (`run_job`), as it exits: what it had to do
    is done (the model saved, the process group left). No-op outside a launched job."""
    if rank.failure_dir is None:
        return
    record = {"rank": rank.rank, "host": rank.host, "time": time.time()}
    write_atomically(rank.failure_dir / f"finished-{rank.rank}.json", json.dumps(record))


def _finished(failure_dir: Path) -> set[int]:
    """The ranks that wrote `write_rank_finished`'s record."""
    return {int(path.stem.split("-", 1)[1]) for path in failure_dir.glob("finished-*.json")}


def forgive_exits_after_finishing(
    failures: Mapping[int, object], records: dict[int, dict], finished: set[int], ranks: set[int], host: str
) -> bool:
    """Whether the ranks failed only as their processes exited, every rank of this host (`ranks`)
    having finished its work first: torch's collective library can abort a process during
    interpreter exit ("terminate called without an active exception", SIGABRT), after the rank left
    the process group. Such a job has done everything it had to (rank 0 saved the model before the
    ranks left together), so it succeeds, with a warning for each such rank, rather than reporting a
    failure it does not have. A rank that had not finished (stopped by the agent as it cleaned up
    after the failed one, say) keeps the failure."""
    failed = set(failures) | set(records)
    if not failed or not (failed | ranks) <= finished:
        return False
    for rank in sorted(failed):
        # script mode's wrapper records how the script's process ended; the agent saw only the wrapper's exit
        raw = getattr(failures.get(rank), "exitcode", 1)  # as describe_failure reads it
        how = records[rank]["message"] if rank in records else f"the process {describe_exit(raw)}"
        logger.warning(
            "rank %d on %s finished its work, then failed as its process exited (%s): a crash at interpreter "
            "exit, after the model was saved and the ranks had left the process group; the job succeeded",
            rank,
            records[rank]["host"] if rank in records else host,
            how,
        )
    return True


def _records(failure_dir: Path) -> dict[int, dict]:
    out = {}
    for path in failure_dir.glob("rank-*.json"):
        try:
            record = json.loads(path.read_text())
            out[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue
    return out


def exit_code_of(code: int) -> int:
    """A process killed by signal N (reported as -N) exits the container with 128+N, as a shell would."""
    return 128 - code if code < 0 else code


def describe_exit(code: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + (" (out of memory, or killed from outside)" if code == -signal.SIGKILL else "")
    return f"exited with code {code}"


_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed")


def describe_failure(failures: Mapping[int, object], records: dict[int, dict], host: str) -> tuple[str, int]:
    """(failure message, exit code) for the rank that failed first."""
    candidates = []
    for rank, failure in failures.items():
        record = records.get(rank)
        when = record["time"] if record else float(getattr(failure, "timestamp", 0) or 0)
        candidates.append((when, rank, failure, record))
    for rank, record in records.items():  # ranks that failed but were reaped as "stopped"
        if rank not in failures:
            candidates.append((record["time"], rank, None, record))
    # A rank whose peer died fails too ("connection closed"): the root cause is the other one.
    candidates.sort(key=lambda c: (_is_peer_loss(c[3]), c[0]))
    when, rank, failure, record = candidates[0]
    code = record["exit_code"] if record else exit_code_of(getattr(failure, "exitcode", 1))
    if record:
        detail = record["message"]
    else:
        raw = getattr(failure, "exitcode", 1)
        detail = f"the process {describe_exit(raw)}"
    where = record["host"] if record else host
    return f"rank {rank} on {where} failed: {detail}", code


def _is_peer_loss(record: dict | None) -> bool:
    return record is not None and any(s in record["message"].lower() for s in _PEER_LOST)


# ---------------------------------------------------------------------------------------------
# The launch


def launch(
    plan: LaunchPlan, contract: TrainingContract, command: list[str], settings: LaunchSettings
) -> tuple[int, str | None]:
    """Run `command` (a program and its arguments) as every rank of this host; wait for the job.

    Returns (exit code, failure message or None). SIGTERM to this process reaches every rank.
    """
    if plan.nnodes > 1:
        wait_for_hosts(contract.hosts, plan.hosts_timeout)
    # This launch's own folder, gone with it (a local host runs many jobs): the ranks' records are read by then.
    with tempfile.TemporaryDirectory(prefix="byoc-launch-", ignore_cleanup_errors=True) as scratch:
        return _run_ranks(plan, contract, command, settings, Path(scratch))


def _run_ranks(
    plan: LaunchPlan, contract: TrainingContract, command: list[str], settings: LaunchSettings, scratch: Path
) -> tuple[int, str | None]:
    """`launch` in its folder: the ranks' failure records in failures/, torch's logs in ranks/."""
    failure_dir, log_dir = scratch / "failures", scratch / "ranks"
    failure_dir.mkdir()
    # Only when launching: the plan (above) is pure and tested without torch.
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    devices = efa.find_efa() if plan.nnodes > 1 and plan.device in ("cuda", "neuron") else None
    # The elastic agent starts the ranks with this process's environment: theirs is set here.
    os.environ.update(worker_environment(plan, contract.current_host, failure_dir, devices, settings.network))
    config = compat.launch_config(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=contract.job_name,
        role=contract.current_host,
        rdzv_backend="static",
        rdzv_endpoint=f"{plan.master_addr}:{plan.master_port}",
        rdzv_configs={"rank": plan.node_rank, "timeout": int(plan.hosts_timeout)},
        log_line_prefix_template="[${role_name} rank ${rank}]:",  # on the lines copied from stderr
        max_restarts=0,  # a failed rank fails the job; spot restarts resume from checkpoints
        monitor_interval=0.5,
        start_method="spawn",
        # Nothing is copied to log_dir: a rank's own failure record says what went wrong (script
        # mode's ranks run under byoc.launch.script_rank, which keeps the script's last error in memory).
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), tee=Std.NONE),
        shutdown_timeout=plan.shutdown_timeout,
    )
    logger.info(
        "launching %d process(es) on host %d of %d (%s, backend %s, %d thread(s) each), master %s:%d",
        plan.nproc_per_node,
        plan.node_rank + 1,
        plan.nnodes,
        plan.device,
        plan.backend,
        plan.threads_per_process,
        plan.master_addr,
        plan.master_port,
    )
    program, *args = command
    try:
        with compat.shutdown_grace(plan.shutdown_timeout):
            elastic_launch(config, program)(*args)
        return 0, None
    except ChildFailedError as err:
        records = _records(failure_dir)
        host_ranks = set(range(plan.node_rank * plan.nproc_per_node, (plan.node_rank + 1) * plan.nproc_per_node))
        if forgive_exits_after_finishing(
            err.failures, records, _finished(failure_dir), host_ranks, contract.current_host
        ):
            return 0, None
        message, code = describe_failure(err.failures, records, contract.current_host)
        return code, message
    except SignalException as err:
        records = _records(failure_dir)
        interrupted = [r for r in records.values() if r["exit_code"] == EXIT_STOPPED]
        if interrupted:
            return EXIT_STOPPED, min(interrupted, key=lambda r: r["rank"])["message"]
        code = 128 + int(err.sigval)
        return code, f"stopped by {signal.Signals(err.sigval).name} before any rank could save a checkpoint"
    except Exception as err:  # rendezvous timeout, a master that never answers...
        text = " ".join(str(err).split()) or type(err).__name__
        if "timeout" in text.lower() or "timed out" in text.lower():
            raise LaunchError(
                f"the {plan.nnodes} hosts did not all join within {plan.hosts_timeout:g} s "
                f"(master {plan.master_addr}:{plan.master_port}): check the other hosts started and can reach "
                "this port, or raise BYOC_HOSTS_TIMEOUT"
            ) from None
        raise


def main_command() -> list[str]:
    """Each rank of the built-in job: `python -m byoc.cli worker`."""
    return [sys.executable, "-m", "byoc.cli", "worker"]
