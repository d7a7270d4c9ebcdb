"""What the web page shows, as JSON built from the daemon's store: the overview (memory
history per GPU, leak periods, the queue) and one job's page. Anonymous viewers (the
public ``web_listen`` address) see no command lines, working directories or keys:
those can hold paths and secrets."""

from __future__ import annotations

import time
from typing import Any

from gpuwarden.daemon import model
from gpuwarden.daemon.history import job_timeline, leak_periods, series
from gpuwarden.daemon.model import Job
from gpuwarden.daemon.store import Store
from gpuwarden.errors import UsageError

MAX_HOURS = 24 * 30
PRIVATE = ("command", "cwd", "key", "env", "after")
RECENT = 20  # ended jobs listed under the queue


def job_json(job: Job, *, anonymous: bool) -> dict[str, Any]:
    out = job.to_json()
    if anonymous:
        for name in PRIVATE:
            out.pop(name, None)
    return out


def parse_hours(raw: str | None, default: float = 6.0) -> float:
    try:
        hours = float(raw) if raw is not None else default
    except ValueError:
        raise UsageError("hours must be a number") from None
    if not 0 < hours <= MAX_HOURS:
        raise UsageError(f"hours must be more than 0 and at most {MAX_HOURS}")
    return hours


def overview(store: Store, *, hours: float, by: str = "job", anonymous: bool,
             now: float | None = None, points: int = 360) -> dict[str, Any]:
    """Memory per GPU over the last ``hours`` stacked ``by`` job or user, leak periods,
    the queue (everything not ended) and the latest ended jobs."""
    if by not in ("job", "user"):
        raise UsageError("by must be 'job' or 'user'")
    now = time.time() if now is None else now
    samples = store.samples(now - hours * 3600)
    ids = sorted({jid for s in samples for jid in s.jobs})
    owners = {j.id: j.user for j in store.list(ids=ids)} if ids else {}
    gpus = []
    for s in series(samples, owners, by=by, points=points):
        gpus.append({"index": s.index, "uuid": s.uuid, "total": s.total, "t": s.t,
                     "used": s.used, "leaked": s.leaked, "layers": s.layers,
                     "leak_periods": leak_periods(s.t, s.leaked)})
    live = [s for s in model.STATES if s not in model.TERMINAL]
    queue = store.list(states=live)
    ended = store.list(states=sorted(model.TERMINAL), limit=RECENT, newest=True)
    return {"now": now, "hours": hours, "by": by, "gpus": gpus,
            "queue": [job_json(j, anonymous=anonymous) for j in queue],
            "recent": [job_json(j, anonymous=anonymous) for j in ended]}


def job_page(store: Store, job_id: int, *, anonymous: bool) -> dict[str, Any]:
    """One job: its record and events, and its memory over its run (fullest GPU)."""
    job = store.get(job_id)
    since = job.started_at if job.started_at is not None else job.submitted_at
    until = job.ended_at + 60 if job.ended_at is not None else None
    timeline = job_timeline(store.samples(since - 60, until, job_id=job_id), job_id)
    return {"job": job_json(job, anonymous=anonymous), "timeline": timeline,
            "budget": job.budget if job.budget is not None else job.request,
            "limit": job.cap()}
