"""The daemon's full snapshot for ``status``: taken on a thread of its own while clients
ask for it, served read-only (``GET /v1/snapshot``) as each caller would see it alone.

Nobody asking costs nothing: the first request after a quiet spell finds no snapshot
young enough (the client then takes its own) and starts the refresh, one full snapshot
(holders and process details) each ``INTERVAL`` until ``LINGER`` seconds pass without a
request; ``watch -n 1 gpuwarden status`` is answered from memory from its second screen on.

The daemon sees more than a user's own ``status`` would: the open file descriptors and
memory maps of every process (``/proc/PID/fd`` and ``maps`` are readable only to their
owner and root) and, where ``/proc`` is mounted with ``hidepid``, other users' processes
at all. So a caller other than root is served the holders of its own processes only,
and under ``hidepid`` no user, command, container or start time of other users'
processes. Environments are never served (a process's job is the daemon's word, as
``/v1/job-pids`` gives it to anyone)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from gpuwarden.daemon.auth import Caller
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.observe.snapshot import Snapshot

log = logging.getLogger("gpuwarden.snapview")
INTERVAL = 1.0  # seconds between full snapshots while clients ask
LINGER = 30.0  # seconds of refreshing after the last request
KEEP = 3  # snapshots kept: the persistence rule of ``leaks`` needs consecutive samples
MAX_WIDTH = 1000  # columns the daemon draws a table for (``view=table``)


def hidepid(mountinfo: Path = Path("/proc/self/mountinfo")) -> tuple[bool, int | None]:
    """Whether ``/proc`` hides other users' processes (``hidepid`` other than 0 or
    off), and the gid exempt from it (``gid=``)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return False, None
    for line in lines:
        fields = line.split()
        if len(fields) < 5 or fields[4] != "/proc" or " - proc " not in line:
            continue
        opts = line.rsplit(" ", 1)[-1].split(",")
        mode = next((o.split("=", 1)[1] for o in opts if o.startswith("hidepid=")), "0")
        gid = next((o.split("=", 1)[1] for o in opts if o.startswith("gid=")), None)
        return mode not in ("0", "off"), int(gid) if gid and gid.isdigit() else None
    return False, None


def for_caller(snap: Snapshot, caller: Caller, hidden: tuple[bool, int | None]) -> Snapshot:
    """``snap`` as ``caller``'s own ``status`` could see it (see the module doc)."""
    if caller.root:
        return snap
    hides = hidden[0] and not (hidden[1] is not None and hidden[1] in (caller.gid, *caller.groups))

    def seen(p: Any) -> Any:
        info = p.info
        if info.uid == caller.uid or (info.uid is None and info.user == caller.user):
            return p if info.env is None else p._replace(info=replace(info, env=None))
        if hides:
            info = replace(
                info, user=None, uid=None, command=None, name=None, container=None, start_time=None
            )
            return p._replace(info=replace(info, env=None), elapsed=None)
        return p._replace(info=replace(info, env=None))

    return replace(
        snap,
        holders=tuple(h for h in snap.holders if h.user == caller.user),
        gpus=tuple(replace(g, processes=tuple(seen(p) for p in g.processes)) for g in snap.gpus),
    )


class SnapshotKeeper:
    """The latest full snapshots (oldest first), refreshed while clients ask."""

    def __init__(
        self,
        open_backend: Callable[[], Backend],
        job_pids: Callable[[], Mapping[int, int] | None],
        *,
        interval: float = INTERVAL,
        linger: float = LINGER,
    ) -> None:
        self._open_backend = open_backend
        self._job_pids = job_pids
        self.interval = interval
        self.linger = linger
        self.hidden = hidepid()
        self._history: list[Snapshot] = []
        self.answers: dict[Any, bytes] = {}  # documents made for callers (``document``)
        self._recent: dict[Any, tuple[Caller, dict[str, str]]] = {}  # asked for lately
        self._asked = 0.0  # monotonic time of the last request
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuwarden-snapshot", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def history(self) -> list[Snapshot]:
        """The snapshots kept, oldest first; marks a request (which keeps them fresh)."""
        self._asked = time.monotonic()
        self._wake.set()
        return list(self._history)

    def document(self, caller: Caller, history: list[Snapshot], query: Mapping[str, str]) -> bytes:
        """``_document``, made once per snapshot, caller and query: the keeper makes
        those asked for lately as soon as it takes a snapshot, so that a client polling
        (``watch``) finds its answer made."""
        who = (
            (True,) if caller.root else (False, caller.uid, caller.user, caller.gid, caller.groups)
        )
        asked = (who, tuple(sorted(query.items())))
        key = (history[-1].taken_at, len(history), asked)
        doc = self.answers.get(key)
        if doc is None:
            doc = _document(caller, history, query, self.hidden)
            if len(self.answers) >= 64:
                self.answers.clear()
            self.answers[key] = doc
        if asked not in self._recent and len(self._recent) >= 16:
            self._recent.clear()
        self._recent[asked] = (caller, dict(query))
        return doc

    def max_age(self) -> float:
        """How old the newest snapshot may be and still be served."""
        return max(3 * self.interval, 5.0)

    def _run(self) -> None:
        from gpuwarden.observe.snapshot import take_snapshot, with_daemon_jobs

        backend: Backend | None = None
        try:
            while not self._stop.is_set():
                self._wake.wait()
                self._wake.clear()
                while not self._stop.is_set() and time.monotonic() - self._asked < self.linger:
                    started = time.monotonic()
                    try:
                        if backend is None:
                            backend = self._open_backend()
                        snap = with_daemon_jobs(take_snapshot(backend), self._job_pids())
                        history = [*self._history[-(KEEP - 1) :], snap]
                        self.answers = {}
                        for caller, query in list(self._recent.values()):
                            self.document(caller, history, query)
                        self._history = history
                    except Exception:  # a GPU gone wrong: the client takes its own
                        log.warning("snapshot for status failed", exc_info=True)
                        self._history = []
                    self._stop.wait(max(self.interval - (time.monotonic() - started), 0.1))
        finally:
            if backend is not None:
                backend.close()


