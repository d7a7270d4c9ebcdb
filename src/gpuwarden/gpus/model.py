"""Plain facts a backend reports: one GPU, one process the driver lists on it.

Unsupported fields are None, never an exception: a view must survive a GPU that
does not report its temperature."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

COMPUTE_MODES = ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")
MIG_PROFILE = re.compile(r"^([1-8])g\.([1-9][0-9]*)gb$")
"""A MIG GPU instance profile: slices and memory, e.g. 1g.10gb, 3g.40gb."""


@dataclass(frozen=True)
class MigInstanceFacts:
    """One MIG GPU instance (with its compute instance) of a GPU in MIG mode: a device
    of its own, with its own memory, its MIG- UUID and its own process list."""

    gpu_index: int  # the GPU it is carved from
    gi_id: int  # GPU instance id
    ci_id: int  # compute instance id
    profile: str  # e.g. "3g.40gb"
    uuid: str  # "MIG-..."
    memory_total: int
    memory_used: int
    memory_free: int


@dataclass(frozen=True)
class GpuFacts:
    """What the driver says about one GPU. Memory in bytes."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    memory_free: int
    memory_reserved: int | None = None
    utilization: int | None = None  # percent, 0-100
    memory_utilization: int | None = None
    temperature: int | None = None  # degrees C
    power_watts: float | None = None
    power_limit_watts: float | None = None
    compute_mode: str | None = "Default"
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    mps: bool | None = None  # an MPS server serves this GPU
    numa_node: int | None = None
    cpus: str | None = None  # cpulist, e.g. "0-23,48-71"
    pci_bus_id: str | None = None
    minor_number: int | None = None  # N in /dev/nvidiaN
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors
    retired_pages: int | None = None
    retired_pages_pending: bool | None = None
    driver_baseline: int = 0  # memory the driver charges with no context at all
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs linked by NVLink
    mig_instances: tuple[MigInstanceFacts, ...] = ()  # in MIG mode: its GPU instances


class GpuProcessFacts(NamedTuple):
    """A process the driver lists on a GPU (compute, graphics or MPS list merged). A
    NamedTuple, not a frozen dataclass: a snapshot makes one per GPU process, and a
    frozen dataclass's per-field setattr made them a tenth of the exporter's scrape.
    Immutable all the same; ``_replace`` makes a changed copy."""

    pid: int
    gpu_index: int
    memory: int | None  # bytes; None when the driver does not say
    kinds: tuple[str, ...] = ("compute",)  # subset of compute, graphics, mps
    sm_utilization: int | None = None  # percent over the last sample window
    mig_uuid: str | None = None  # the MIG instance whose process list names it
