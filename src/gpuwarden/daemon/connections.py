"""The daemon's connections: who is on the other end of each (identified when it is
accepted), and how much an idle or slow client may hold. The API's handlers ask
``caller_of`` who is asking."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

from aiohttp import web

from gpuwarden.daemon.auth import Caller, Peer, identify
from gpuwarden.daemon.repeated import log_repeated
from gpuwarden.errors import PermissionDenied

log = logging.getLogger("gpuwarden.api")
PEERS = web.AppKey("peers", dict[Any, Peer])  # transport -> Peer, from accept to close


def identify_peers(app: web.Application, server: web.Server) -> None:
    """Identify each connection's peer when it is accepted (``auth.identify``), not when
    a request arrives: by then the process that connected may have handed the socket to
    a child and exited, and its pid be another user's process."""
    peers: dict[Any, Peer] = app[PEERS]
    made, lost = server.connection_made, server.connection_lost

    def connection_made(handler: Any, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            try:
                peers[transport] = identify(sock)
            except OSError:
                log_repeated(
                    log, logging.WARNING, "identify", "cannot identify the peer of a new connection"
                )
        made(handler, transport)

    def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
        peer = peers.pop(handler.transport, None) if handler.transport else None
        if peer is not None:
            peer.close()
        lost(handler, exc)

    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign]


def _peer_uid(sock: socket.socket) -> int | None:
    """The connecting uid (SO_PEERCRED), None where the kernel cannot tell."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return int(struct.unpack("3i", raw)[1])


def guard_connections(
    server: web.Server, where: str, *, limit: int, per_user: bool, request_timeout: float
) -> None:
    """Bound what idle clients can hold: at most ``limit`` open connections (per peer uid
    with ``per_user``, on the unix socket; in all on a TCP listener), a new one past it
    closed at once, and a connection whose first request head has not arrived within
    ``request_timeout`` closed (a slow header). 22,500 idle connections of one user
    used up the daemon's descriptors and every other user got "no daemon answers".
    Wrap after ``identify_peers``, so a refused connection costs no pidfd."""
    counts: dict[int | None, int] = {}
    counted: dict[Any, int | None] = {}  # handler -> its uid (None on TCP)
    made, lost = server.connection_made, server.connection_lost
    loop = asyncio.get_running_loop()

    def connection_made(handler: Any, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        uid = _peer_uid(sock) if per_user and sock is not None else None
        if counts.get(uid, 0) >= limit:
            who = f"uid {uid}" if per_user else "all clients"
            log_repeated(
                log,
                logging.WARNING,
                f"limit:{where}:{uid}",
                "%s: refused a connection of %s: %d open already (max_connections_%s)",
                where,
                who,
                limit,
                "per_user" if per_user else "tcp",
            )
            transport.abort()  # not handed on: no identity, no pidfd for it
            return
        counts[uid] = counts.get(uid, 0) + 1
        counted[handler] = uid
        made(handler, transport)
        loop.call_later(request_timeout, _head_due, handler, transport)

    def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
        if handler in counted:
            uid = counted.pop(handler)
            counts[uid] -= 1
            if not counts[uid]:
                del counts[uid]
        lost(handler, exc)

    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign]


def _head_due(handler: Any, transport: Any) -> None:
    """Close a connection whose first request has not been read in full by now."""
    if getattr(handler, "_request_count", 1) == 0 and not transport.is_closing():
        transport.abort()


def caller_of(request: web.Request) -> Caller:
    """The caller as identified at the accept, if it is still the same process."""
    peer = request.app[PEERS].get(request.transport) if request.transport else None
    if peer is None:
        raise PermissionDenied("the caller's identity cannot be established")
    if not peer.same_process():
        raise PermissionDenied("the process that opened this connection has exited; connect again")
    return peer.caller
