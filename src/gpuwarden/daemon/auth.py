"""Who is calling, from the kernel (SO_PEERCRED on the unix socket) — never from the
request — and what they may do."""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import select
import socket
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    user: str
    groups: tuple[int, ...]
    # The connecting process's start, read when the connection was accepted: with
    # ``pid``, its identity (None where it could not be read: it had gone already).
    start_time: float | None = None
    start_ticks: int | None = None

    @property
    def root(self) -> bool:
        return self.uid == 0


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
MAX_PEER_GROUPS = 256  # Python's getsockopt reads at most 1024 bytes (256 gids)


def _peer_groups(sock: socket.socket, gid: int) -> tuple[int, ...] | None:
    """Supplementary groups of the peer as they were when it connected, from the kernel
    (like SO_PEERCRED's uid and gid); None where the kernel cannot tell. A caller in
    more than MAX_PEER_GROUPS groups counts with its primary group only (never more)."""
    size = 64
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * size)
        except OSError as e:
            if e.errno == errno.ERANGE and size < MAX_PEER_GROUPS:
                size = MAX_PEER_GROUPS
                continue
            if e.errno == errno.ENOPROTOOPT:
                return None
            return (gid,)  # no supplementary groups we can trust
        n = len(raw) // 4
        return tuple(sorted({gid, *struct.unpack(f"{n}I", raw[: 4 * n])}))


def _groups_of(pid: int, uid: int, gid: int) -> tuple[int, ...]:
    """Old kernels only: the supplementary groups of the calling process from /proc, read
    now, not at connect time; so only when that pid still runs as the caller's uid."""
    groups: tuple[int, ...] | None = None
    real_uid = None
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("Uid:"):
                    real_uid = int(line.split()[1])
                elif line.startswith("Groups:"):
                    groups = tuple(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    if groups is None or real_uid != uid:
        return (gid,)
    return tuple(sorted({gid, *groups}))


def peer_caller(sock: socket.socket) -> Caller:
    """The process on the other end of a unix socket, as the kernel saw it connect.
    Groups come with the connection (SO_PEERGROUPS), not from /proc/PID later: the
    process may have changed since, or exited and had its pid reused by someone else's."""
    fmt = "3i"
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, raw)
    groups = _peer_groups(sock, gid)
    if groups is None:
        groups = _groups_of(pid, uid, gid)
    return Caller(pid=pid, uid=uid, gid=gid, user=_name(uid), groups=groups)


SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5


@dataclass
class Peer:
    """The process at the other end of one connection, identified when the daemon
    accepted it: its credentials and start time, and a pidfd that keeps naming that
    process (not its pid's next owner) until the connection ends."""

    caller: Caller
    pidfd: int | None

    def same_process(self) -> bool:
        """Is the process that connected still there (not exited, pid not reused)?"""
        c = self.caller
        if c.pid <= 0:  # outside this daemon's PID namespace: no pid to go by
            return True
        if self.pidfd is not None:
            return not _exited(self.pidfd)
        from gpuwarden.procs.identity import start_ticks

        return c.start_ticks is not None and start_ticks(c.pid) == c.start_ticks

    def close(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


def _exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (a zombie included)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def _pidfd(sock: socket.socket, pid: int) -> int | None:
    """The kernel's pidfd of the process that connected (SO_PEERPIDFD); on older
    kernels one opened on its pid now, as close to the connect as the daemon gets."""
    with contextlib.suppress(OSError):
        return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))
    with contextlib.suppress(OSError, AttributeError):
        return os.pidfd_open(pid)
    return None


def identify(sock: socket.socket) -> Peer:
    """Identify the peer of a connection just accepted (call it then, not per request):
    its start time is read while its pidfd shows it alive, so it is that process's."""
    import dataclasses

    import psutil

    from gpuwarden.procs.identity import start_ticks

    caller = peer_caller(sock)
    if caller.pid <= 0:
        return Peer(caller, None)
    fd = _pidfd(sock, caller.pid)
    ticks = start_ticks(caller.pid)
    try:
        start: float | None = psutil.Process(caller.pid).create_time()
    except psutil.Error:
        start = None
    if fd is not None and _exited(fd):  # gone before it was identified
        ticks = start = None
    return Peer(dataclasses.replace(caller, start_time=start, start_ticks=ticks), fd)


def admin_gids(group_names: tuple[str, ...]) -> frozenset[int]:
    out = set()
    for name in group_names:
        try:
            out.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return frozenset(out)


def may_manage(caller: Caller, owner_uid: int, admins: frozenset[int], daemon_uid: int) -> bool:
    """Owner, root, a member of an admin group, or — for a user's own daemon — its user."""
    return (
        caller.uid in (owner_uid, 0)
        or bool(admins.intersection(caller.groups))
        or (daemon_uid != 0 and caller.uid == daemon_uid)
    )
