"""Submitting gpuwarden jobs to a Ray cluster through Ray's job API, and reading the
cluster's budgets back (``gpuwarden cluster status``)."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import Any

from gpuwarden.errors import BackendUnavailable, UsageError
from gpuwarden.ray.shares import GPU_MIB_RESOURCE, MEM_RESOURCE, ask, smallest_gpu
from gpuwarden.units import MiB

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
METADATA = "gpuwarden"  # metadata key marking gpuwarden jobs
AGENT_PATIENCE = 30.0  # seconds a submission waits for the cluster's job agent to be up


def dashboard_address(cluster: str | None) -> str:
    """``ray`` (RAY_ADDRESS when it is an http address, else the local default),
    ``ray://HOST:PORT`` or ``http://HOST:PORT``: the Ray dashboard the job API is on."""
    spec = (cluster or "ray").strip()
    if spec == "ray":
        env = os.environ.get("RAY_ADDRESS", "")
        return env if env.startswith("http") else DEFAULT_DASHBOARD
    if spec.startswith("ray://"):
        return "http://" + spec[len("ray://") :]
    if spec.startswith(("http://", "https://")):
        return spec
    raise UsageError(
        f"invalid --cluster {cluster!r}: use ray, ray://HOST:PORT (the Ray "
        "dashboard) or http://HOST:PORT"
    )


def _ray() -> Any:
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise BackendUnavailable("this needs Ray: pip install 'gpuwarden[ray]'") from None
    return JobSubmissionClient


