"""The entrypoint of a gpuwarden job on a Ray node: ``python -m gpuwarden.ray.entry``.

Ray has placed the job and set CUDA_VISIBLE_DEVICES; this process adds what Ray does not
do: the command starts the way gpuwarden starts any job (``launch.plan_launch``: the
PyTorch cap at the budget, CPU affinity to the GPUs' NUMA node), in its own session
under this process as a child subreaper, so that when it ends every process it left is
killed and the GPU memory is checked to be back. A CUDA OOM with retries left is
submitted again through Ray's job API with a bigger budget (``sched.oom.after_oom``), so
Ray places the retry by the new budget. Where the node runs a gpuwarden daemon, the job
is registered with it (``client/launcher.py``) and starts once the daemon has placed it;
a job the daemon preempts is submitted again through Ray, as the daemon requeues its own."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import IO, TYPE_CHECKING

from gpuwarden.errors import GpuwardenError
from gpuwarden.jobs.request import QOS_CLASSES
from gpuwarden.procs.tree import become_subreaper, end_descendants
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.client.launcher import AttachedJob
    from gpuwarden.gpus.model import GpuFacts

DASHBOARD_ENV = "GPUWARDEN_RAY_DASHBOARD"  # where retries are submitted


def _say(message: str) -> None:
    print(f"gpuwarden: {message}", file=sys.stderr, flush=True)


def _pump(src: IO[bytes], dst: IO[bytes], tail: deque[bytes]) -> None:
    for line in iter(src.readline, b""):
        dst.write(line)
        dst.flush()
        tail.append(line)


def _memory_back(pids: set[int], timeout: float = 10.0) -> float | None:
    """Seconds until no process of the job is listed on a GPU (None: still listed)."""
    from gpuwarden.gpus.backend import open_backend

    started = time.monotonic()
    backend = open_backend()
    try:
        while True:
            listed = {p.pid for p in backend.processes()} & pids
            if not listed:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                return None
            time.sleep(0.1)
    finally:
        backend.close()


class _Stopped(Exception):
    """The job was stopped before its command started."""


class _Stop:
    """SIGTERM and SIGINT: Ray stopping the job, or the node's daemon cancelling or
    preempting it. While the job waits for the daemon they end the wait; once the
    command runs they go to its process group."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.child: int | None = None
        self.waiting = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)

    def __call__(self, sig: int, _frame: object) -> None:
        self.signals.append(sig)
        if self.child is not None:
            self.forward()
        elif self.waiting:
            raise _Stopped(signal.Signals(sig).name)

    def forward(self) -> None:
        if self.child is not None and self.signals:
            with contextlib.suppress(OSError):
                os.killpg(self.child, self.signals[-1])


@dataclass(frozen=True)
class Request:
    """What the job was submitted with: enough to submit it again (an OOM retry, a
    preemption)."""

    mem: int  # bytes per GPU
    gpus: int
    command: list[str]
    retries: int = 0
    attempt: int = 0
    name: str | None = None
    qos: str | None = None
    priority: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    submission_id: str | None = None


def _register(
    req: Request, gpus: list[GpuFacts], stop: _Stop
) -> tuple[AttachedJob | None, int, frozenset[int] | None]:
    """Register the job with this node's gpuwarden daemon, if one runs, and wait until it
    places it: (the attached job, the budget to run with, the cores it holds)."""
    from gpuwarden.client.launcher import AttachedJob, node_daemon

    client = node_daemon()
    if client is None:
        return None, req.mem, None
    label = f"ray job {req.submission_id}" if req.submission_id else "ray job"
    job = AttachedJob.register(
        client,
        command=req.command,
        label=label,
        mem=req.mem,
        gpu_ids=[g.index for g in gpus],
        name=req.name,
        qos=req.qos or "burstable",
        priority=req.priority,
    )
    _say(f"registered as job {job.id} with this node's gpuwarden daemon")
    stop.waiting = True
    try:
        if stop.signals:
            raise _Stopped(signal.Signals(stop.signals[-1]).name)
        placed = job.wait_placed()
    except _Stopped:
        with contextlib.suppress(GpuwardenError):
            job.cancel()
        raise
    finally:
        stop.waiting = False
    enf = placed.get("enforcement")  # absent from an older daemon's answer
    limit = (enf.get("limit") if enf else None) or placed.get("budget") or req.mem
    cores = frozenset(placed.get("cpu_set") or ()) or None
    where = [e.get("detail") for e in placed.get("events", []) if e.get("kind") == "placed"]
    _say(f"job {job.id} placed by the daemon" + (f": {where[-1]}" if where else ""))
    return job, int(limit), cores


