"""The simulated driver's memory: which live process holds how much on which GPU.

Each simulated job writes one JSON file under ``<state>/alloc/``. When its process is
gone the driver frees the memory after a short lag, as the real one does: for
``free_lag`` seconds after a read first finds the process dead, the memory still counts
as used but no process is listed for it (memory no process accounts for), then the file
is dropped. A file written with ``leak`` set models a context the driver failed to free.
A lock file serialises allocations so two jobs cannot both take the last free bytes."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.procs import identity


def state_dir_for(scenario_path: Path) -> Path:
    """GPUWARDEN_SIM_STATE, or a per-scenario directory under the temp dir."""
    explicit = os.environ.get("GPUWARDEN_SIM_STATE")
    if explicit:
        return Path(explicit)
    digest = hashlib.sha1(str(scenario_path).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"gpuwarden-sim-{os.getuid()}-{digest}"


@dataclass(frozen=True)
class Allocation:
    pid: int
    start_time: float
    gpus: dict[str, int]  # uuid -> bytes
    leak: bool
    command: str
    freeing: bool = False  # its process is gone; the driver has not freed it yet
    mps: bool = False  # an MPS client: the driver lists it as one (and as compute)


class Registry:
    def __init__(self, root: Path, free_lag: float = 0.0) -> None:
        self.root = root
        self.free_lag = free_lag
        self.alloc_dir = root / "alloc"
        self.dev_dir = root / "dev"
        self.settings_file = root / "settings.json"

    def ensure(self, gpu_count: int) -> None:
        """Create the state tree and the simulated device files (nvidiaN, nvidiactl, uvm)."""
        self.alloc_dir.mkdir(parents=True, exist_ok=True)
        self.dev_dir.mkdir(parents=True, exist_ok=True)
        for name in [f"nvidia{i}" for i in range(gpu_count)] + ["nvidiactl", "nvidia-uvm"]:
            path = self.dev_dir / name
            if not path.exists():
                path.touch(mode=0o666)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def allocations(self) -> list[Allocation]:
        """Live registrations, and those of dead processes whose memory the driver has
        not freed yet (``freeing``); files past the lag are removed."""
        out: list[Allocation] = []
        try:
            names = os.listdir(self.alloc_dir)
        except OSError:
            return out
        for name in names:
            if not name.endswith(".json"):
                continue
            path = self.alloc_dir / name
            try:
                data = json.loads(path.read_text())
                alloc = Allocation(
                    pid=int(data["pid"]),
                    start_time=float(data["start_time"]),
                    gpus={str(k): int(v) for k, v in data["gpus"].items()},
                    leak=bool(data.get("leak", False)),
                    command=str(data.get("command", "")),
                    mps=bool(data.get("mps", False)),
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue  # half-written, vanished or not an allocation: ignore this read
            # As the driver: a process that exited (a zombie too) has let go of its
            # contexts; the memory comes back after the lag.
            alive = identity.alive(alloc.pid, alloc.start_time)
            if alive or alloc.leak:
                out.append(alloc)
                continue
            now = time.time()
            died = data.get("died_at")
            if died is None and self.free_lag > 0:
                died = now
                with contextlib.suppress(OSError):
                    self._store(path, {**data, "died_at": now})
            if isinstance(died, (int, float)) and now - died < self.free_lag:
                out.append(dataclasses.replace(alloc, freeing=True))
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return out

    @staticmethod
    def _store(path: Path, payload: dict[str, Any]) -> None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, path)

    def write(
        self,
        pid: int,
        start_time: float,
        gpus: dict[str, int],
        *,
        leak: bool,
        command: str,
        mps: bool = False,
    ) -> None:
        """Record (atomically) what ``pid`` holds now."""
        self.alloc_dir.mkdir(parents=True, exist_ok=True)
        self._store(
            self.alloc_dir / f"{pid}.json",
            {
                "pid": pid,
                "start_time": start_time,
                "gpus": gpus,
                "leak": leak,
                "command": command,
                "mps": mps,
            },
        )

    def forget(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            (self.alloc_dir / f"{pid}.json").unlink()

    def settings(self) -> dict[str, Any]:
        """Changes made through the settings commands (compute mode, MPS), by GPU uuid."""
        try:
            data = json.loads(self.settings_file.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def update_settings(self, uuid: str, **changes: Any) -> None:
        with self.locked():
            data = self.settings()
            data.setdefault(uuid, {}).update(changes)
            tmp = self.settings_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.settings_file)
