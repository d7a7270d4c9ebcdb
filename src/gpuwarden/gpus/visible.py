"""Which GPUs a process sees, in CUDA's order: CUDA_VISIBLE_DEVICES read as CUDA reads
it (indices or UUID prefixes, stopping at the first entry that names no GPU), with
CUDA_DEVICE_ORDER=PCI_BUS_ID assumed, as gpuwarden always sets it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpuwarden.gpus.model import GpuFacts, MigInstanceFacts


def mig_device(g: GpuFacts, m: MigInstanceFacts) -> GpuFacts:
    """A MIG instance as the device CUDA shows: its own UUID and memory, numbered by
    the GPU it is carved from."""
    return replace(
        g,
        uuid=m.uuid,
        memory_total=m.memory_total,
        memory_used=m.memory_used,
        memory_free=m.memory_free,
        memory_reserved=None,
        mig_instances=(),
    )


def devices(gpus: Sequence[GpuFacts]) -> list[GpuFacts]:
    """Every device a process can be given: each GPU, and each MIG instance of one."""
    return [*gpus, *(mig_device(g, m) for g in gpus for m in g.mig_instances)]


def visible_gpus(
    gpus: Sequence[GpuFacts], env: Mapping[str, str], *, ordinals: bool = False
) -> list[GpuFacts]:
    """The GPUs CUDA would show this process, in CUDA_VISIBLE_DEVICES order. With
    ``ordinals``, a number is a position in ``gpus`` (an MPS client's view: its server's
    GPUs numbered from 0), else a GPU index."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(gpus)
    out: list[GpuFacts] = []
    for item in (s.strip() for s in spec.split(",")):
        match = None
        if item.isdigit() and ordinals:
            match = gpus[int(item)] if int(item) < len(gpus) else None
        elif item.isdigit():
            match = next((g for g in gpus if g.index == int(item)), None)
        elif item.startswith("GPU-"):
            match = next((g for g in gpus if g.uuid.startswith(item)), None)
        elif item.startswith("MIG-"):
            match = next(
                (
                    mig_device(g, m)
                    for g in gpus
                    for m in g.mig_instances
                    if m.uuid.startswith(item)
                ),
                None,
            )
        if match is None or match in out:
            break
        out.append(match)
    # A GPU in MIG mode runs CUDA work only in an instance: named bare, CUDA takes its
    # first one.
    return [mig_device(g, g.mig_instances[0]) if g.mig_instances else g for g in out]
