"""EFA detection from a fake device tree, and the variables the ranks of a multi-host job get."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from byoc.contract import Paths, TrainingContract
from byoc.launch import efa
from byoc.launch.launcher import plan_launch, worker_environment
from byoc.launch.settings import LaunchSettings


def device(root: Path, name: str, vendor: str, pci_device: str) -> None:
    folder = root / "sys/class/infiniband" / name / "device"
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(pci_device + "\n")


def uverbs(root: Path, n: int = 0) -> None:
    (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
    (root / "dev/infiniband" / f"uverbs{n}").touch()


def fake_fi_info(tmp_path: Path, exit_code: int) -> str:
    program = tmp_path / f"fi_info-{exit_code}"
    program.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    return str(program)


@pytest.mark.parametrize("pci_device, rdma", [("0xefa0", False), ("0xefa1", True), ("0xefa2", True), ("0xefa3", True)])
def test_an_amazon_rdma_device_is_efa_and_generations_after_the_first_read_remote_memory(tmp_path, pci_device, rdma):
    device(tmp_path, "rdmap16s27", "0x1d0f", pci_device)
    device(tmp_path, "rdmap32s27", "0x1d0f", pci_device)
    found = efa.find_efa(tmp_path, fi_info="")
    assert found == efa.EfaDevices(("rdmap16s27", "rdmap32s27"), rdma)
    env = efa.efa_environment({}, found)
    assert env == ({"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"} if rdma else {"FI_PROVIDER": "efa"})


def test_other_rdma_devices_and_no_devices_are_not_efa(tmp_path):
    assert efa.find_efa(tmp_path, fi_info="") is None
    device(tmp_path, "mlx5_0", "0x15b3", "0x101b")  # a Mellanox InfiniBand card: not EFA
    uverbs(tmp_path)
    assert efa.find_efa(tmp_path, fi_info=fake_fi_info(tmp_path, 1)) is None  # and libfabric says no efa
    assert efa.efa_environment({}, None) == {}


def test_a_device_node_alone_counts_when_libfabric_lists_efa_and_leaves_rdma_to_it(tmp_path):
    uverbs(tmp_path)
    assert efa.find_efa(tmp_path, fi_info="") is None  # no fi_info installed: nothing to confirm it
    assert efa.find_efa(tmp_path, fi_info=fake_fi_info(tmp_path, 1)) is None
    found = efa.find_efa(tmp_path, fi_info=fake_fi_info(tmp_path, 0))
    assert found == efa.EfaDevices(("uverbs0",), None)
    assert efa.efa_environment({}, found) == {"FI_PROVIDER": "efa"}


def test_what_the_user_set_wins(tmp_path):
    found = efa.EfaDevices(("efa_0",), True)
    env = efa.efa_environment({"FI_EFA_USE_DEVICE_RDMA": "0", "FI_PROVIDER": "efa"}, found)
    assert env == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "0"}


def _contract(hosts: list[str]) -> TrainingContract:
    return TrainingContract(
        paths=Paths(Path("/tmp/x")),
        hyperparameters={},
        channels={},
        current_host="algo-1",
        hosts=hosts,
        network_interface_name="eth0",
    )


def test_only_multi_host_gpu_and_neuron_jobs_get_efa_variables(caplog):
    found = efa.EfaDevices(("rdmap16s27",), True)
    two_gpu_hosts = plan_launch(_contract(["algo-1", "algo-2"]), LaunchSettings(), cpu_count=96, counts=(8, 0))
    caplog.set_level("INFO", logger="byoc.launch.efa")
    env = worker_environment(two_gpu_hosts, "algo-1", Path("/tmp/f"), found)
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"], env["NCCL_SOCKET_IFNAME"]) == ("efa", "1", "eth0")
    assert "EFA device(s) rdmap16s27: the collectives between hosts use EFA (with RDMA read)" in caplog.text
    trn = plan_launch(_contract(["algo-1", "algo-2"]), LaunchSettings(), cpu_count=128, counts=(0, 32))
    assert worker_environment(trn, "algo-1", Path("/tmp/f"), found)["FI_PROVIDER"] == "efa"
    one_host = plan_launch(_contract(["algo-1"]), LaunchSettings(), cpu_count=96, counts=(8, 0))
    assert "FI_PROVIDER" not in worker_environment(one_host, "algo-1", Path("/tmp/f"), found)
    cpu_hosts = plan_launch(_contract(["algo-1", "algo-2"]), LaunchSettings(), cpu_count=4, counts=(0, 0))
    assert "FI_PROVIDER" not in worker_environment(cpu_hosts, "algo-1", Path("/tmp/f"), found)
    caplog.clear()
    assert "FI_PROVIDER" not in worker_environment(two_gpu_hosts, "algo-1", Path("/tmp/f"), None)
    assert "no EFA device: the collectives between hosts use TCP sockets" in caplog.text
