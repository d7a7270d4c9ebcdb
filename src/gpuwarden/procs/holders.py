"""Scan /proc/*/fd for open NVIDIA device files — what ``fuser -v /dev/nvidia*`` does,
in-process and without a subprocess, so it is fast enough to run on every snapshot.

A scan repeated every second (the daemon, ``top``, the exporter) passes ``FdTables``,
which keeps what each process's fd table held: a process whose fd directory is the same
inode with the same number of descriptors (Linux ≥ 6.2 reports it as the directory's
size) is not read again, for at most ``FdTables.recheck`` seconds. Opening a device file
adds a descriptor and closing one removes it, so the count tells, unless a process closed
one file and opened another under the same count between two scans: that is what the
recheck bounds. Re-checks of suspects (``only``) always read the table itself.

A one-shot command run again and again (``watch -n 1 gpuwarden status``) keeps them
between runs in a file of its user's (``fd_tables_from``), read at its first scan and
written back at its end; a file from another boot, another user or in another shape is
not used."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

MAX_FILE = 16 << 20  # bytes of a tables file: more is not one of ours


@dataclass(frozen=True)
class RawHolder:
    pid: int
    devices: tuple[str, ...]


class _Table(NamedTuple):
    ino: int  # the fd directory's inode: a new process under the same pid has another
    fds: int  # descriptors open when it was read
    devices: tuple[str, ...]  # the device files among them
    until: float  # read again after this (monotonic seconds)


def counts_descriptors(proc: str = "/proc") -> bool:
    """Whether this kernel reports the number of open descriptors as the size of
    /proc/PID/fd (Linux 6.2 and later; older ones say 0). This process has some open."""
    try:
        return os.stat(f"{proc}/self/fd").st_size > 0
    except OSError:
        return False


class FdTables:
    """What each process's fd table held at its last read, across scans."""

    def __init__(
        self,
        recheck: float = 10.0,
        proc: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recheck = recheck
        self.clock = clock
        self.enabled = counts_descriptors(proc)
        self._lock = threading.Lock()
        self._tables: dict[int, _Table] = {}
        self.reads = 0  # fd tables read (not kept): for tests and benchmarks

    def __len__(self) -> int:
        return len(self._tables)

    def table(self, pid: int) -> _Table | None:
        """What is kept for ``pid``, due or not."""
        return self._tables.get(pid)

    def kept(self, pid: int, ino: int, fds: int, now: float) -> _Table | None:
        t = self._tables.get(pid)
        if t is None or t.ino != ino or t.fds != fds or now >= t.until:
            return None
        return t

    def put(self, pid: int, ino: int, fds: int, devices: tuple[str, ...], now: float) -> None:
        # Spread the rereads over the interval, so they do not all fall on one scan.
        until = now + self.recheck * (0.5 + (pid % 16) / 32)
        with self._lock:
            self._tables[pid] = _Table(ino, fds, devices, until)

    def prune(self, alive: Iterable[int]) -> None:
        """Forget every process whose pid is not in ``alive`` (a listing of /proc)."""
        keep = set(alive)
        with self._lock:
            for pid in [p for p in self._tables if p not in keep]:
                del self._tables[pid]

    def save(self, path: Path) -> None:
        """Write the tables to ``path`` (owner-only, replaced whole), for the next run.
        Best effort: a directory that cannot take it loses only the next run's speed."""
        from gpuwarden.procs.identity import boot_id

        with self._lock:
            rows = [[pid, *t[:2], list(t.devices), t.until] for pid, t in self._tables.items()]
        data = json.dumps({"boot": boot_id(), "tables": rows}, separators=(",", ":"))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
        with contextlib.suppress(OSError):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(data)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def load(self, path: Path) -> None:
        """Take the tables an earlier run wrote to ``path``, if that file is this user's,
        from this boot (pids, inodes and the monotonic clock start again at a boot) and
        in the shape ``save`` writes; else keep none."""
        from gpuwarden.procs.identity import boot_id

        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.geteuid() or st.st_size > MAX_FILE:
                    return
                doc: Any = json.loads(f.read())
            if not isinstance(doc, dict) or doc.get("boot") != boot_id():
                return
            tables = {row[0]: _Table(*_checked(row)) for row in doc["tables"]}
        except (OSError, ValueError, TypeError, KeyError, IndexError, RecursionError):
            return  # (RecursionError: JSON nested deeper than the parser goes)
        with self._lock:
            self._tables = tables


def _checked(row: Any) -> tuple[int, int, tuple[str, ...], float]:
    """A saved row's (ino, fds, devices, until), or ValueError."""
    pid, ino, fds, devices, until = row
    if not all(type(v) is int and v >= 0 for v in (pid, ino, fds)):
        raise ValueError("not a table row")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise ValueError("not a table row")
    if type(until) not in (int, float):
        raise ValueError("not a table row")
    return ino, fds, tuple(devices), float(until)


_shared: FdTables | None = None


def keep_fd_tables() -> FdTables:
    """Keep fd tables across this process's scans from now on: for processes that scan
    again and again (the daemon, the exporter, ``top``); a one-shot command's single scan
    would only pay for keeping them."""
    global _shared
    if _shared is None:
        _shared = FdTables()
    return _shared


def shared_fd_tables() -> FdTables | None:
    """The tables ``keep_fd_tables`` started, or those of ``fd_tables_from``'s file
    (found and read now, at the first scan that asks)."""
    global _shared, _where, _file
    if _shared is None and _where is not None:
        _file, _where = _where(), None
        if _file is not None:
            tables = FdTables()
            tables.load(_file)
            _shared = tables
    return _shared


# Where fd_tables_from's tables come from and go back to: asked at the first scan (a
# command that never scans makes no directory), then the file it named.
_where: Callable[[], Path | None] | None = None
_file: Path | None = None


@contextlib.contextmanager
def fd_tables_from(where: Path | Callable[[], Path | None] | None) -> Iterator[None]:
    """For a one-shot command: the fd tables its user's last run left in a file
    (``where``, or what it returns when the first scan asks), read at that scan and
    written back when the command ends. Nothing where there is no file or this process
    keeps tables of its own (``keep_fd_tables``)."""
    global _shared, _where, _file
    if where is None or _shared is not None or _where is not None or _file is not None:
        yield
        return
    _where = (lambda: where) if isinstance(where, Path) else where
    try:
        yield
    finally:
        tables, path = _taken()  # (read anew: the first scan set them meanwhile)
        _shared, _where, _file = None, None, None
        if tables is not None and path is not None:
            tables.save(path)


def _taken() -> tuple[FdTables | None, Path | None]:
    return _shared, _file


def scan_holders(
    device_files: Mapping[str, int | None],
    *,
    proc: str = "/proc",
    exclude: Iterable[int] = (),
    only: Iterable[int] | None = None,
    listing: Sequence[str] | None = None,
    tables: FdTables | None = None,
) -> list[RawHolder]:
    """Every process (of ``only``, when given) with one of ``device_files`` open.
    ``listing``: the entries of ``proc`` when the caller has just listed it. ``tables``:
    fd tables kept from earlier scans (used for a whole scan, refreshed by any).
    Processes that vanish or deny access mid-scan are skipped (their fds cannot be read
    without root anyway)."""
    if not device_files:
        return []
    wanted = set(device_files)
    # One common directory prefix lets most fds be rejected with a cheap startswith.
    prefix = os.path.commonpath([os.path.dirname(p) for p in wanted]) + "/"
    skip = {str(p) for p in exclude}
    readlink = os.readlink
    if tables is not None and not tables.enabled:
        tables = None
    reuse = tables is not None and only is None
    now = tables.clock() if tables is not None else 0.0
    out: list[RawHolder] = []
    try:
        entries = (
            (listing if listing is not None else os.listdir(proc))
            if only is None
            else [str(p) for p in sorted(set(only))]
        )
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or name in skip:
            continue
        if reuse:
            assert tables is not None
            try:
                seen = os.stat(f"{proc}/{name}/fd")
            except OSError:
                continue
            if seen.st_size == 0:  # no descriptors at all (a kernel thread, say)
                continue
            kept = tables.kept(int(name), seen.st_ino, seen.st_size, now)
            if kept is not None:
                if kept.devices:
                    out.append(RawHolder(pid=int(name), devices=kept.devices))
                continue
        # Open the fd directory once and resolve links relative to it: one path lookup
        # per process instead of one per descriptor.
        try:
            dir_fd = os.open(f"{proc}/{name}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        found: set[str] = set()
        st: os.stat_result | None = None
        try:
            # Its inode and count before the listing: a descriptor opened meanwhile
            # makes the next scan's count differ, so that scan reads it.
            if tables is not None:
                st = os.fstat(dir_fd)
            for fd in os.listdir(dir_fd):
                try:
                    target = readlink(fd, dir_fd=dir_fd)
                except OSError:
                    continue
                if target.startswith(prefix) and target in wanted:
                    found.add(target)
        except OSError:
            st = None  # the process exited mid-scan: what was read stands, unkept
        finally:
            os.close(dir_fd)
        devices = tuple(sorted(found))
        if tables is not None and st is not None:
            tables.reads += 1
            tables.put(int(name), st.st_ino, st.st_size, devices, now)
        if found:
            out.append(RawHolder(pid=int(name), devices=devices))
    if reuse:
        assert tables is not None
        tables.prune(int(n) for n in entries if n.isdigit())
    return out
