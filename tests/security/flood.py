"""The attacker's and the victim's side of the denial-of-service tests, run as a user
(``python -m tests.security.flood MODE ...`` under ``setpriv``). Each mode prints one
JSON line.

- ``idle SOCKET N``: open N connections to the daemon's unix socket and send nothing;
  print how many the daemon still holds open after a while, then wait on stdin.
- ``tcp HOST PORT N``: the same on a TCP listener.
- ``time SOCKET CWD``: the latency of ``ps`` (GET /v1/jobs) and ``submit`` (POST
  /v1/jobs), as the CLI sends them, each measured from connect to answer."""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import time
from typing import Any


def _raise_nofile(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 64 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 64, hard))


def _still_open(socks: list[socket.socket], settle: float) -> int:
    """How many of ``socks`` the other end has not closed after ``settle`` seconds."""
    time.sleep(settle)
    alive = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK):
                alive += 1
        except BlockingIOError:  # nothing to read, not closed
            alive += 1
        except OSError:
            pass
    return alive


def _hold(socks: list[socket.socket], refused: int) -> None:
    print(
        json.dumps({"opened": len(socks), "refused": refused, "open": _still_open(socks, 1.5)}),
        flush=True,
    )
    sys.stdin.read()  # until the test closes our stdin


GIVE_UP = 3.0  # seconds without one connect going through: the daemon accepts no more


def _open(n: int, connect: Any) -> None:
    """``n`` connections, retrying a connect the backlog has no room for yet."""
    _raise_nofile(n)
    socks: list[socket.socket] = []
    refused = 0
    last = time.monotonic()
    while len(socks) < n and time.monotonic() - last < GIVE_UP:
        try:
            socks.append(connect())
            last = time.monotonic()
        except OSError:
            refused += 1
            time.sleep(0.001)
    _hold(socks, refused)


def _unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)  # a full backlog: EAGAIN at once
    try:
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


def idle(path: str, n: int) -> None:
    _open(n, lambda: _unix(path))


def tcp(host: str, port: int, n: int) -> None:
    _open(n, lambda: socket.create_connection((host, port), timeout=0.5))


def _ask(path: str, method: str, target: str, body: Any = None) -> tuple[int, float]:
    from gpuwarden.client.api import _UnixConnection

    t0 = time.monotonic()
    conn = _UnixConnection(path, 30)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(
            method,
            target,
            body=payload,
            headers={"Content-Type": "application/json"} if payload else {},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - t0
    except OSError:
        return 0, time.monotonic() - t0
    finally:
        conn.close()


def timings(path: str, cwd: str) -> None:
    out: dict[str, list[Any]] = {"ps": [], "submit": []}
    for _ in range(5):
        out["ps"].append(_ask(path, "GET", "/v1/jobs"))
    for _ in range(3):
        out["submit"].append(
            _ask(
                path,
                "POST",
                "/v1/jobs",
                {"command": ["sleep", "600"], "cwd": cwd, "env": dict(os.environ)},
            )
        )
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "idle":
        idle(rest[0], int(rest[1]))
    elif mode == "tcp":
        tcp(rest[0], int(rest[1]), int(rest[2]))
    elif mode == "time":
        timings(rest[0], rest[1])
    else:
        raise SystemExit(f"unknown mode {mode}")
