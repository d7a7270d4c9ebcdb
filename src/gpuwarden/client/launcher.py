"""The launcher's side of an attached job (daemon/attached.py is the daemon's): a process
that starts a GPU command itself — a Ray node's gpuwarden entrypoint — registers it with
the node's daemon, waits for the daemon to place it, starts it, and reports its end.
The job then shows in the node's ``ps``, ``status``, leaks and metrics like any other,
and its memory counts against the node's queue."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuwarden.client.api import Client, DaemonUnavailable
from gpuwarden.errors import GpuwardenError

if TYPE_CHECKING:
    from gpuwarden.client.views import JobDoc

REGISTER_ENV = "GPUWARDEN_REGISTER"  # "0": never register with the node's daemon
REPORT_PATIENCE = 60.0  # seconds a request is retried while the daemon restarts


class NotPlaced(GpuwardenError):
    """The daemon ended the job before placing it (cancelled, infeasible)."""


def node_daemon(env: dict[str, str] | None = None) -> Client | None:
    """The daemon of this machine, when one answers on the socket this environment
    resolves to (``client/paths.py``); None where there is none or registering is off."""
    from gpuwarden.client.paths import resolve_paths

    env = dict(os.environ if env is None else env)
    if env.get(REGISTER_ENV) == "0":
        return None
    paths = resolve_paths(env)
    if not paths.socket.exists():
        return None
    client = Client(str(paths.socket))
    return client if client.alive() else None


class AttachedJob:
    """One job this process registered with the node's daemon."""

    def __init__(self, client: Client, job: JobDoc) -> None:
        self.client = client
        self.job = job

    @property
    def id(self) -> int:
        return int(self.job["id"])

    @classmethod
    def register(
        cls,
        client: Client,
        *,
        command: Sequence[str],
        label: str,
        mem: int,
        gpu_ids: Sequence[int],
        name: str | None = None,
        qos: str = "burstable",
        priority: int = 0,
    ) -> AttachedJob:
        body = {
            "command": list(command),
            "attach": label,
            "mem": mem,
            "gpus": len(gpu_ids),
            "gpu_ids": sorted(gpu_ids),
            "qos": qos,
            "priority": priority,
            "cwd": os.getcwd(),
            "name": name,
        }
        return cls(
            client,
            client.request(
                "POST", "/v1/jobs", body={k: v for k, v in body.items() if v is not None}
            ),
        )

    def wait_placed(self, poll: float = 0.2) -> JobDoc:
        """Block until the daemon has reserved the job's memory, and return the job
        then. Raises NotPlaced when it ended instead (cancelled, infeasible)."""
        down_since: float | None = None
        while True:
            try:
                job = self.client.job(self.id)
            except DaemonUnavailable:  # restarting: the job is in its database
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > REPORT_PATIENCE:
                    raise
                time.sleep(1.0)
                continue
            down_since = None
            self.job = job
            if job["state"] in ("reserved", "running"):
                return job.copy()
            if job["state"] not in ("queued", "held"):
                raise NotPlaced(
                    f"the node's gpuwarden daemon did not place job {self.id}: "
                    f"{job['state']} ({job.get('reason') or 'no reason given'})"
                )
            time.sleep(poll)

    def started(self, pid: int) -> None:
        self.job = self.client.request("POST", f"/v1/jobs/{self.id}/started", body={"pid": pid})

    def ended(
        self,
        *,
        exit_code: int | None,
        signal: int | None = None,
        reason: str = "exited",
        tree_clean: bool = True,
        survivors: Sequence[int] = (),
        output: str = "",
    ) -> None:
        """Report the end; retried for a while, since a daemon restarting now would
        otherwise record the job as lost."""
        body = {
            "exit_code": exit_code,
            "signal": signal,
            "reason": reason,
            "tree_clean": tree_clean,
            "survivors": list(survivors),
            "output": output,
        }
        deadline = time.monotonic() + REPORT_PATIENCE
        while True:
            try:
                self.job = self.client.request("POST", f"/v1/jobs/{self.id}/ended", body=body)
                return
            except DaemonUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)

    def cancel(self) -> None:
        """Leave before the start (the launcher itself is stopping)."""
        self.client.request("POST", f"/v1/jobs/{self.id}/cancel")
