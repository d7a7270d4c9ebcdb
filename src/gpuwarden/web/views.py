"""What the web page shows, as JSON built from the daemon's store: the overview (memory
history per GPU, leak periods, the queue) and one job's page. Anonymous viewers (the
public ``web_listen`` address) see no command lines (the job's, its --notify, its health
check), working directories or keys, nor reasons, comments and event details: those can
hold paths, pids and secrets."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuwarden.daemon import jobjson
from gpuwarden.daemon.history import job_timeline, leak_periods, series
from gpuwarden.daemon.store import Store
from gpuwarden.errors import UsageError
from gpuwarden.jobs import model
from gpuwarden.jobs.model import Job
from gpuwarden.jobs.request import OPTION_DEFAULTS

WINDOWS = (1, 6, 24)  # hours: the page's buttons
PRIVATE = ("command", "cwd", "key", "env", "after", "after_any", "after_fail", "notify")
# A service's health check is a command line or a URL (which may carry a token).
PRIVATE_SERVICE = ("health_cmd", "health_url")
# Free text that may name paths and pids (a reason, an event's detail, what a hold saw):
# anonymous viewers get the words' absence, not the words.
PRIVATE_TEXT = ("reason",)
# The options document's fields (jobs/request.OPTIONS: --comment and those to come) are
# the user's own words, for those who may run `show`: not for anonymous viewers.
PRIVATE_OPTIONS = tuple(OPTION_DEFAULTS)
RELEASE_TEXT = ("how", "leak", "said")
RECENT = 20  # ended jobs listed under the queue


def job_json(job: Job, *, anonymous: bool) -> dict[str, Any]:
    out: dict[str, Any] = {**jobjson.job_json(job)}  # its own document: keys may go
    if anonymous:
        for name in PRIVATE:
            out.pop(name, None)
        for name in (*PRIVATE_TEXT, *PRIVATE_OPTIONS):
            out[name] = None
        out["events"] = [{**e, "detail": None} for e in out.get("events", [])]
        if isinstance(out.get("service"), dict):
            out["service"] = {
                k: None if k in PRIVATE_SERVICE else v for k, v in out["service"].items()
            }
        release = out.get("memory_release")
        if isinstance(release, dict):  # how it ended and what held it: pids, names
            out["memory_release"] = {
                k: None if k in RELEASE_TEXT else v for k, v in release.items()
            }
    return out


def parse_hours(raw: str | None, default: float = 6.0) -> float:
    """One of the page's windows (``WINDOWS``): anyone's input on ``web_listen``, and a
    window of its own costs the daemon a chart drawn from every sample in it."""
    if raw is None:
        return default
    try:
        hours = float(raw)
    except ValueError:
        hours = math.nan
    if hours not in WINDOWS:
        raise UsageError(f"hours must be one of {', '.join(map(str, WINDOWS))}")
    return hours


class ChartCache:
    """History charts kept for as long as one of their points lasts. A chart of
    ``hours`` in ``points`` points cannot change visibly sooner (a 24-hour chart has
    4-minute points), while drawing it reads every sample of the window: about 1 s of CPU
    for 24 hours of 8 GPUs, in the daemon, for each page refresh (10 s) of each viewer.
    Each chart is drawn once at a time, so viewers who ask for it together share one
    draw, while a chart of another window or grouping never waits for it; at most
    ``size`` are kept."""

    def __init__(self, size: int = 16, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.clock = clock
        self._lock = threading.Lock()  # the dicts only, never held while drawing
        self._drawing: dict[tuple[float, str, int], threading.Lock] = {}
        self._charts: dict[tuple[float, str, int], tuple[float, list[dict[str, Any]]]] = {}

    def _fresh(self, key: tuple[float, str, int], ttl: float) -> list[dict[str, Any]] | None:
        with self._lock:
            hit = self._charts.get(key)
        return hit[1] if hit is not None and self.clock() - hit[0] < ttl else None

    def get(
        self, key: tuple[float, str, int], ttl: float, draw: Callable[[], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        hit = self._fresh(key, ttl)
        if hit is not None:
            return hit
        with self._lock:
            drawing = self._drawing.setdefault(key, threading.Lock())
        with drawing:
            hit = self._fresh(key, ttl)  # drawn by the viewer we waited for
            if hit is not None:
                return hit
            chart = draw()
            with self._lock:
                self._charts.pop(key, None)
                self._charts[key] = (self.clock(), chart)
                while len(self._charts) > self.size:  # the oldest drawn goes first
                    old = next(iter(self._charts))
                    del self._charts[old]
                    if old != key:
                        self._drawing.pop(old, None)
            return chart


def charts(store: Store, *, hours: float, by: str, now: float, points: int) -> list[dict[str, Any]]:
    """Per GPU: its memory over the window, stacked ``by`` job or user, and leak periods."""
    samples = store.samples(now - hours * 3600)
    ids = sorted({jid for s in samples for jid in s.jobs})
    owners = (
        {j.id: j.user for j in store.list(ids=ids, with_events=False, with_env=False)}
        if ids
        else {}
    )
    return [
        {
            "index": s.index,
            "uuid": s.uuid,
            "total": s.total,
            "t": s.t,
            "used": s.used,
            "leaked": s.leaked,
            "layers": s.layers,
            "leak_periods": leak_periods(s.t, s.leaked),
        }
        for s in series(samples, owners, by=by, points=points)
    ]


def overview(
    store: Store,
    *,
    hours: float,
    by: str = "job",
    anonymous: bool,
    now: float | None = None,
    points: int = 360,
    cache: ChartCache | None = None,
) -> dict[str, Any]:
    """Memory per GPU over the last ``hours`` stacked ``by`` job or user, leak periods,
    the queue (everything not ended) and the latest ended jobs. With a ``cache`` the
    charts may be as old as one of their points; the queue is always read now."""
    if by not in ("job", "user"):
        raise UsageError("by must be 'job' or 'user'")
    now = time.time() if now is None else now
    at = now

    def draw() -> list[dict[str, Any]]:
        return charts(store, hours=hours, by=by, now=at, points=points)

    gpus = draw() if cache is None else cache.get((hours, by, points), hours * 3600 / points, draw)
    live = [s for s in model.STATES if s not in model.TERMINAL]
    queue = store.list(states=live, with_env=False)  # the page never shows one
    ended = store.list(states=sorted(model.TERMINAL), limit=RECENT, newest=True, with_env=False)
    drains = [
        {"gpu": i, "reason": None if anonymous else d["reason"]} for i, d in store.drains().items()
    ]  # gpu drain: no new placement there
    return {
        "now": now,
        "hours": hours,
        "by": by,
        "gpus": gpus,
        "drains": drains,
        "queue": [job_json(j, anonymous=anonymous) for j in queue],
        "recent": [job_json(j, anonymous=anonymous) for j in ended],
    }


def job_page(store: Store, job_id: int, *, anonymous: bool) -> dict[str, Any]:
    """One job: its record and events, and its memory over its run (fullest GPU)."""
    job = store.get(job_id)
    since = job.started_at if job.started_at is not None else job.submitted_at
    until = job.ended_at + 60 if job.ended_at is not None else None
    timeline = job_timeline(store.samples(since - 60, until, job_id=job_id), job_id)
    return {
        "job": job_json(job, anonymous=anonymous),
        "timeline": timeline,
        "budget": job.budget if job.budget is not None else job.request,
        "limit": job.cap(),
    }
