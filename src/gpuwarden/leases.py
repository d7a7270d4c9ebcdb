"""Leases: GPU memory promised to a starting job that the driver does not show yet.

Two ``exec`` calls started together read the same free memory; without a record of what
the first one promised, both pick the same GPU. A lease is that record, one JSON file
per (process, GPU) in a directory every local user shares. Selection and lease creation
happen under one exclusive ``flock`` on ``<dir>/lock``, so concurrent callers serialise.

A lease counts against its GPU until its process dies, the driver shows the process
(or a descendant) holding the leased bytes on that GPU, or it expires; until then it
counts only for what the driver does not show yet, so nothing is counted twice. The
accounting is pure (``account``); ``LeaseStore`` is the file store around it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpuwarden.errors import GpuwardenError
from gpuwarden.observe.snapshot import GpuView
from gpuwarden.procs import identity

LEASE_DIR_ENV = "GPUWARDEN_LEASE_DIR"
HOME_ENV = "GPUWARDEN_HOME"
DEFAULT_TIMEOUT = 60.0
SCHEMA_VERSION = 1
_MAX_FILE = 64 * 1024  # a lease is ~200 bytes; anything bigger is not one

# What a lease is now: still counting, or stale for one of three reasons.
ACTIVE, DEAD, HELD, EXPIRED = "active", "dead", "held", "expired"


class LeaseError(GpuwardenError):
    """The lease directory cannot be used (permissions, a symlink where a dir should be)."""

    exit_code = 3


@dataclass(frozen=True)
class Lease:
    """``bytes`` on GPU ``gpu`` (uuid) promised to process (``pid``, ``start_time``)."""

    gpu: str
    bytes: int
    pid: int
    start_time: float
    created: float
    expires: float

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "gpu": self.gpu,
            "bytes": self.bytes,
            "pid": self.pid,
            "start_time": self.start_time,
            "created": self.created,
            "expires": self.expires,
        }

    @classmethod
    def from_json(cls, data: Any) -> Lease:
        """Parse a lease file's content; ValueError when it is not a valid lease."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        try:
            lease = cls(
                gpu=str(data["gpu"]),
                bytes=int(data["bytes"]),
                pid=int(data["pid"]),
                start_time=float(data["start_time"]),
                created=float(data["created"]),
                expires=float(data["expires"]),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(str(e)) from None
        if lease.bytes < 0 or lease.pid <= 0 or not lease.gpu:
            raise ValueError("out of range")
        return lease


def new_lease(
    gpu: str,
    nbytes: int,
    *,
    pid: int,
    start_time: float,
    now: float,
    timeout: float = DEFAULT_TIMEOUT,
) -> Lease:
    return Lease(
        gpu=gpu, bytes=nbytes, pid=pid, start_time=start_time, created=now, expires=now + timeout
    )


def lease_state(lease: Lease, *, now: float, alive: bool, shown: int) -> str:
    """ACTIVE while it still promises memory the driver does not show, else why not."""
    if not alive:
        return DEAD
    if shown >= lease.bytes:
        return HELD
    if now >= lease.expires:
        return EXPIRED
    return ACTIVE


def shown_memory(gpus: Sequence[GpuView], pids: frozenset[int]) -> dict[str, int]:
    """Bytes the driver shows per GPU uuid for any of ``pids`` (a process and its
    descendants: a launcher's workers hold the memory, not the launcher)."""
    out: dict[str, int] = {}
    for g in gpus:
        total = sum(p.memory or 0 for p in g.processes if p.pid in pids)
        if total:
            out[g.facts.uuid] = total
    return out


@dataclass(frozen=True)
class Accounting:
    states: tuple[str, ...]  # aligned with the leases given to ``account``
    outstanding: dict[str, int]  # GPU uuid -> bytes promised but not shown yet


def account(
    leases: Sequence[Lease],
    gpus: Sequence[GpuView],
    *,
    now: float,
    alive: Callable[[Lease], bool],
    family: Callable[[int], frozenset[int]],
) -> Accounting:
    """Classify each lease and sum, per GPU, what active leases promise beyond what the
    driver already shows for their processes: effective free = free - outstanding."""
    states: list[str] = []
    outstanding: dict[str, int] = {}
    shown_cache: dict[int, dict[str, int]] = {}
    for lease in leases:
        is_alive = alive(lease)
        shown = 0
        if is_alive:
            if lease.pid not in shown_cache:
                shown_cache[lease.pid] = shown_memory(gpus, family(lease.pid))
            shown = shown_cache[lease.pid].get(lease.gpu, 0)
        state = lease_state(lease, now=now, alive=is_alive, shown=shown)
        states.append(state)
        if state == ACTIVE:
            outstanding[lease.gpu] = outstanding.get(lease.gpu, 0) + lease.bytes - shown
    return Accounting(tuple(states), outstanding)


def pid_alive(pid: int, start_time: float) -> bool:
    """Is the process (pid, start_time) still running? A zombie has freed its memory; a
    process we may not look into counts as running (docs/design.md, invariant 7)."""
    return identity.alive(pid, start_time)


def pid_family(pid: int) -> frozenset[int]:
    """The pid and its descendants, as far as we can see them."""
    try:
        return frozenset([pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))])
    except psutil.Error:
        return frozenset([pid])


