"""The entrypoint of a gpuwarden job on a Ray node: ``python -m gpuwarden.ray.entry``.

Ray has placed the job and set CUDA_VISIBLE_DEVICES; this process adds what Ray does not
do: the command starts the way gpuwarden starts any job (``launch.plan_launch``: the
PyTorch cap at the budget, CPU affinity to the GPUs' NUMA node), in its own session
under this process as a child subreaper, so that when it ends every process it left is
killed and the GPU memory is checked to be back. A CUDA OOM with retries left is
submitted again through Ray's job API with a bigger budget (``sched.oom.after_oom``), so
Ray places the retry by the new budget."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO, TYPE_CHECKING

import psutil

from gpuwarden.errors import GpuwardenError
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.daemon.launcher import AttachedJob
    from gpuwarden.gpus.model import GpuFacts

DASHBOARD_ENV = "GPUWARDEN_RAY_DASHBOARD"  # where retries are submitted
PR_SET_CHILD_SUBREAPER = 36


def _say(message: str) -> None:
    print(f"gpuwarden: {message}", file=sys.stderr, flush=True)


def _subreaper() -> None:
    """Orphans of the job become our children, so none escapes the clean-up."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _pump(src: IO[bytes], dst: IO[bytes], tail: deque[bytes]) -> None:
    for line in iter(src.readline, b""):
        dst.write(line)
        dst.flush()
        tail.append(line)


def _kill_leftovers(grace: float = 3.0) -> tuple[list[int], list[int]]:
    """Kill what the job left (our remaining descendants): (their pids, the pids that
    outlived SIGKILL)."""
    me = psutil.Process()
    left = me.children(recursive=True)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _, stuck = psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in left], [p.pid for p in stuck]


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


def _register(command: list[str], mem: int, gpus: list[GpuFacts], name: str | None,
              submission_id: str | None,
              stop: _Stop) -> tuple[AttachedJob | None, int, frozenset[int] | None]:
    """Register the job with this node's gpuwarden daemon, if one runs, and wait until it
    places it: (the attached job, the budget to run with, the cores it holds)."""
    from gpuwarden.daemon.launcher import AttachedJob, node_daemon

    client = node_daemon()
    if client is None:
        return None, mem, None
    label = f"ray job {submission_id}" if submission_id else "ray job"
    job = AttachedJob.register(client, command=command, label=label, mem=mem,
                               gpu_ids=[g.index for g in gpus], name=name)
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
    limit = (placed.get("enforcement") or {}).get("limit") or placed.get("budget") or mem
    cores = frozenset(placed.get("cpu_set") or ()) or None
    waited = [e for e in placed.get("events", []) if e.get("kind") == "placed"]
    _say(f"job {job.id} placed by the daemon: " + (waited[-1].get("detail") or "")
         if waited else f"job {job.id} placed by the daemon")
    return job, int(limit), cores


def run(mem: int, gpus_wanted: int, command: list[str], *, retries: int, attempt: int,
        name: str | None, submission_id: str | None = None) -> int:
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.gpus.visible import visible_gpus
    from gpuwarden.launch import apply_affinity, plan_launch, probe_host

    backend = open_backend()
    try:
        gpus = visible_gpus(backend.gpus(), os.environ)
    finally:
        backend.close()
    if len(gpus) < gpus_wanted:
        raise GpuwardenError(f"Ray gave this job {len(gpus)} GPU(s) "
                             f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                             f"it asked for {gpus_wanted}")
    gpus = gpus[:gpus_wanted]
    stop = _Stop()
    stop.install()
    try:
        attached, limit, cores = _register(command, mem, gpus, name, submission_id, stop)
    except _Stopped as e:
        _say(f"stopped ({e}) while waiting for this node's gpuwarden daemon")
        return 128 + signal.SIGTERM
    env = dict(os.environ)
    if attached is not None:
        env.update(GPUWARDEN_JOB=str(attached.id), GPUWARDEN_BUDGET=str(limit))
    plan = plan_launch(command, gpus, base_env=env, host=probe_host(env), mem_limit=limit,
                       cores=cores)
    _say(f"attempt {attempt + 1}: {plan.describe()}" + "".join(f"; {n}" for n in plan.notes))
    _subreaper()
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
        child = subprocess.Popen(list(plan.argv), env=plan.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=prepare)
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
    pumps = [threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, tail)),
             threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, tail))]
    for t in pumps:
        t.start()
    if attached is not None:
        attached.started(child.pid)
    code = child.wait()
    left, stuck = _kill_leftovers()
    seen = {child.pid} | set(left)
    for t in pumps:
        t.join(timeout=5)
    output = b"".join(tail).decode(errors="replace")
    status = code if code >= 0 else 128 - code
    if attached is not None:
        attached.ended(exit_code=status, signal=-code if code < 0 else None,
                       reason="cancelled" if stop.signals else "exited", tree_clean=not stuck,
                       survivors=stuck, output=output)
    back = _memory_back(seen)
    _say(f"exit {code}; " + (f"its GPU memory is back ({back:.2f} s after the end)"
                             if back is not None else
                             "its processes are still listed on a GPU 10 s after the end"))
    if code != 0 and not stop.signals:
        _maybe_retry(output, limit, gpus_wanted, command, retries=retries, attempt=attempt,
                     name=name, largest=min(g.memory_total for g in gpus))
    return status


def _maybe_retry(output: str, mem: int, gpus: int, command: list[str], *, retries: int,
                 attempt: int, name: str | None, largest: int) -> None:
    from gpuwarden.sched.oom import GiveUp, after_oom, oom_signature

    signature = oom_signature(output)
    if signature is None:
        return
    decision = after_oom(old_budget=mem, peak=None, largest=largest, used=attempt,
                         allowed=retries, backoff=0.0)
    if isinstance(decision, GiveUp):
        _say(f"CUDA OOM ({signature}); not retried: {decision.reason}")
        return
    dashboard = os.environ.get(DASHBOARD_ENV)
    if not dashboard:
        _say(f"CUDA OOM; cannot retry: {DASHBOARD_ENV} is not set")
        return
    from gpuwarden.ray.submit import submit

    sid = submit(dashboard, mem=decision.budget, gpus=gpus, command=command, retries=retries,
                 attempt=attempt + 1, name=name)
    _say(f"CUDA OOM ({signature}); retried as Ray job {sid} with "
         f"{format_bytes(decision.budget)} per GPU")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuwarden.ray.entry", description=__doc__)
    ap.add_argument("--mem", type=int, required=True, help="bytes per GPU")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--retries", type=int, default=0)
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--name")
    ap.add_argument("--submission-id", help="the Ray job's id (names it on the node)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command")
    try:
        return run(args.mem, args.gpus, command, retries=args.retries, attempt=args.attempt,
                   name=args.name, submission_id=args.submission_id)
    except GpuwardenError as e:
        _say(str(e))
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
