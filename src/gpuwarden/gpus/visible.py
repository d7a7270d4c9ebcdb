"""Which GPUs a process sees, in CUDA's order: CUDA_VISIBLE_DEVICES read as CUDA reads
it (indices or UUID prefixes, stopping at the first entry that names no GPU), with
CUDA_DEVICE_ORDER=PCI_BUS_ID assumed, as gpuwarden always sets it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwarden.gpus.model import GpuFacts


def visible_gpus(gpus: Sequence[GpuFacts], env: Mapping[str, str], *,
                 ordinals: bool = False) -> list[GpuFacts]:
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
        if match is None or match in out:
            break
        out.append(match)
    return out
