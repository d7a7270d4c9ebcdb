"""Word of a job's end: its ``--notify`` command, run as its user with the job's JSON on
standard input, and the admin's webhook (config ``[notify] webhook``), POSTed the same
JSON for every job. Both run in a few worker threads, never in a scheduling pass or a
request; their failures become the job's events at the next pass.

At most once: a notification handed over is not repeated, and one still waiting when
the daemon stops is dropped (the job's state and events stay in the store)."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gpuwarden.daemon.jobjson import job_json
from gpuwarden.daemon.usercmd import run_as
from gpuwarden.jobs.lifecycle import NOTIFY_FAILED, WEBHOOK_FAILED

if TYPE_CHECKING:
    from gpuwarden.jobs.model import Job

log = logging.getLogger("gpuwarden.notify")

COMMAND_TIMEOUT = 60.0  # seconds a --notify command may run
WEBHOOK_TIMEOUT = 10.0  # seconds one POST may take
WEBHOOK_DELAYS = (1.0, 4.0)  # before the second and third tries
WORKERS = 2
MAX_WAITING = 10_000  # notifications queued at most; past it new ones are dropped


def job_document(job: Job) -> bytes:
    """What both receive: the job as ``show --json`` gives it, without its environment."""
    return json.dumps(job_json(job), sort_keys=True).encode()


def post(
    url: str,
    body: bytes,
    *,
    timeout: float = WEBHOOK_TIMEOUT,
    delays: tuple[float, ...] = WEBHOOK_DELAYS,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """POST ``body`` (JSON) to ``url`` (no proxy), tried again after each of ``delays``
    while it fails; None once it is answered 2xx, else why the last try failed."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    why = "not tried"
    for delay in (0.0, *delays):
        if delay:
            sleep(delay)
        req = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "gpuwarden"},
        )
        try:
            with opener.open(req, timeout=timeout) as r:
                if 200 <= r.status < 300:
                    return None
                why = f"answered {r.status}"
        except urllib.error.HTTPError as e:
            why = f"answered {e.code}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = str(getattr(e, "reason", e))
    return f"webhook {url}: {why} ({1 + len(delays)} tries)"


class Notifier:
    """Takes ended jobs (``ended``, from any thread) and sends their word in worker
    threads; ``poll`` hands the failures found since to the pass, as events."""

    def __init__(self, webhook: str | None = None, workers: int = WORKERS) -> None:
        self.webhook = webhook
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._waiting = 0
        self._failures: list[tuple[int, str, str]] = []  # (job id, event kind, detail)

    def wanted(self, job: Job) -> bool:
        return job.spec.notify is not None or self.webhook is not None

    def ended(self, job: Job) -> None:
        """A job reached its final state: queue its notification, never waiting."""
        if not self.wanted(job):
            return
        with self._lock:
            if self._waiting >= MAX_WAITING:
                log.warning("notification of job %d dropped: %d waiting", job.id, self._waiting)
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, "notify")
            self._waiting += 1
            self._pool.submit(self._send, job)

    def _send(self, job: Job) -> None:
        try:
            body = job_document(job)
            if job.spec.notify is not None:
                why = run_as(
                    job, job.spec.notify, timeout=COMMAND_TIMEOUT, what="notify command", stdin=body
                )
                if why is not None:
                    self._failed(job.id, NOTIFY_FAILED, why)
            if self.webhook is not None:
                why = post(self.webhook, body)
                if why is not None:
                    self._failed(job.id, WEBHOOK_FAILED, why)
        except Exception as e:  # a notification that broke must not take a worker down
            self._failed(job.id, NOTIFY_FAILED, f"notification failed: {e}")
        finally:
            with self._lock:
                self._waiting -= 1

    def _failed(self, job_id: int, kind: str, why: str) -> None:
        log.warning("job %d: %s", job_id, why)
        with self._lock:
            self._failures.append((job_id, kind, why))

    def poll(self) -> list[tuple[int, str, str]]:
        """The failures since the last poll: (job id, event kind, detail)."""
        with self._lock:
            out, self._failures = self._failures, []
        return out

    def close(self, wait: float = 0.0) -> None:
        """Stop the workers; notifications not yet sent are dropped after ``wait``."""
        deadline = time.monotonic() + wait
        while wait and time.monotonic() < deadline:
            with self._lock:
                if not self._waiting:
                    break
            time.sleep(0.05)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
