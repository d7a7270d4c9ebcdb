"""gpuwarden's PyTorch memory cap, loaded as ``sitecustomize`` by every Python that
``gpuwarden exec`` starts (this directory leads PYTHONPATH).

It waits for ``torch`` to finish importing, then queues on torch's own lazy-init list a
call that caps every visible device at GPUWARDEN_MEM_LIMIT bytes with
``set_per_process_memory_fraction``: importing torch does not initialise CUDA, and
programs that never import torch are untouched. The next ``sitecustomize`` on the path
still runs. It imports nothing from gpuwarden and keeps to old syntax: the command may
run under any Python environment.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIMIT_ENV = "GPUWARDEN_MEM_LIMIT"
_TOTALS_ENV = "GPUWARDEN_MEM_TOTALS"
_REPORT_ENV = "GPUWARDEN_ALLOCATOR_REPORT"
# GPUWARDEN_MEM_LIMIT is what the allocator may hold on each device: the job's budget,
# which is what people declare with --mem. The CUDA context is outside it; the daemon
# books it beside the budget (sched/context.py), so the cap is the limit itself.


def _warn(message: str) -> None:
    sys.stderr.write("gpuwarden: warning: " + message + "\n")


def _limit() -> int | None:
    raw = os.environ.get(_LIMIT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        _warn(f"{_LIMIT_ENV}={raw!r} is not a byte count; memory cap not applied")
        return None
    return value if value > 0 else None


def _totals() -> list[int]:
    out = []
    for part in os.environ.get(_TOTALS_ENV, "").split(","):
        try:
            out.append(int(part))
        except ValueError:
            out.append(0)
    return out


def _cap_rules() -> Any:
    """The cap's arithmetic (gpuwarden_torch_cap.py, beside this file), loaded by its
    path: the job may have changed sys.path by the time torch initialises CUDA, and no
    module name of gpuwarden's enters the job's namespace."""
    path = os.path.join(_HERE, "gpuwarden_torch_cap.py")
    spec = importlib.util.spec_from_file_location("_gpuwarden_torch_cap", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cap_devices(cuda: Any, limit: int, totals: list[int]) -> list[float]:
    """Cap PyTorch's allocator at ``limit`` bytes on each visible device; runs inside
    torch's CUDA lazy init. The total is torch's own (what the allocator multiplies the
    fraction by), else the one gpuwarden read from NVML. Returns the fractions set."""
    rules, fractions = _cap_rules(), []
    for device in range(int(cuda.device_count())):
        try:
            total = int(cuda.get_device_properties(device).total_memory)
        except Exception:
            total = totals[device] if device < len(totals) else 0
        if total <= 0:
            _warn(f"total memory of device {device} unknown; not capped")
            continue
        fraction = rules.memory_fraction(limit, total)
        cuda.set_per_process_memory_fraction(fraction, device)
        fractions.append(fraction)
    return fractions


def report_allocator(cuda: Any, path: str) -> None:
    """At exit: the allocator's peak per visible device, written to the file the daemon
    made for it, so the daemon can measure the CUDA context (the driver's figure for the
    process less what the allocator held)."""
    try:
        if not cuda.is_initialized():
            return
        peaks = [int(cuda.max_memory_reserved(d)) for d in range(int(cuda.device_count()))]
        with open(path, "w") as f:
            f.write('{"max_reserved": [' + ", ".join(str(p) for p in peaks) + "]}\n")
    except Exception:
        pass  # a missing report costs one measurement, never the job


def _install(torch: Any) -> None:
    """Register the cap with torch (after ``import torch`` completed)."""
    limit = _limit()
    if limit is None:
        return
    totals = _totals()
    cuda = getattr(torch, "cuda", None)
    lazy_call = getattr(cuda, "_lazy_call", None)
    if lazy_call is None:
        _warn("this torch has no torch.cuda._lazy_call; memory cap not applied")
        return

    def cap() -> None:
        # An exception here would surface as the program's first CUDA call failing;
        # a missing cap is the smaller harm, so say so and carry on.
        try:
            cap_devices(cuda, limit, totals)
        except Exception as e:
            _warn(f"memory cap not applied: {type(e).__name__}: {e}")

    lazy_call(cap)
    report = os.environ.get(_REPORT_ENV, "").strip()
    if report:
        import atexit

        atexit.register(report_allocator, cuda, report)


class TorchWatcher:
    """A meta-path finder that lets the normal finders locate ``torch`` and wraps its
    loader so that ``_install`` runs once torch's ``__init__`` has finished."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        original = getattr(loader, "exec_module", None)
        if spec is None or loader is None or original is None:
            return spec

        def exec_module(module: Any) -> None:
            original(module)  # torch imported in full (or raised: then no cap, no harm)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                _install(module)
            except Exception as e:
                _warn(f"memory cap not applied: {type(e).__name__}: {e}")

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            return spec  # an immutable loader: import proceeds uncapped
        return spec


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, as site.py would have."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{err.__class__.__name__}: {err}\n"
        )


def _main() -> None:
    if _limit() is not None:
        if "torch" in sys.modules:
            _install(sys.modules["torch"])
        elif not any(isinstance(f, TorchWatcher) for f in sys.meta_path):
            sys.meta_path.insert(0, TorchWatcher())
    _chain()


_main()