def _indices(raw: str | None) -> tuple[int, ...]:
    from gpuwarden.errors import UsageError

    if raw is None:
        return ()
    parts = raw.split(",")
    if not all(p.isascii() and p.isdigit() and len(p) < 6 for p in parts):
        raise UsageError("gpu must be GPU indices separated by commas")
    return tuple(int(p) for p in parts)


def _compact(value: Any) -> bytes:
    """JSON as ``status --json`` prints it into a pipe (``cli.plain.emit_json``)."""
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def _document(
    caller: Caller,
    history: list[Snapshot],
    query: Mapping[str, str],
    hidden: tuple[bool, int | None],
) -> bytes:
    """``status --json``'s document for ``caller`` (``view=status``, filtered by ``gpu``,
    ``user``, ``pid``; its leaks those of the latest snapshot, or with ``leaks=true``
    those found in every snapshot kept), ``status``'s screen drawn from it (``view=table``,
    for ``width`` columns, ``colour=1`` styled: one JSON string, the lines the client
    prints; drawn once per snapshot, so ``watch gpuwarden status`` parses no document),
    or ``leaks --json``'s (``view=leaks``: the leaks found in every snapshot kept, the
    persistence rule of ``leaks``)."""
    from gpuwarden.observe.jsonview import snapshot_json
    from gpuwarden.observe.leaks import find_leaks

    mine = [for_caller(s, caller, hidden) for s in history]
    if query.get("view") == "leaks":
        return _compact({"leaks": [lk.to_json() for lk in find_leaks(mine)]})
    pid, user = query.get("pid"), query.get("user") or None
    leaks = find_leaks(mine if query.get("leaks") == "true" else mine[-1:])
    doc = snapshot_json(
        mine[-1], leaks, gpus=_indices(query.get("gpu")), user=user, pid=int(pid) if pid else None
    )
    if query.get("view") == "table":  # the screen itself: the client prints it as it is
        from gpuwarden.render.ink import Ink
        from gpuwarden.render.statusview import render_doc

        return _compact(
            "".join(
                line + "\n"
                for line in render_doc(
                    doc,
                    matching=bool(user or pid),
                    width=int(query["width"]),
                    ink=Ink(query.get("colour") == "1"),
                )
            )
        )
    return _compact(doc)


def _check(query: Mapping[str, str]) -> None:
    from gpuwarden.errors import UsageError

    _indices(query.get("gpu"))
    pid = query.get("pid")
    if pid is not None and not (pid.isascii() and pid.isdigit() and 0 < int(pid) < 2**31):
        raise UsageError("pid must be a process id")
    if query.get("leaks", "false") not in ("true", "false"):
        raise UsageError("leaks must be true or false")
    view = query.get("view", "status")
    if view not in ("status", "leaks", "table"):
        raise UsageError("view must be status, leaks or table")
    width = query.get("width")
    if view == "table" and not (
        width and width.isascii() and width.isdigit() and 20 <= int(width) <= MAX_WIDTH
    ):
        raise UsageError(f"width must be a number of columns, 20 to {MAX_WIDTH}")
    if query.get("colour", "0") not in ("0", "1"):
        raise UsageError("colour must be 0 or 1")


def answer(
    caller: Caller,
    keeper: SnapshotKeeper,
    query: Mapping[str, str],
    drains: Callable[[Caller], dict[str, Any]] | None = None,
) -> bytes:
    """The body of ``GET /v1/snapshot``: every GPU index, the drained GPUs and, last,
    the document (``_document``) byte for byte as the command prints it into a pipe, so
    a client can pass it on unparsed; a null snapshot when none is young enough."""
    _check(query)
    history = keeper.history()
    if not history or time.time() - history[-1].taken_at > keeper.max_age():
        return _compact(
            {
                "backend": None,
                "taken_at": None,
                "gpus": [],
                "samples": len(history),
                "span": 0.0,
                "drains": [],
                "snapshot": None,
            }
        )
    doc = keeper.document(caller, history, query)
    last = history[-1]
    meta = _compact(
        {
            "backend": last.backend,
            "taken_at": last.taken_at,
            "gpus": [g.index for g in last.gpus],
            "samples": len(history),
            "span": last.taken_at - history[0].taken_at,
            "drains": [] if drains is None else drains(caller)["drains"],
        }
    )
    return meta[:-1] + b',"snapshot":' + doc + b"}"


KEEPER = web.AppKey("snapshot_keeper", SnapshotKeeper)


async def snapshot_route(request: web.Request) -> web.Response:
    from gpuwarden.daemon.api import SERVICE, call
    from gpuwarden.daemon.connections import caller_of

    body = await call(
        answer,
        caller_of(request),
        request.app[KEEPER],
        dict(request.query),
        request.app[SERVICE].drains.list,
    )
    return web.Response(body=body, content_type="application/json")


def add_snapshot_route(app: web.Application, keeper: SnapshotKeeper) -> None:
    """Serve ``keeper``'s snapshots; its thread runs from the app's start to its cleanup."""
    app[KEEPER] = keeper
    app.router.add_get("/v1/snapshot", snapshot_route)

    async def start(_: web.Application) -> None:
        keeper.start()

    async def close(_: web.Application) -> None:
        keeper.close()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
