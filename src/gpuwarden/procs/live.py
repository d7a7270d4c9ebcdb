"""Process facts read from this machine's /proc (``procs/procfs.py``)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import lru_cache
from typing import NamedTuple

from gpuwarden.procs import procfs
from gpuwarden.procs.container import read_container
from gpuwarden.procs.holders import scan_holders, shared_fd_tables
from gpuwarden.procs.model import INTERESTING_ENV, Holder, ProcInfo
from gpuwarden.procs.namespace import in_child_pid_namespace, pid_max, read_nspid

GARBAGE_PIDS = frozenset({0, 2**32 - 1, 2**31 - 1})


def is_garbage_pid(pid: int, limit: int) -> bool:
    """A pid no kernel could have issued: 0, negative, the all-ones values some drivers
    return on a struct-version mismatch, or anything above pid_max."""
    return pid <= 0 or pid in GARBAGE_PIDS or pid > limit


@lru_cache(maxsize=4096)
def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _read_env(pid: int) -> Mapping[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in INTERESTING_ENV:
            out[key.decode()] = value.decode(errors="replace")
    return out


def _uses_torch(pid: int) -> bool | None:
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                if b"libtorch_cuda" in line or b"libc10_cuda" in line:
                    return True
    except OSError:
        return None
    return False


def device_mapped(pid: int) -> bool | None:
    """Whether ``pid`` has NVIDIA device files mapped (a CUDA context); None when its maps
    cannot be read."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return any(b" /dev/nvidia" in line for line in f)
    except OSError:
        return None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Is ``pid`` a process that has not exited (a zombie has)? Unreadable: no."""
    status = procfs.state(pid) if pid > 0 else None
    return status is not None and status not in ("zombie", "dead")


class _Kept(NamedTuple):
    """What one read of a process found that lasts as long as it runs, with the facts
    that tell it is still that one: start time, uid, name and command line (an exec
    keeps pid and start time but changes the command; a setuid changes the uid)."""

    start: float
    uid: int
    name: str
    command: str
    nspid: tuple[int, ...] | None
    detail: bool  # container, env and uses_torch were read
    container: str | None
    env: Mapping[str, str] | None
    uses_torch: bool | None
    torch_due: float  # when to look at its maps again while torch is not among them


class KeptFacts:
    """The lasting /proc facts of processes seen before, across snapshots: namespace
    pids, container, environment and torch's presence are read once per process (pid
    and start time), not once per snapshot. Bounded; a pid whose process is gone, or
    now another's, loses its entry."""

    def __init__(
        self,
        limit: int = 16384,
        proc: str = "/proc",
        torch_recheck: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.proc = proc
        # A process may load torch after its first look (most do it at start), so one
        # without it is looked at again, but its maps (thousands of lines for a CUDA
        # program) are read at most once per ``torch_recheck`` seconds, not per snapshot.
        self.torch_recheck = torch_recheck
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[int, _Kept] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def get(
        self, pid: int, start: float, uid: int, name: str, command: str, detail: bool
    ) -> _Kept | None:
        k = self._kept.get(pid)
        if (
            k is None
            or k.start != start
            or k.uid != uid
            or k.name != name
            or k.command != command
            or (detail and not k.detail)
        ):
            return None
        return k

    def put(self, pid: int, kept: _Kept) -> None:
        with self._lock:
            self._kept.pop(pid, None)
            self._kept[pid] = kept
            if len(self._kept) > self.limit:
                with contextlib.suppress(OSError):
                    self._prune({int(n) for n in os.listdir(self.proc) if n.isdigit()})
                while len(self._kept) > self.limit:  # oldest first
                    del self._kept[next(iter(self._kept))]

    def prune(self, alive: Iterable[int]) -> None:
        """Forget every process whose pid is not in ``alive`` (a listing of /proc)."""
        with self._lock:
            self._prune(set(alive))

    def _prune(self, alive: set[int]) -> None:
        for pid in [p for p in self._kept if p not in alive]:
            del self._kept[pid]


KEPT = KeptFacts()
"""Shared by every LiveProcesses of this process (the daemon's, top's and the exporter's
snapshots each make one)."""


class LiveProcesses:
    """The real /proc. One instance per snapshot; it caches what it reads, and keeps the
    lasting facts of each process across snapshots in ``kept``."""

    def __init__(self, kept: KeptFacts = KEPT) -> None:
        self._pid_max = pid_max()
        self._in_child_ns = in_child_pid_namespace()
        self._cache: dict[int, ProcInfo] = {}
        self.kept = kept
        self._boot: float | None = None
        self._leaders: dict[int, bool] = {}  # pgid -> its leader lives, this snapshot

    def _leader_alive(self, pgid: int) -> bool:
        """Whether a group's leader lives: asked once a snapshot per group (a job's
        workers share their leader's group)."""
        alive = self._leaders.get(pgid)
        if alive is None:
            alive = self._leaders[pgid] = _alive(pgid)
        return alive

    def _boot_time(self) -> float:
        """/proc/stat's boot time, read once a snapshot (the clock may be set between)."""
        if self._boot is None:
            self._boot = procfs.boot_time()
        return self._boot

    @property
    def in_child_namespace(self) -> bool:
        return self._in_child_ns

    def info(self, pid: int, *, detail: bool = True) -> ProcInfo:
        """Facts about ``pid``. ``detail`` also reads environ, maps and cgroup."""
        cached = self._cache.get(pid)
        if cached is not None:
            return cached
        if is_garbage_pid(pid, self._pid_max):
            info = ProcInfo(pid=pid, exists=False, garbage=True)
        else:
            info = self._read(pid, detail)
        self._cache[pid] = info
        return info

    def _read(self, pid: int, detail: bool) -> ProcInfo:
        try:
            f = procfs.read(pid, self._boot_time())
        except (FileNotFoundError, ProcessLookupError):
            return ProcInfo(pid=pid, exists=False, namespace_hint=self._hint())
        except (OSError, ValueError, IndexError):  # unreadable (hidepid), or cut short
            if not os.path.exists(f"/proc/{pid}"):
                return ProcInfo(pid=pid, exists=False, namespace_hint=self._hint())
            return ProcInfo(pid=pid, exists=True, nspid=read_nspid(pid))
        uid, status, ppid, start, name, cmd = f.uid, f.status, f.ppid, f.start, f.name, f.command
        try:
            cpus: frozenset[int] | None = frozenset(os.sched_getaffinity(pid))
        except OSError:
            cpus = None
        rss: int | None = f.rss
        cpu_time: float | None = f.cpu_time
        pgid = f.pgid
        leader_alive = pgid == pid or self._leader_alive(pgid)
        parent_pgid = _pgid(ppid) if ppid > 0 else None
        k = self.kept.get(pid, start, uid, name, cmd, detail)
        kept = self.kept
        if k is None:
            k = _Kept(
                start,
                uid,
                name,
                cmd,
                read_nspid(pid),
                detail,
                read_container(pid) if detail else None,
                _read_env(pid) if detail else None,
                _uses_torch(pid) if detail else None,
                kept.clock() + kept.torch_recheck,
            )
            kept.put(pid, k)
        elif detail and not k.uses_torch and kept.clock() >= k.torch_due:
            # Its maps change (a library loaded since): look again, now and then.
            k = k._replace(uses_torch=_uses_torch(pid), torch_due=kept.clock() + kept.torch_recheck)
            kept.put(pid, k)
        return ProcInfo(
            pid=pid,
            exists=True,
            start_time=start,
            user=_user_name(uid),
            uid=uid,
            command=cmd,
            name=name,
            status=status,
            ppid=ppid,
            pgid=pgid,
            group_leader_alive=leader_alive,
            parent_pgid=parent_pgid,
            cpus_allowed=cpus,
            container=k.container if detail else None,
            nspid=k.nspid,
            env=k.env if detail else None,
            uses_torch=k.uses_torch if detail else None,
            rss=rss,
            cpu_time=cpu_time,
        )

    def _hint(self) -> str | None:
        if self._in_child_ns:
            return "this view runs inside a PID namespace; the pid is probably the host's"
        return None

    def device_mapped(self, pid: int) -> bool | None:
        return device_mapped(pid)

    def holders(
        self,
        device_files: Mapping[str, int | None],
        exclude: Iterable[int] = (),
        only: Collection[int] | None = None,
    ) -> list[Holder]:
        """Processes (of ``only``, when given) holding NVIDIA device files, with user
        and command filled in."""
        out: list[Holder] = []
        listing: list[str] | None = None
        if only is None:
            with contextlib.suppress(OSError):  # processes gone since: their facts go too
                listing = os.listdir("/proc")
                self.kept.prune(int(n) for n in listing if n.isdigit())
        tables = shared_fd_tables()
        for raw in scan_holders(
            device_files, exclude=exclude, only=only, listing=listing, tables=tables
        ):
            info = self.info(raw.pid, detail=False)
            indices = sorted({i for d in raw.devices if (i := device_files.get(d)) is not None})
            out.append(
                Holder(
                    pid=raw.pid,
                    devices=raw.devices,
                    gpu_indices=tuple(indices),
                    user=info.user,
                    command=info.command,
                    start_time=info.start_time,
                    uses_uvm=any(d.endswith("nvidia-uvm") for d in raw.devices),
                )
            )
        return out
