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
from typing import IO

import psutil

from gpuwarden.errors import GpuwardenError
from gpuwarden.units import format_bytes

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


def _kill_leftovers(grace: float = 3.0) -> list[int]:
    """Kill what the job left (our remaining descendants); their pids."""
    me = psutil.Process()
    left = me.children(recursive=True)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in left]


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


def run(mem: int, gpus_wanted: int, command: list[str], *, retries: int, attempt: int,
        name: str | None) -> int:
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
    plan = plan_launch(command, gpus, base_env=os.environ, host=probe_host(), mem_limit=mem)
    _say(f"attempt {attempt + 1}: {plan.describe()}" + "".join(f"; {n}" for n in plan.notes))
    _subreaper()
    cpus = plan.cpus

    def prepare() -> None:
        if cpus is not None:
            apply_affinity(cpus)

    tail: deque[bytes] = deque(maxlen=200)
    child = subprocess.Popen(list(plan.argv), env=plan.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=prepare)
    assert child.stdout is not None and child.stderr is not None
    pumps = [threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, tail)),
             threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, tail))]
    for t in pumps:
        t.start()

    def forward(sig: int, _frame: object) -> None:  # Ray stops a job with SIGTERM
        with contextlib.suppress(OSError):
            os.killpg(child.pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    seen = {child.pid} | set(_kill_leftovers())
    for t in pumps:
        t.join(timeout=5)
    back = _memory_back(seen)
    _say(f"exit {code}; " + (f"its GPU memory is back ({back:.2f} s after the end)"
                             if back is not None else
                             "its processes are still listed on a GPU 10 s after the end"))
    if code != 0:
        _maybe_retry(b"".join(tail).decode(errors="replace"), mem, gpus_wanted, command,
                     retries=retries, attempt=attempt, name=name,
                     largest=min(g.memory_total for g in gpus))
    return code if code >= 0 else 128 - code


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
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command")
    try:
        return run(args.mem, args.gpus, command, retries=args.retries, attempt=args.attempt,
                   name=args.name)
    except GpuwardenError as e:
        _say(str(e))
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
