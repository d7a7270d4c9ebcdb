"""gpuwarden on Ray: memory-budgeted GPU jobs and tasks across machines.

    @gpuwarden.ray.remote(mem="8G")
    def embed(batch): ...
    ray.get(embed.remote(batch))

Ray places the task by the GPU share its budget represents (and the ``gpuwarden_mem_mib``
resource nodes advertise); in the worker, gpuwarden sets the job environment
(GPUWARDEN_BUDGET, GPUWARDEN_MEM_LIMIT) and, when torch is there, caps PyTorch's
allocator at the budget less the CUDA context. Jobs (``gpuwarden submit --cluster ray``)
go through ``gpuwarden.ray.submit`` and run under ``gpuwarden.ray.entry``. Importing this
module does not import ray."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from gpuwarden.ray.shares import ask, smallest_gpu
from gpuwarden.units import parse_size


def _cap_here(mem: int) -> float | None:
    """In a Ray worker: the job environment for the budget, and PyTorch's allocator
    capped at it (its CUDA context allowed for). Returns the fraction set, if any."""
    from gpuwarden.guard.memory import allocator_limit

    os.environ.update(GPUWARDEN_BUDGET=str(mem), GPUWARDEN_MEM_LIMIT=str(mem),
                      CUDA_DEVICE_ORDER="PCI_BUS_ID")
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    allowed = allocator_limit(mem)
    fraction = None
    for dev in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(dev).total_memory
        fraction = min(1.0, allowed / total)
        torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return fraction


def _run_guarded(fn: Callable[..., Any], mem: int, *args: Any, **kwargs: Any) -> Any:
    _cap_here(mem)
    return fn(*args, **kwargs)


class GuardedRemote:
    """What ``@gpuwarden.ray.remote`` makes: ``.remote(...)`` like a Ray remote
    function, with Ray's options computed from the budget on first use (the cluster's
    smallest GPU decides the fraction)."""

    def __init__(self, fn: Callable[..., Any], mem: int, gpus: int,
                 options: dict[str, Any]) -> None:
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "task")
        self.fn = fn
        self.mem = mem
        self.gpus = gpus
        self.options = options
        self._remote: Any = None
        self.ask: Any = None

    def _build(self) -> Any:
        if self._remote is None:
            import ray

            nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
            self.ask = ask(self.mem, self.gpus, smallest_gpu(nodes))
            resources = {**self.options.pop("resources", {}), **self.ask.resources}
            self._remote = ray.remote(num_gpus=self.ask.num_gpus, resources=resources,
                                      **self.options)(_run_guarded)
        return self._remote

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._build().remote(self.fn, self.mem, *args, **kwargs)


def remote(mem: int | str, gpus: int = 1, **options: Any) -> Callable[[Callable[..., Any]],
                                                                       GuardedRemote]:
    """A Ray remote function with a GPU memory budget per GPU (bytes or "8G"); other
    Ray options (``max_retries``, ``num_cpus``, ...) pass through."""
    budget = parse_size(mem)

    def wrap(fn: Callable[..., Any]) -> GuardedRemote:
        return GuardedRemote(fn, budget, gpus, options)

    return wrap


__all__ = ["GuardedRemote", "remote"]
