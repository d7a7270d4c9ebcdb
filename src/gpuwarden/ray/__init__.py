"""gpuwarden on Ray: memory-budgeted GPU jobs, tasks and actors across machines.

    @gpuwarden.ray.remote(mem="8G", oom_retries=2)
    def embed(batch): ...
    ray.get(embed.remote(batch))

    @gpuwarden.ray.remote(mem="20G")
    class Server: ...
    server = Server.remote()

Ray places the task or actor by the GPU share its budget represents (and the
``gpuwarden_mem_mib`` resource nodes advertise); in the worker, gpuwarden sets the job
environment (GPUWARDEN_BUDGET, GPUWARDEN_MEM_LIMIT) and, when torch is there, caps
PyTorch's allocator at the budget less the CUDA context. A task that runs out of GPU
memory is run again with a bigger budget (``sched.oom.after_oom``) when ``oom_retries``
allows: a placeholder task that holds no resources waits for each attempt. Jobs
(``gpuwarden submit --cluster ray``) go through ``gpuwarden.ray.submit`` and run under
``gpuwarden.ray.entry``. Importing this module does not import ray."""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from gpuwarden.errors import UsageError
from gpuwarden.ray.shares import RayAsk, ask, smallest_gpu
from gpuwarden.units import format_bytes, parse_size


def _cap_here(mem: int) -> float | None:
    """In a Ray worker: the job environment for the budget, and PyTorch's allocator
    capped at it (the CUDA context is outside the budget). Returns the fraction set, if
    any."""
    os.environ.update(
        GPUWARDEN_BUDGET=str(mem), GPUWARDEN_MEM_LIMIT=str(mem), CUDA_DEVICE_ORDER="PCI_BUS_ID"
    )
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    from gpuwarden.hooks.gpuwarden_torch_cap import memory_fraction

    fraction = None
    for dev in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(dev).total_memory
        fraction = memory_fraction(mem, total)
        torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return fraction


def _run_guarded(fn: Callable[..., Any], mem: int, *args: Any, **kwargs: Any) -> Any:
    _cap_here(mem)
    return fn(*args, **kwargs)


def _smallest_gpu() -> int:
    import ray

    return smallest_gpu(
        n["Resources"]
        for n in ray.nodes()  # type: ignore[no-untyped-call]
        if n.get("Alive")
    )


def _ray_options(
    mem: int, gpus: int, options: dict[str, Any], largest: int
) -> tuple[dict[str, Any], RayAsk]:
    """Ray's options for ``mem`` per GPU, the user's own (other resources too) kept."""
    req = ask(mem, gpus, largest)
    opts = dict(options)
    resources = {**opts.pop("resources", {}), **req.resources}
    return {**opts, "num_gpus": req.num_gpus, "resources": resources}, req


def _task(mem: int, gpus: int, options: dict[str, Any], largest: int) -> tuple[Any, RayAsk]:
    """``_run_guarded`` as a Ray remote function asking for ``mem`` per GPU."""
    import ray

    opts, req = _ray_options(mem, gpus, options, largest)
    return ray.remote(**opts)(_run_guarded), req