def run(req: Request) -> int:
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.gpus.visible import visible_gpus
    from gpuwarden.launch import apply_affinity, plan_launch, probe_host

    backend = open_backend()
    try:
        gpus = visible_gpus(backend.gpus(), os.environ)
    finally:
        backend.close()
    if len(gpus) < req.gpus:
        raise GpuwardenError(
            f"Ray gave this job {len(gpus)} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
            f"it asked for {req.gpus}"
        )
    gpus = gpus[: req.gpus]
    stop = _Stop()
    stop.install()
    try:
        attached, limit, cores = _register(req, gpus, stop)
    except _Stopped as e:
        _say(f"stopped ({e}) while waiting for this node's gpuwarden daemon")
        return 128 + signal.SIGTERM
    env = dict(os.environ)
    if attached is not None:
        env.update(GPUWARDEN_JOB=str(attached.id), GPUWARDEN_BUDGET=str(limit))
    plan = plan_launch(
        req.command, gpus, base_env=env, host=probe_host(env), mem_limit=limit, cores=cores
    )
    _say(f"attempt {req.attempt + 1}: {plan.describe()}" + "".join(f"; {n}" for n in plan.notes))
    become_subreaper()  # orphans of the job stay ours, so none escapes the clean-up
    cpus = plan.cpus

    def prepare() -> None:
        if cpus is not None:
            apply_affinity(cpus)

    tail: deque[bytes] = deque(maxlen=200)
    if stop.signals:  # stopped between the placement and here
        _say("stopped before the command started")
        if attached is not None:
            attached.ended(exit_code=None, reason="cancelled")
        return 128 + signal.SIGTERM
    try:
        child = subprocess.Popen(
            list(plan.argv),
            env=plan.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=prepare,
        )
    except OSError as e:
        why = f"cannot start {plan.argv[0]}: {e.strerror or e}"
        _say(why)
        status = 127 if isinstance(e, FileNotFoundError) else 126
        if attached is not None:
            attached.ended(exit_code=status, reason=why)
        return status
    stop.child = child.pid
    stop.forward()  # a signal that came while it was starting
    assert child.stdout is not None and child.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, tail)),
        threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, tail)),
    ]
    for t in pumps:
        t.start()
    if attached is not None:
        attached.started(child.pid)
    code = child.wait()
    left, stuck = end_descendants(grace=3.0, kill_wait=3.0)  # what the job left
    seen = {child.pid} | set(left)
    for t in pumps:
        t.join(timeout=5)
    output = b"".join(tail).decode(errors="replace")
    status = code if code >= 0 else 128 - code
    if attached is not None:
        attached.ended(
            exit_code=status,
            signal=-code if code < 0 else None,
            reason="cancelled" if stop.signals else "exited",
            tree_clean=not stuck,
            survivors=stuck,
            output=output,
        )
    back = _memory_back(seen)
    _say(
        f"exit {code}; "
        + (
            f"its GPU memory is back ({back:.2f} s after the end)"
            if back is not None
            else "its processes are still listed on a GPU 10 s after the end"
        )
    )
    if (
        attached is not None
        and stop.signals
        and any(e.get("kind") == "preempted" for e in attached.job.get("events", []))
    ):
        _submit_again(req, "preempted by this node's gpuwarden daemon")
    elif code != 0 and not stop.signals:
        _maybe_retry(output, replace(req, mem=limit), largest=min(g.memory_total for g in gpus))
    return status


def _submit_again(req: Request, why: str) -> None:
    dashboard = os.environ.get(DASHBOARD_ENV)
    if not dashboard:
        _say(f"{why}; not submitted again: {DASHBOARD_ENV} is not set")
        return
    from gpuwarden.ray.submit import submit

    sid = submit(
        dashboard,
        mem=req.mem,
        gpus=req.gpus,
        command=req.command,
        retries=req.retries,
        attempt=req.attempt,
        name=req.name,
        qos=req.qos,
        priority=req.priority,
        resources=req.resources,
    )
    _say(f"{why}; submitted again as Ray job {sid} with {format_bytes(req.mem)} per GPU")


def _maybe_retry(output: str, req: Request, *, largest: int) -> None:
    from gpuwarden.sched.oom import GiveUp, after_oom, oom_signature

    signature = oom_signature(output)
    if signature is None:
        return
    decision = after_oom(
        old_budget=req.mem,
        peak=None,
        largest=largest,
        used=req.attempt,
        allowed=req.retries,
        backoff=0.0,
    )
    if isinstance(decision, GiveUp):
        _say(f"CUDA OOM ({signature}); not retried: {decision.reason}")
        return
    _submit_again(
        replace(req, mem=decision.budget, attempt=req.attempt + 1),
        f"CUDA OOM ({signature}); retry {req.attempt + 1} of {req.retries}",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuwarden.ray.entry", description=__doc__)
    ap.add_argument("--mem", type=int, required=True, help="bytes per GPU")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--retries", type=int, default=0)
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--name")
    ap.add_argument("--submission-id", help="the Ray job's id (names it on the node)")
    ap.add_argument("--qos", choices=QOS_CLASSES, help="its class in a node daemon's queue")
    ap.add_argument("--priority", type=int, default=0)
    ap.add_argument(
        "--resources",
        default="{}",
        help="other Ray resources it asked for (JSON), asked for again when it is submitted again",
    )
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command")
    try:
        resources = json.loads(args.resources)
    except ValueError:
        resources = None
    if not isinstance(resources, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
        for k, v in resources.items()
    ):
        ap.error("--resources must be a JSON object of resource names and amounts")
    try:
        return run(
            Request(
                mem=args.mem,
                gpus=args.gpus,
                command=command,
                retries=args.retries,
                attempt=args.attempt,
                name=args.name,
                qos=args.qos,
                priority=args.priority,
                resources=resources,
                submission_id=args.submission_id,
            )
        )
    except GpuwardenError as e:
        _say(str(e))
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
