"""Services: jobs with a restart policy (``submit --restart``). The rules of one place:
which ends a service restarts from, how long it backs off, when it is given up, and its
health checks, which run in threads beside the scheduling pass and never inside it."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpuwarden.daemon.usercmd import checked_command, checked_url, run_as
from gpuwarden.errors import UsageError
from gpuwarden.jobs.lifecycle import RESTARTED
from gpuwarden.jobs.services import (
    DEFAULT_GRACE,
    DEFAULT_INTERVAL,
    DEFAULT_LIMIT,
    DEFAULT_WINDOW,
    POLICIES,
    Service,
)
from gpuwarden.units import bounded_duration

if TYPE_CHECKING:
    from gpuwarden.jobs.model import Event, Job

BACKOFF_FIRST, BACKOFF_CAP = 1.0, 60.0  # seconds: 1 s, doubling, at most a minute
HEALTH_WORKERS = 4  # checks running at once, whatever the number of services


def parse_limit(raw: Any) -> tuple[int, float]:
    """``N/DURATION`` (``5/10m``): at most N restarts within that window."""
    if not isinstance(raw, str) or raw.count("/") != 1:
        raise UsageError("restart_limit must be N/DURATION, e.g. 5/10m")
    count, window = raw.split("/")
    if not count.strip().isdigit() or not 1 <= int(count) <= 1000:
        raise UsageError("restart_limit: N must be a whole number from 1 to 1000")
    return int(count), bounded_duration(window, "restart_limit window", positive=True)


SERVICE_FIELDS = frozenset(
    {"restart", "restart_limit", "health_cmd", "health_url", "health_interval", "health_grace"}
)


def service_from_request(body: Mapping[str, Any]) -> Service | None:
    """The submit request's restart policy and health check, validated (None: a batch
    job). Health checks and limits need a policy: nothing would act on them."""
    restart = body.get("restart")
    given = sorted(k for k in SERVICE_FIELDS - {"restart"} if body.get(k) is not None)
    if restart is None or restart == "no":
        if given:
            raise UsageError(f"{', '.join(given)} need(s) restart: on-failure or always")
        return None
    if restart not in POLICIES:
        raise UsageError("restart must be on-failure, always or no")
    limit, window = (
        (DEFAULT_LIMIT, DEFAULT_WINDOW)
        if body.get("restart_limit") is None
        else parse_limit(body["restart_limit"])
    )
    cmd, url = body.get("health_cmd"), body.get("health_url")
    if cmd is not None and url is not None:
        raise UsageError("give health_cmd or health_url, not both")
    if cmd is not None:
        checked_command(cmd, "health_cmd")
    if url is not None:
        checked_url(url, "health_url")
    interval = (
        DEFAULT_INTERVAL
        if body.get("health_interval") is None
        else bounded_duration(body["health_interval"], "health_interval", positive=True)
    )
    grace = (
        DEFAULT_GRACE
        if body.get("health_grace") is None
        else bounded_duration(body["health_grace"], "health_grace")
    )
    if (
        (body.get("health_interval") is not None or body.get("health_grace") is not None)
        and cmd is None
        and url is None
    ):
        raise UsageError("health_interval and health_grace need health_cmd or health_url")
    return Service(
        restart=restart,
        limit=limit,
        window=window,
        health_cmd=cmd,
        health_url=url,
        health_interval=interval,
        health_grace=grace,
    )


def recent_restarts(events: Iterable[Event], now: float, window: float) -> int:
    """Restarts within the window before ``now`` (read from the job's events, so a daemon
    restart keeps the count)."""
    return sum(1 for e in events if e.kind == RESTARTED and now - e.at < window)


def cancel_asked(events: Iterable[Event]) -> bool:
    """Whether a cancel was asked during the latest attempt: its end is then no restart,
    also when a health check or the watchdog was stopping it already."""
    for e in reversed(tuple(events)):
        if e.kind == "cancel_requested":
            return True
        if e.kind in ("placed", RESTARTED):
            return False
    return False


def backoff(recent: int) -> float:
    """Seconds before the next start: 1 s after the first restart in the window,
    doubling with each further one, at most a minute (a crash loop costs little)."""
    return min(BACKOFF_FIRST * 2.0**recent, BACKOFF_CAP)


# -- health checks -----------------------------------------------------------------------
def _run_cmd(job: Job, svc: Service) -> str | None:
    """Run the health command as the job's user; None when it exits 0, else why not."""
    assert svc.health_cmd is not None
    return run_as(job, svc.health_cmd, timeout=svc.health_timeout, what="health command")


def _get_url(svc: Service) -> str | None:
    """GET the health URL (no proxy); None when it answers 2xx, else why not."""
    assert svc.health_url is not None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(svc.health_url, timeout=svc.health_timeout) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"health URL {svc.health_url}: {reason}"
    return None if 200 <= code < 300 else f"health URL {svc.health_url} answered {code}"


def check(job: Job) -> str | None:
    """One health check of a running service: None when healthy, else what failed."""
    svc = job.spec.service
    if svc is None:
        return None
    if svc.health_cmd is not None:
        return _run_cmd(job, svc)
    if svc.health_url is not None:
        return _get_url(svc)
    return None


class HealthChecks:
    """Health checks of running services, in a few worker threads: each pass hands over
    the running jobs and takes the failures found since (``poll`` never waits)."""

    def __init__(self, workers: int = HEALTH_WORKERS) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._workers = workers
        self._inflight: dict[tuple[int, int], Future[str | None]] = {}
        self._last: dict[tuple[int, int], float] = {}  # (job, attempt) -> last check began
        self._lock = threading.Lock()

    def poll(self, running: Iterable[Job], now: float) -> list[tuple[Job, str]]:
        """Failures of checks that finished, for jobs still in this attempt; and new
        checks started for services whose grace is over and whose interval came round."""
        jobs = {
            (j.id, j.attempts): j
            for j in running
            if j.spec.service is not None
            and j.started_at is not None
            and (j.spec.service.health_cmd or j.spec.service.health_url)
        }
        failed: list[tuple[Job, str]] = []
        with self._lock:
            for key, fut in list(self._inflight.items()):
                if not fut.done():
                    continue
                del self._inflight[key]
                try:
                    why = fut.result()
                except Exception as e:  # a check that broke is a failed check
                    why = f"health check failed: {e}"
                if why is not None and key in jobs:
                    failed.append((jobs[key], why))
            failing = {(j.id, j.attempts) for j, _ in failed}  # being stopped now
            for key in [k for k in self._last if k not in jobs]:
                del self._last[key]  # ended attempts
            for key, j in jobs.items():
                svc = j.spec.service
                assert svc is not None and j.started_at is not None
                if (
                    key in self._inflight
                    or key in failing
                    or now - j.started_at < svc.health_grace
                    or now - self._last.get(key, float("-inf")) < svc.health_interval
                ):
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._workers, "health")
                self._last[key] = now
                self._inflight[key] = self._pool.submit(check, j)
        return failed

    @property
    def busy(self) -> bool:
        """Whether checks are in flight or remembered (a pass without services still
        settles them)."""
        return bool(self._inflight or self._last)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
