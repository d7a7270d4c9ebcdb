"""A glance at the daemon for a view that works without one: the running jobs' pids and
the drained GPUs, when a daemon answers at once, else nothing. Shared by the CLI's
one-shot views and ``top`` (``doctor`` names the processes that are jobs' from it)."""

from __future__ import annotations

from typing import Any

DAEMON_GLANCE = 1.0  # seconds a view waits for the daemon's answer before doing without


def _glance(path: str) -> Any:
    """The daemon's answer to GET ``path`` when one answers at once; None when none does
    (no socket: the HTTP client is not even imported, a standalone view's start-up).
    Never starts a daemon, never fails a view."""
    from gpuwarden.client.paths import resolve_paths
    from gpuwarden.errors import GpuwardenError

    try:
        sock = resolve_paths().socket
        if not sock.exists():
            return None
        from gpuwarden.client.api import Client

        return Client(str(sock), timeout=DAEMON_GLANCE).request("GET", path)
    except (GpuwardenError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def daemon_job_pids() -> dict[int, int] | None:
    """pid -> job id of the running jobs, from the daemon (one request); None when none
    answers."""
    answer = _glance("/v1/job-pids")
    try:
        return {int(pid): int(job) for pid, job in answer["pids"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def daemon_drains() -> list[dict[str, Any]]:
    """The GPUs an admin drained (``gpu drain``), from the daemon; none when none answers."""
    answer = _glance("/v1/drains")
    try:
        return [dict(d) for d in answer["drains"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []
