"""Who is calling, from the kernel (SO_PEERCRED on the unix socket) — never from the
request — and what they may do."""

from __future__ import annotations

import grp
import pwd
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

    @property
    def root(self) -> bool:
        return self.uid == 0


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _groups_of(pid: int, gid: int) -> tuple[int, ...]:
    """Supplementary groups of the calling process, from /proc (the kernel's view)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(sorted({gid, *(int(g) for g in line.split()[1:])}))
    except (OSError, ValueError):
        pass
    return (gid,)


def peer_caller(sock: socket.socket) -> Caller:
    """The process on the other end of a unix socket."""
    fmt = "3i"
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, raw)
    return Caller(pid=pid, uid=uid, gid=gid, user=_name(uid), groups=_groups_of(pid, gid))


def admin_gids(group_names: tuple[str, ...]) -> frozenset[int]:
    out = set()
    for name in group_names:
        try:
            out.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return frozenset(out)


def may_manage(caller: Caller, owner_uid: int, admins: frozenset[int],
               daemon_uid: int) -> bool:
    """Owner, root, a member of an admin group, or — for a user's own daemon — its user."""
    return (caller.uid in (owner_uid, 0) or bool(admins.intersection(caller.groups))
            or (daemon_uid != 0 and caller.uid == daemon_uid))