def _client(address: str) -> Any:
    client_cls = _ray()
    try:
        return client_cls(address)
    except Exception as e:  # Ray raises ConnectionError and friends
        raise BackendUnavailable(
            f"no Ray cluster at {address}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def node_totals(address: str) -> list[dict[str, Any]]:
    """Alive nodes with their resource totals, from Ray's state API."""
    _ray()
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(address=address, detail=True)
    except Exception as e:
        raise BackendUnavailable(
            f"cannot list the nodes of {address}: {str(e).splitlines()[0]}"
        ) from None
    return [
        {
            "node_id": n.node_id,
            "ip": n.node_ip,
            "name": n.node_name,
            "resources": dict(n.resources_total or {}),
        }
        for n in nodes
        if n.state == "ALIVE"
    ]


def submit(
    address: str,
    *,
    mem: int,
    gpus: int,
    command: list[str],
    retries: int = 0,
    attempt: int = 0,
    name: str | None = None,
    env: dict[str, str] | None = None,
    qos: str | None = None,
    priority: int = 0,
    resources: dict[str, float] | None = None,
) -> str:
    """Submit ``command`` as a gpuwarden job: Ray places it by the memory share, the
    entrypoint enforces the budget on the node. ``qos`` and ``priority`` are its place in
    the queue of a node that runs a gpuwarden daemon; ``resources``, other Ray resources
    it needs. Returns Ray's submission id."""
    if not command:
        raise UsageError("no command given")
    client = _client(address)
    largest = smallest_gpu(n["resources"] for n in node_totals(address))
    req = ask(mem, gpus, largest)
    sid = f"gpuwarden_{secrets.token_hex(8)}"
    entry = [
        "python",
        "-m",
        "gpuwarden.ray.entry",
        "--mem",
        str(mem),
        "--gpus",
        str(gpus),
        "--retries",
        str(retries),
        "--attempt",
        str(attempt),
        "--submission-id",
        sid,
        "--priority",
        str(priority),
    ]
    if name:
        entry += ["--name", name]
    if qos:
        entry += ["--qos", qos]
    if resources:
        entry += ["--resources", json.dumps(resources, sort_keys=True)]
    entry += ["--", *command]
    env_vars = {"GPUWARDEN_RAY_DASHBOARD": address, **(env or {})}
    deadline = time.monotonic() + AGENT_PATIENCE
    while True:
        try:
            client.submit_job(
                submission_id=sid,
                entrypoint=shlex.join(entry),
                entrypoint_num_gpus=req.num_gpus,
                entrypoint_resources={**(resources or {}), **req.resources},
                runtime_env={"env_vars": env_vars},
                metadata={
                    METADATA: "1",
                    "mem": str(mem),
                    "gpus": str(gpus),
                    "attempt": str(attempt),
                    "name": name or "",
                    "qos": qos or "",
                },
            )
            return sid
        except Exception as e:
            # A cluster just started has no job agent up for some seconds; Ray says so
            # and asks to try again.
            if "try again later" in str(e) and time.monotonic() < deadline:
                time.sleep(1.0)
                continue
            raise BackendUnavailable(f"Ray refused the job: {str(e).splitlines()[0]}") from None


@dataclass(frozen=True)
class NodeBudgets:
    node_id: str
    ip: str
    gpus: float
    gpu_memory: int  # bytes, its smallest GPU (0: not advertised)
    memory: int  # bytes over its GPUs, as advertised
    in_use: int  # bytes of running gpuwarden jobs' budgets placed there
    jobs: list[str]

    @property
    def free(self) -> int:
        return max(0, self.memory - self.in_use)


def cluster_status(address: str) -> list[NodeBudgets]:
    """Per alive node: GPUs and GPU memory as advertised, the budgets of the gpuwarden
    jobs running there (from the job API: each job's driver node and metadata)."""
    client = _client(address)
    nodes = node_totals(address)
    try:
        jobs = client.list_jobs()
    except Exception as e:
        raise BackendUnavailable(f"cannot list the jobs of {address}: {e}") from None
    use: dict[str, list[tuple[str, int]]] = {}
    for j in jobs:
        meta = j.metadata or {}
        if meta.get(METADATA) != "1" or str(j.status) not in ("RUNNING", "JobStatus.RUNNING"):
            continue
        budget = int(meta.get("mem", 0)) * int(meta.get("gpus", 1))
        use.setdefault(j.driver_node_id or "", []).append((j.submission_id or "", budget))
    out = []
    for n in nodes:
        r = n["resources"]
        placed = use.get(n["node_id"], [])
        out.append(
            NodeBudgets(
                node_id=n["node_id"],
                ip=n["ip"],
                gpus=float(r.get("GPU", 0)),
                gpu_memory=int(r.get(GPU_MIB_RESOURCE, 0)) * MiB,
                memory=int(r.get(MEM_RESOURCE, 0)) * MiB,
                in_use=sum(b for _, b in placed),
                jobs=[sid for sid, _ in placed],
            )
        )
    return out


def node_snapshots(address: str, ips: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """Each node's own ``gpuwarden status --json``, run there as a tiny Ray job pinned by
    Ray's ``node:IP`` resource: {ip: the snapshot, or {"error": why}}."""
    client = _client(address)
    out: dict[str, Any] = {}
    sids: dict[str, str] = {}
    for ip in dict.fromkeys(ips):
        try:
            sids[ip] = client.submit_job(
                entrypoint="python -m gpuwarden status --json",
                entrypoint_num_cpus=0,
                entrypoint_resources={f"node:{ip}": 0.001},
                metadata={METADATA: "snapshot"},
            )
        except Exception as e:
            out[ip] = {"error": f"not submitted: {str(e).splitlines()[0][:200]}"}
    deadline = time.monotonic() + timeout
    for ip, sid in sids.items():
        status = "timed out"
        while time.monotonic() < deadline:
            status = str(client.get_job_status(sid)).rsplit(".", 1)[-1]
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.2)
        logs = str(client.get_job_logs(sid))
        try:
            out[ip] = json.loads(logs[logs.index("{") :])
        except ValueError:
            tail = logs.strip().splitlines()[-1:] or ["no output"]
            out[ip] = {"error": f"{status}: {tail[0][:200]}"}
    return out