def _with_retries(
    fn: Callable[..., Any],
    mem: int,
    gpus: int,
    options: dict[str, Any],
    retries: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run in a placeholder task (no CPU, no GPU): each attempt is a task of its own
    with its budget, so the bigger budget of a retry is placed by Ray again."""
    import ray.exceptions

    from gpuwarden.sched.oom import GiveUp, after_oom, oom_signature

    largest = _smallest_gpu()
    attempt = 0
    while True:
        remote, _ = _task(mem, gpus, options, largest)
        try:
            return ray.get(remote.remote(fn, mem, *args, **kwargs))
        except ray.exceptions.RayTaskError as e:
            signature = oom_signature(str(e))
            if signature is None:
                raise
            decision = after_oom(
                old_budget=mem,
                peak=None,
                largest=largest,
                used=attempt,
                allowed=retries,
                backoff=0.0,
            )
            if isinstance(decision, GiveUp):
                raise
            print(
                f"gpuwarden: CUDA OOM at {format_bytes(mem)} ({signature}); retry "
                f"{attempt + 1} of {retries} with {format_bytes(decision.budget)}",
                file=sys.stderr,
                flush=True,
            )
            mem, attempt = decision.budget, attempt + 1


class GuardedRemote:
    """What ``@gpuwarden.ray.remote`` makes of a function: ``.remote(...)`` like a Ray
    remote function, with Ray's options computed from the budget on first use (the
    cluster's smallest GPU decides the fraction)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        mem: int,
        gpus: int,
        options: dict[str, Any],
        oom_retries: int = 0,
    ) -> None:
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "task")
        self.fn = fn
        self.mem = mem
        self.gpus = gpus
        self.options = options
        self.oom_retries = oom_retries
        self._remote: Any = None
        self._retrying: Any = None
        self.ask: RayAsk | None = None

    def _build(self) -> Any:
        if self._remote is None:
            self._remote, self.ask = _task(self.mem, self.gpus, self.options, _smallest_gpu())
        return self._remote

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if self.oom_retries == 0:
            return self._build().remote(self.fn, self.mem, *args, **kwargs)
        import ray

        self._build()  # refuses a budget that fits no GPU here, in the caller
        if self._retrying is None:
            self._retrying = ray.remote(num_cpus=0, max_retries=0)(_with_retries)
        return self._retrying.remote(
            self.fn, self.mem, self.gpus, self.options, self.oom_retries, args, kwargs
        )


class GuardedActor:
    """What ``@gpuwarden.ray.remote`` makes of a class: ``.remote(...)`` starts the actor
    where its budget fits, capped before its ``__init__`` runs. An actor keeps its state,
    so it is not restarted with a bigger budget: its OOM is the caller's to see."""

    def __init__(self, cls: type, mem: int, gpus: int, options: dict[str, Any]) -> None:
        self.__doc__ = cls.__doc__
        self.__name__ = cls.__name__
        self.cls = cls
        self.mem = mem
        self.gpus = gpus
        self.options = options
        self._remote: Any = None
        self.ask: RayAsk | None = None

    def _build(self) -> Any:
        if self._remote is None:
            import ray

            opts, self.ask = _ray_options(self.mem, self.gpus, self.options, _smallest_gpu())
            self._remote = ray.remote(**opts)(_guarded_class(self.cls, self.mem))
        return self._remote

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._build().remote(*args, **kwargs)


def _guarded_class(cls: type, mem: int) -> type:
    """``cls`` with the budget's cap set up before its own ``__init__``."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _cap_here(mem)
        cls.__init__(self, *args, **kwargs)  # type: ignore[misc]

    return type(
        cls.__name__,
        (cls,),
        {"__init__": __init__, "__qualname__": cls.__qualname__, "__module__": cls.__module__},
    )


def remote(
    mem: int | str, gpus: int = 1, *, oom_retries: int = 0, **options: Any
) -> Callable[[Any], Any]:
    """A Ray remote function or actor class with a GPU memory budget per GPU (bytes or
    "8G"). ``oom_retries``: times a task that runs out of GPU memory is run again with a
    bigger budget (functions only). Other Ray options (``max_retries``, ``num_cpus``,
    ...) pass through."""
    budget = parse_size(mem)
    if (
        isinstance(oom_retries, bool)
        or not isinstance(oom_retries, int)
        or not 0 <= oom_retries <= 100
    ):
        raise UsageError("oom_retries must be an integer from 0 to 100")

    def wrap(target: Any) -> GuardedRemote | GuardedActor:
        if inspect.isclass(target):
            if oom_retries:
                raise UsageError(
                    "oom_retries is for tasks: an actor keeps its state, so it "
                    "is not restarted with a bigger budget"
                )
            return GuardedActor(target, budget, gpus, options)
        return GuardedRemote(target, budget, gpus, options, oom_retries)

    return wrap


__all__ = ["GuardedActor", "GuardedRemote", "remote"]
