"""What to ask Ray for, so that Ray's own packing respects GPU memory (pure, no ray).

Ray schedules GPUs as fractions and knows nothing of memory. gpuwarden asks for two
things per job: the GPU fraction its memory budget represents on the cluster's smallest
GPU (so no GPU of any node gets more budgets than it has memory), and the custom
resource ``gpuwarden_mem_mib`` — the budget itself, which each node advertises as the
sum of its GPUs' memory (``gpuwarden cluster resources`` prints the flag)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuwarden.errors import UsageError
from gpuwarden.units import MiB, format_bytes

MEM_RESOURCE = "gpuwarden_mem_mib"  # a node's GPU memory, in MiB; a job's budget
GPU_MIB_RESOURCE = "gpuwarden_gpu_mib"  # a node's smallest GPU, in MiB (a label as a resource)


@dataclass(frozen=True)
class RayAsk:
    """Ray scheduling options for one job or task."""

    num_gpus: float
    resources: dict[str, float]
    budget: int  # bytes per GPU
    gpu_memory: int  # bytes: the GPU size the fraction was taken of

    def describe(self) -> str:
        return (
            f"{self.num_gpus:g} GPU ({format_bytes(self.budget)} of a "
            f"{format_bytes(self.gpu_memory)} GPU) + {self.resources[MEM_RESOURCE]:g} "
            f"{MEM_RESOURCE}"
        )


def ask(mem: int, gpus: int, gpu_memory: int) -> RayAsk:
    """Ray's options for ``gpus`` GPUs with ``mem`` bytes on each, on a cluster whose
    smallest GPU has ``gpu_memory`` bytes. The fraction is rounded down to Ray's
    precision (1/10,000), so that three thirds fit one GPU; the most that can lose is
    0.01% of a GPU per job."""
    if gpus < 1:
        raise UsageError("a job needs at least one GPU")
    if mem <= 0:
        raise UsageError("the memory budget must be more than 0")
    if mem > gpu_memory:
        raise UsageError(
            f"{format_bytes(mem)} per GPU is more than the smallest GPU of the "
            f"cluster has ({format_bytes(gpu_memory)})"
        )
    share = max(1, mem * 10_000 // gpu_memory) / 10_000
    num_gpus = float(gpus) if gpus > 1 else share  # Ray: fractions only below one GPU
    return RayAsk(
        num_gpus=num_gpus,
        resources={MEM_RESOURCE: float(-(-mem // MiB) * gpus)},
        budget=mem,
        gpu_memory=gpu_memory,
    )


def node_resources(gpu_totals: Sequence[int]) -> dict[str, float]:
    """What a node advertises (``ray start --resources``): its GPUs' memory in MiB and
    the size of its smallest GPU."""
    if not gpu_totals:
        return {}
    return {
        MEM_RESOURCE: float(sum(t // MiB for t in gpu_totals)),
        GPU_MIB_RESOURCE: float(min(gpu_totals) // MiB),
    }


def smallest_gpu(nodes: Iterable[Mapping[str, float]]) -> int:
    """The smallest GPU (bytes) over nodes' resource totals; nodes that advertise no
    gpuwarden resources are skipped. UsageError when none does."""
    sizes = [
        int(r[GPU_MIB_RESOURCE]) * MiB for r in nodes if r.get(GPU_MIB_RESOURCE) and r.get("GPU")
    ]
    if not sizes:
        raise UsageError(
            "no Ray node advertises its GPU memory: start each node with "
            '`ray start ... --resources "$(gpuwarden cluster resources)"`'
        )
    return min(sizes)


def resources_flag(gpu_totals: Sequence[int]) -> str:
    return json.dumps({k: int(v) for k, v in node_resources(gpu_totals).items()})
