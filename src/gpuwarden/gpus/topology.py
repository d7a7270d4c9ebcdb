"""CPU lists and NUMA locality from sysfs: where a GPU's nearest CPUs are."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from gpuwarden.errors import UsageError


@lru_cache(maxsize=256)
def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel cpulist such as ``0-23,48-71`` or ``3`` (empty -> empty set)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo > hi or lo < 0:
                    raise ValueError
                cpus.update(range(lo, hi + 1))
            else:
                n = int(part)
                if n < 0:
                    raise ValueError
                cpus.add(n)
        except ValueError:
            raise UsageError(f"invalid CPU list {text!r}") from None
    return frozenset(cpus)


def format_cpulist(cpus: set[int] | frozenset[int] | list[int]) -> str:
    """Render CPUs as a compact kernel cpulist (``0-3,8``)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _pci_sysfs_dir(pci_bus_id: str) -> Path:
    # NVML gives "00000000:17:00.0"; sysfs uses a 4-digit domain: "0000:17:00.0".
    bus = pci_bus_id.lower()
    if len(bus.split(":")[0]) == 8:
        bus = bus[4:]
    return Path("/sys/bus/pci/devices") / bus


def sysfs_numa_node(pci_bus_id: str | None) -> int | None:
    """NUMA node of a PCI device from sysfs; None when unknown (-1 means no NUMA)."""
    if not pci_bus_id:
        return None
    try:
        node = int((_pci_sysfs_dir(pci_bus_id) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def sysfs_local_cpulist(pci_bus_id: str | None) -> str | None:
    """The device's NUMA-local CPUs from sysfs ``local_cpulist``; None when unknown."""
    if not pci_bus_id:
        return None
    try:
        text = (_pci_sysfs_dir(pci_bus_id) / "local_cpulist").read_text().strip()
    except OSError:
        return None
    return text or None


def node_cpulist(node: int) -> str | None:
    """CPUs of a NUMA node from sysfs; None when the node is unknown."""
    try:
        return Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip() or None
    except OSError:
        return None
