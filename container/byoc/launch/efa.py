"""Elastic Fabric Adapter: the transport NCCL (GPUs) and the Neuron collectives use between hosts.

byoc starts its own ranks, so it does what the DLCs' training toolkit does for them on EFA
instances (ml.p4d, ml.p5, ml.p5e, ml.trn1.32xlarge...): `FI_PROVIDER=efa`, and
`FI_EFA_USE_DEVICE_RDMA=1` where the device reads remote memory itself. The toolkit decides from a
list of instance types, which missed ml.p5e (those jobs fell back to TCP and hung at NCCL start-up);
byoc decides from the device being there:

- an EFA device is a network device of Amazon's PCI vendor (0x1d0f) under
  /sys/class/infiniband, or, where sysfs shows none, an RDMA device node /dev/infiniband/uverbs*
  that libfabric's `fi_info -p efa` confirms;
- RDMA read: every EFA generation after the first (PCI device 0xefa0, p3dn-era) has it; libfabric
  itself leaves it off on 0xefa1 devices (p4d, trn1) unless told, which is why the toolkit sets it.
  Where only the device node is known, the variable is left to libfabric.

A variable the user set wins, always.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

AMAZON_PCI_VENDOR = "0x1d0f"
FIRST_GENERATION = "0xefa0"  # no RDMA read
EFA_VARIABLES = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA")  # what efa_environment may set (the user's win)


@dataclass(frozen=True)
class EfaDevices:
    names: tuple[str, ...]  # sysfs names (efa_0, rdmap16s27...), or uverbs nodes when sysfs is silent
    rdma_read: bool | None  # None: unknown, left to libfabric


def find_efa(root: Path = Path("/"), fi_info: str | None = None) -> EfaDevices | None:
    """The EFA devices of this host, or None. `root` and `fi_info` (a program path) are for tests."""
    found, rdma = [], []
    for device in sorted((root / "sys/class/infiniband").glob("*")):
        vendor = _read(device / "device/vendor")
        if vendor != AMAZON_PCI_VENDOR:
            continue
        found.append(device.name)
        rdma.append(_read(device / "device/device") not in (FIRST_GENERATION, None))
    if found:
        return EfaDevices(tuple(found), all(rdma))
    nodes = sorted(p.name for p in (root / "dev/infiniband").glob("uverbs*"))
    if nodes and _fi_info_lists_efa(fi_info if fi_info is not None else shutil.which("fi_info")):
        return EfaDevices(tuple(nodes), None)
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return None


def _fi_info_lists_efa(program: str | None) -> bool:
    if not program:
        return False
    try:
        return subprocess.run([program, "-p", "efa"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def efa_environment(environ: Mapping[str, str], devices: EfaDevices | None) -> dict[str, str]:
    """The libfabric variables for the ranks (what `environ`, the user's, already sets is kept)."""
    if devices is None:
        logger.info("no EFA device: the collectives between hosts use TCP sockets")
        return {}
    wanted = {"FI_PROVIDER": "efa"}
    if devices.rdma_read:
        wanted["FI_EFA_USE_DEVICE_RDMA"] = "1"
    out = {name: environ.get(name, value) for name, value in wanted.items()}
    rdma = {True: "with RDMA read", False: "without RDMA read", None: "RDMA left to libfabric"}[devices.rdma_read]
    mine = [f"{k}={v}" for k, v in out.items() if k in environ]
    logger.info(
        "EFA device(s) %s: the collectives between hosts use EFA (%s)%s",
        ", ".join(devices.names),
        rdma,
        f"; kept from the environment: {', '.join(mine)}" if mine else "",
    )
    return out