def lease_dir(
    sim_state: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[Path, bool]:
    """Where leases live, and whether it is the machine-wide directory all users share:
    GPUWARDEN_LEASE_DIR; GPUWARDEN_HOME/leases; the simulated backend's state dir; else
    /dev/shm (or /tmp) so every local user's ``exec`` sees every other's."""
    env = os.environ if env is None else env
    if env.get(LEASE_DIR_ENV):
        return Path(env[LEASE_DIR_ENV]), False
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV]) / "leases", False
    if sim_state is not None:
        return sim_state / "leases", False
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else Path("/tmp")
    return base / "gpuwarden-leases", True


class LeaseStore:
    """One JSON file per lease under ``root``; callers hold ``locked()`` around a
    read-decide-write sequence."""

    def __init__(self, root: Path, *, shared: bool = False) -> None:
        self.root = root
        self.shared = shared

    def _ensure_dir(self) -> None:
        try:
            if self.shared:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.root, 0o1777)
                    os.chmod(self.root, 0o1777)  # umask trimmed it
            else:
                self.root.mkdir(parents=True, exist_ok=True)
            st = os.lstat(self.root)
        except OSError as e:
            raise LeaseError(
                f"cannot create lease directory {self.root}: {e.strerror or e}"
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise LeaseError(f"lease directory {self.root} is not a directory")

    def _open_lock(self) -> int:
        path = self.root / "lock"
        # Open without O_CREAT first: with fs.protected_regular, O_CREAT on another
        # user's file in a sticky directory fails even though the file exists.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(3):
            try:
                return os.open(path, flags)
            except FileNotFoundError:
                pass
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        return os.open(path, flags)

    @contextlib.contextmanager
    def locked(self) -> Iterator[LeaseStore]:
        """Hold the store's exclusive lock (creating the directory when needed)."""
        self._ensure_dir()
        try:
            fd = self._open_lock()
        except OSError as e:
            raise LeaseError(f"cannot open lease lock in {self.root}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self
        finally:
            os.close(fd)  # closing drops the flock

    def read(self) -> dict[Path, Lease]:
        """Every valid lease file; unparseable ones are removed (writes are atomic, so a
        bad file is garbage, not a write in progress). Files of a newer schema are kept."""
        out: dict[Path, Lease] = {}
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return out
        except OSError as e:
            raise LeaseError(
                f"cannot read lease directory {self.root}: {e.strerror or e}"
            ) from None
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            path = self.root / name
            try:
                data = json.loads(self._read_small(path))
                if isinstance(data, dict) and data.get("version", 1) != SCHEMA_VERSION:
                    continue
                out[path] = Lease.from_json(data)
            except OSError:
                continue  # vanished or unreadable: not ours to judge
            except (ValueError, RecursionError):  # RecursionError: "[" x 60000, by anyone
                self.remove(path)
        return out

    @staticmethod
    def _read_small(path: Path) -> str:
        # No symlinks, no FIFOs, nothing huge: other users can write into a shared dir.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE:
                raise ValueError("not a lease file")
            return f.read(_MAX_FILE).decode("utf-8", errors="replace")

    def add(self, lease: Lease) -> Path:
        """Write a lease atomically; returns its path."""
        name = f"{lease.pid}-{lease.gpu.removeprefix('GPU-')[:13]}-{secrets.token_hex(4)}"
        path = self.root / f"{name}.json"
        tmp = self.root / f".{name}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump(lease.to_json(), f)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise LeaseError(f"cannot write lease in {self.root}: {e.strerror or e}") from None
        return path

    def remove(self, path: Path) -> None:
        """Best effort: in a shared sticky directory only the owner may delete a file, and
        a stale lease that stays is ignored by every reader anyway."""
        with contextlib.suppress(OSError):
            path.unlink()

    def prune(
        self,
        gpus: Sequence[GpuView],
        *,
        now: float | None = None,
        alive: Callable[[Lease], bool] | None = None,
        family: Callable[[int], frozenset[int]] = pid_family,
    ) -> Accounting:
        """Under the lock: account the leases against a fresh snapshot's GPUs and delete
        the stale ones. Returns the accounting of what was read."""
        entries = self.read()
        acc = account(
            list(entries.values()),
            gpus,
            now=time.time() if now is None else now,
            alive=alive or (lambda le: pid_alive(le.pid, le.start_time)),
            family=family,
        )
        for path, state in zip(entries, acc.states, strict=True):
            if state != ACTIVE:
                self.remove(path)
        return acc
