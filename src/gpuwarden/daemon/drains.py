"""Draining GPUs (``gpu drain``): no new placement on a GPU while its running jobs
finish, as ``scontrol update state=drain`` does. These act on GPUs, not on jobs, so they
stand apart from the job operations (daemon/service.py), which hold them: admins drain
and undrain, and every local user may see which GPUs are drained."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.store import Store
from gpuwarden.errors import PermissionDenied, UsageError
from gpuwarden.jobs import model
from gpuwarden.sched.model import GpuState


@dataclass(frozen=True)
class GpuDrains:
    """The drain operations for one caller. ``is_admin`` is the daemon's admin check;
    ``gpus`` returns the GPU states of the last scheduling pass (the indices there are);
    ``wake`` nudges the scheduler loop."""

    store: Store
    is_admin: Callable[[Caller], bool]
    gpus: Callable[[], Sequence[GpuState]]
    wake: Callable[[], None]
    clock: Callable[[], float] = time.time

    def drain(self, caller: Caller, index: int, reason: Any) -> dict[str, Any]:
        """Admins: no new placement on GPU ``index`` (its running jobs finish); ``reason``
        is shown in ``status`` and ``ps`` and in the wait reason of the jobs it keeps
        waiting."""
        if not self.is_admin(caller):
            raise PermissionDenied("only root or an admin may drain a GPU")
        if reason is not None and (
            not isinstance(reason, str) or not reason or len(reason) > 200 or "\0" in reason
        ):
            raise UsageError("reason must be a non-empty string of at most 200 characters")
        self._gpu_index(index)
        self.store.drain(index, reason, caller.user, self.clock())
        self.wake()
        return self.list(caller)

    def undrain(self, caller: Caller, index: int) -> dict[str, Any]:
        if not self.is_admin(caller):
            raise PermissionDenied("only root or an admin may undrain a GPU")
        self._gpu_index(index)
        if not self.store.undrain(index):
            raise UsageError(f"GPU {index} is not drained")
        self.wake()
        return self.list(caller)

    def list(self, caller: Caller) -> dict[str, Any]:
        """The drained GPUs, to any local user (``status``, ``ps``, the web page)."""
        return {
            "drains": [
                {"gpu": i, "reason": d["reason"], "by": d["by"], "at": model.iso(d["at"])}
                for i, d in self.store.drains().items()
            ]
        }

    def _gpu_index(self, index: int) -> None:
        known = sorted(g.index for g in self.gpus())
        if known and index not in known:
            raise UsageError(f"no GPU with index {index} (GPUs here: {', '.join(map(str, known))})")
