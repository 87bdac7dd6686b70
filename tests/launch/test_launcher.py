"""The launch plan: processes per host, threads per rank, hosts, interfaces, failures."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from byoc.contract import Paths, TrainingContract
from byoc.launch import efa
from byoc.launch.devices import count_core_list
from byoc.launch.launcher import (
    LaunchError,
    describe_failure,
    forgive_exits_after_finishing,
    launch,
    plan_launch,
    wait_for_hosts,
    worker_environment,
)
from byoc.launch.settings import LaunchSettings


def contract(hosts=("algo-1",), current="algo-1", interface="eth0") -> TrainingContract:
    return TrainingContract(
        paths=Paths(Path("/tmp/x")),
        hyperparameters={},
        channels={},
        current_host=current,
        hosts=list(hosts),
        network_interface_name=interface,
    )


def test_one_process_per_gpu_with_nccl():
    plan = plan_launch(contract(), LaunchSettings(), cpu_count=48, counts=(8, 0))
    assert (plan.nproc_per_node, plan.device, plan.backend, plan.world_size) == (8, "cuda", "nccl", 8)
    assert plan.threads_per_process == 6


def test_one_process_per_neuron_core_with_xla():
    plan = plan_launch(contract(), LaunchSettings(), cpu_count=8, counts=(0, 2))
    assert (plan.nproc_per_node, plan.device, plan.backend) == (2, "neuron", "xla")


def test_cpu_runs_one_process_unless_asked_and_splits_the_cores():
    assert plan_launch(contract(), LaunchSettings(), cpu_count=2, counts=(0, 0)).world_size == 1
    plan = plan_launch(contract(), LaunchSettings(processes_per_host=4), cpu_count=8, counts=(0, 0))
    assert (plan.nproc_per_node, plan.backend, plan.threads_per_process) == (4, "gloo", 2)
    env = worker_environment(plan, "algo-1", Path("/tmp/f"))
    assert env["OMP_NUM_THREADS"] == "2" and env["BYOC_BACKEND"] == "gloo"
    assert "GLOO_SOCKET_IFNAME" not in env  # one host: no interface to pick


def test_several_hosts_from_the_resource_config():
    plan = plan_launch(
        contract(hosts=["algo-1", "algo-2", "algo-3"], current="algo-2"),
        LaunchSettings(master_port=7777),
        cpu_count=8,
        counts=(4, 0),
    )
    assert (plan.nnodes, plan.node_rank, plan.master_addr, plan.master_port, plan.world_size) == (
        3,
        1,
        "algo-1",
        7777,
        12,
    )
    env = worker_environment(plan, "algo-2", Path("/tmp/f"))
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"BYOC_PROCESSES_PER_HOST": "many"}, "BYOC_PROCESSES_PER_HOST='many': must be a whole number of at least 0"),
        ({"BYOC_PROCESSES_PER_HOST": "16"}, "has only 8 GPUs"),
        ({"BYOC_HOSTS_TIMEOUT": "0"}, "must be a number of at least 1"),
    ],
)
def test_bad_launcher_settings_say_what_to_change(environ, message):
    with pytest.raises(LaunchError, match=message):
        plan_launch(contract(), LaunchSettings.from_env(environ), cpu_count=8, counts=(8, 0))


def test_the_users_network_variables_win_for_the_ranks():
    settings = LaunchSettings.from_env({"NCCL_SOCKET_IFNAME": "ens5", "FI_PROVIDER": "tcp", "HOME": "/root"})
    assert settings.network == {"NCCL_SOCKET_IFNAME": "ens5", "FI_PROVIDER": "tcp"}
    plan = plan_launch(contract(hosts=["algo-1", "algo-2"]), settings, cpu_count=8, counts=(4, 0))
    env = worker_environment(plan, "algo-1", Path("/tmp/f"), efa.EfaDevices(("efa_0",), True), settings.network)
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"], env["FI_PROVIDER"]) == ("ens5", "eth0", "tcp")


def test_neuron_core_lists_count_as_the_runtime_reads_them():
    assert count_core_list("0-3,8") == 5
    assert count_core_list("2") == 1


def test_waits_for_host_names_then_gives_up_naming_them():
    attempts = {"algo-2": 0}

    def resolve(host):
        if host == "algo-2":
            attempts[host] += 1
            if attempts[host] < 3:
                raise OSError("not yet")
        if host == "algo-3":
            raise OSError("never")
        return "10.0.0.1"

    wait_for_hosts(["algo-1", "algo-2"], timeout=5, resolve=resolve, interval=0.01)
    assert attempts["algo-2"] == 3
    with pytest.raises(LaunchError, match=r"host\(s\) algo-3 did not resolve within 0.05 s"):
        wait_for_hosts(["algo-1", "algo-3"], timeout=0.05, resolve=resolve, interval=0.01)


def test_the_first_real_failure_is_reported_not_the_peers_that_lost_it():
    failures = {
        0: SimpleNamespace(exitcode=1, timestamp=100, local_rank=0),
        1: SimpleNamespace(exitcode=-signal.SIGKILL, timestamp=101, local_rank=1),
    }
    records = {
        0: {
            "rank": 0,
            "host": "algo-1",
            "exit_code": 1,
            "time": 99.0,
            "message": "unexpected error: RuntimeError: Connection closed by peer",
        }
    }
    message, code = describe_failure(failures, records, "algo-1")
    assert (message, code) == (
        "rank 1 on algo-1 failed: the process was killed by SIGKILL (out of memory, or killed from outside)",
        137,
    )
    records[1] = {"rank": 1, "host": "algo-1", "exit_code": 1, "time": 100.5, "message": "DataError: bad"}
    assert describe_failure(failures, records, "algo-1") == ("rank 1 on algo-1 failed: DataError: bad", 1)


def test_a_rank_that_fails_as_it_exits_after_every_rank_finished_does_not_fail_the_job(caplog):
    aborted = {1: SimpleNamespace(exitcode=-signal.SIGABRT, timestamp=100, local_rank=1)}
    assert forgive_exits_after_finishing(aborted, {}, finished={0, 1}, ranks={0, 1}, host="algo-1")
    said = "rank 1 on algo-1 finished its work, then failed as its process exited (the process was killed by SIGABRT)"
    assert said in caplog.text
    # its wrapper's record (script mode) says the same failure: still forgiven
    record = {"rank": 1, "host": "algo-1", "exit_code": 134, "time": 100.0}
    record["message"] = "the process was killed by SIGABRT"
    assert forgive_exits_after_finishing(aborted, {1: record}, finished={0, 1}, ranks={0, 1}, host="algo-1")


def test_a_rank_that_had_not_finished_keeps_the_failure():
    aborted = {1: SimpleNamespace(exitcode=-signal.SIGABRT, timestamp=100, local_rank=1)}
    assert not forgive_exits_after_finishing(aborted, {}, finished={0}, ranks={0, 1}, host="algo-1")  # 1 never finished
    assert not forgive_exits_after_finishing(aborted, {}, finished={1}, ranks={0, 1}, host="algo-1")  # 0 stopped midway
    # a second host's ranks are numbered after the first's: its own must all have finished
    assert forgive_exits_after_finishing({3: aborted[1]}, {}, finished={2, 3}, ranks={2, 3}, host="algo-2")
    assert not forgive_exits_after_finishing({}, {}, finished={0, 1}, ranks={0, 1}, host="algo-1")  # nothing failed


def test_the_device_hyperparameter_picks_the_path():
    job = contract()
    assert plan_launch(job, LaunchSettings(), cpu_count=8, counts=(0, 2), device="auto").device == "neuron"
    assert plan_launch(job, LaunchSettings(), cpu_count=8, counts=(0, 2), device="cpu").device == "cpu"
    assert plan_launch(job, LaunchSettings(), cpu_count=8, counts=(2, 0), device="cpu").backend == "gloo"
    xla = plan_launch(job, LaunchSettings(), cpu_count=8, counts=(0, 0), device="xla")
    assert (xla.device, xla.backend, xla.nproc_per_node, xla.threads_per_process) == ("xla", "xla", 1, 8)
    with pytest.raises(LaunchError, match="no CUDA GPU"):
        plan_launch(job, LaunchSettings(), cpu_count=8, counts=(0, 0), device="cuda")
    with pytest.raises(LaunchError, match="no collectives between processes"):
        plan_launch(job, LaunchSettings(processes_per_host=2), cpu_count=8, counts=(0, 0), device="xla")


def test_control_collectives_stay_on_the_cpu_under_nccl(monkeypatch):
    """Under NCCL, byoc's per-step stop check goes over a gloo group with a CPU tensor: a CUDA
    all_reduce and .item() there would make the host wait for the GPU after every step."""
    import torch

    from byoc.launch import distributed

    calls = []
    control = object()
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t, op=None, group=None: calls.append((t, group)))
    monkeypatch.setattr(distributed._place, "control_group", control)
    assert distributed.any_rank(False) is False
    tensor, group = calls[0]
    assert tensor.device == torch.device("cpu") and group is control


@pytest.mark.integration  # real ranks in processes
def test_a_launch_leaves_none_of_its_folders_behind(tmp_path, monkeypatch):
    """Each launch made two folders in /tmp and kept them: a host (or a test run) gathered thousands."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plan = plan_launch(contract(), LaunchSettings(processes_per_host=2), cpu_count=2, counts=(0, 0))
    failing = [sys.executable, "-c", "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"]
    with mock.patch.dict(os.environ):  # the launch sets the ranks' environment in its own
        code, message = launch(plan, contract(), failing, LaunchSettings(processes_per_host=2))
        assert (code, message) == (3, "rank 1 on algo-1 failed: the process exited with code 3")
        assert launch(plan, contract(), [sys.executable, "-c", "pass"], LaunchSettings())[0] == 0
    assert not list(tmp_path.iterdir())
