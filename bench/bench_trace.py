"""Trace packing in simulated time: gpuwarden's own placement and queue policies next to
the policies people use instead, on one generated trace of a shared research box.

    python bench/bench_trace.py [--gpus 8] [--gib 80] [--jobs 400] [--seed 1] --json OUT

The trace: many small evaluations, some large trainings, a few multi-GPU jobs (sizes and
lengths below, drawn from a seeded generator). Two workloads: *burst* (every job queued
at time 0: makespan against the lower bound) and *stream* (Poisson arrivals over a day:
waits and starvation), each as users declare it: every job with a ``--timeout`` 1.2-2×
its run time; *no timeout* (the common case: no job says how long it runs); *learned*
(no timeout, but the daemon learned a run time for 80% of the jobs from earlier runs of
their key, off by up to ±30%). Jobs use what they declare (no OOM in this model).

Policies, each an event-driven replay (an event is an arrival or an end):
- ``gpuwarden``: ``sched.queue.plan`` exactly as the daemon calls it (aged priority order,
  EASY backfill on the jobs' ``--timeout`` or learned estimate, the 15-minute starvation
  guard, best fit behind the first waiting job, 512 MiB reserve per GPU), with its
  decisions applied by ``sched.placement.apply``; each call is timed.
- ``whole-fifo``: each job takes whole idle GPUs, strictly first come first served
  (task-spooler, gq-style queues).
- ``first-fit``: jobs in submit order, each placed on the first GPUs whose free memory
  less a safety margin (1 GiB) holds it, later jobs may pass one that does not fit, no
  reservation (free-memory schedulers such as gpusched).
- ``best-fit``: the same, but each job goes to the GPUs with the least free memory that
  holds it.
- lower bound: max(Σ memory × time ÷ (GPUs × memory), the longest job).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _common import machine, percentile

from gpuwarden.sched.model import GpuState, Place, QueuedJob
from gpuwarden.sched.placement import apply, release
from gpuwarden.sched.queue import Policy, plan

GiB = 1 << 30
MiB = 1 << 20
RESERVE = 512 * MiB  # gpuwarden's default per-GPU reserve
MARGIN = 1 * GiB  # first-fit's safety margin over a GPU's free memory
LARGE = 40 * GiB  # "large" jobs, for starvation: this much or more, or several GPUs


@dataclass(frozen=True)
class TraceJob:
    id: int
    kind: str
    mem: int  # bytes per GPU
    count: int  # GPUs
    duration: float  # seconds
    submit: float
    timeout: float | None  # what the user declares (--timeout): longer than it runs
    estimate: float | None = None  # a run time learned from earlier runs (may be off)

    @property
    def large(self) -> bool:
        return self.mem >= LARGE or self.count > 1


def generate(n: int, gib: int, seed: int, *, stream_hours: float = 0.0) -> list[TraceJob]:
    """A shared research box: 70% evaluations (2-16 GiB, 2-30 min), 25% trainings
    (16-75% of a GPU, 1-6 h), 5% multi-GPU trainings (2-4 GPUs at 50-95%, 2-8 h)."""
    rng = random.Random(seed)
    total = gib * GiB
    jobs = []
    t = 0.0
    for i in range(n):
        r = rng.random()
        if r < 0.70:
            kind, count = "eval", 1
            mem = int(min(16, max(2, rng.lognormvariate(math.log(6), 0.5))) * GiB)
            duration = rng.uniform(2, 30) * 60
        elif r < 0.95:
            kind, count = "train", 1
            mem = int(total * rng.uniform(0.16, 0.75))
            duration = rng.uniform(1, 6) * 3600
        else:
            kind, count = "multi", rng.choice((2, 2, 4))
            mem = int(total * rng.uniform(0.5, 0.95))
            duration = rng.uniform(2, 8) * 3600
        mem = mem // MiB * MiB
        if stream_hours:
            t += rng.expovariate(n / (stream_hours * 3600))
        timeout = duration * rng.uniform(1.2, 2.0)
        jobs.append(TraceJob(i + 1, kind, mem, count, duration, t, timeout))
    return jobs


def without_timeouts(jobs: list[TraceJob], seed: int, learned: float = 0.0,
                     ) -> list[TraceJob]:
    """The same jobs with no ``--timeout``; with ``learned`` > 0, that share of them has a
    run time learned from earlier runs, 0.7-1.3× the true one."""
    rng = random.Random(seed + 17)
    out = []
    for j in jobs:
        est = j.duration * rng.uniform(0.7, 1.3) if rng.random() < learned else None
        out.append(replace(j, timeout=None, estimate=est))
    return out


def lower_bound(jobs: list[TraceJob], gpus: int, gib: int) -> float:
    area = sum(j.mem * j.count * j.duration for j in jobs)
    return max(area / (gpus * gib * GiB), max(j.duration for j in jobs))


# -- the replays ------------------------------------------------------------------------

@dataclass
class Outcome:
    starts: dict[int, float]
    ends: dict[int, float]
    plan_seconds: list[float]  # gpuwarden only: each plan() call
    plan_queue: list[int]  # queue length at each call


def _run(jobs: list[TraceJob], decide: Any) -> Outcome:
    """Event loop shared by the policies: ``decide(now, queued, running)`` returns the
    jobs (with their GPUs) to start now."""
    by_id = {j.id: j for j in jobs}
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    ends: list[tuple[float, int]] = []
    queued: list[TraceJob] = []
    out = Outcome({}, {}, [], [])
    i = 0
    now = 0.0
    while i < len(arrivals) or queued or ends:
        if i < len(arrivals):
            nxt = min(arrivals[i].submit, ends[0][0] if ends else math.inf)
        elif ends:
            nxt = ends[0][0]
        else:
            raise RuntimeError(f"{len(queued)} jobs can never start: "
                               f"{[j.id for j in queued[:5]]}")
        now = nxt
        finished = []
        while ends and ends[0][0] <= now:
            _, jid = heapq.heappop(ends)
            finished.append(jid)
            out.ends[jid] = now
        while i < len(arrivals) and arrivals[i].submit <= now:
            queued.append(arrivals[i])
            i += 1
        started = decide(now, queued, finished, out)
        for jid in started:
            j = by_id[jid]
            out.starts[jid] = now
            heapq.heappush(ends, (now + j.duration, jid))
        if started:
            gone = set(started)
            queued = [j for j in queued if j.id not in gone]
    return out


def replay_gpuwarden(jobs: list[TraceJob], gpus: int, gib: int, *,
                     backfill: bool = True) -> Outcome:
    state = [GpuState(index=k, uuid=f"GPU-{k}", total=gib * GiB, reserve=RESERVE)
             for k in range(gpus)]
    policy = Policy(aging=3600.0, backfill=backfill, preemption=False)
    views: dict[int, QueuedJob] = {}

    def decide(now: float, queued: list[TraceJob], finished: list[int],
               out: Outcome) -> list[int]:
        nonlocal state
        state = release(state, set(finished))
        if not queued:
            return []
        queue = [views.setdefault(j.id, QueuedJob(
            id=j.id, user=f"u{j.id % 7}", mem=j.mem, count=j.count, submitted_at=j.submit,
            runtime=j.timeout, estimate=j.estimate)) for j in queued]
        t0 = time.perf_counter()
        decisions = plan(state, queue, 0.0, now=now, policy=policy)
        out.plan_seconds.append(time.perf_counter() - t0)
        out.plan_queue.append(len(queue))
        started = []
        for d in decisions:
            if isinstance(d, Place):
                state = apply(state, views[d.job_id], d, 0.0, started_at=now)
                started.append(d.job_id)
        return started

    return _run(jobs, decide)


def replay_whole_fifo(jobs: list[TraceJob], gpus: int, gib: int) -> Outcome:
    busy: dict[int, int] = {}  # gpu -> job id
    held: dict[int, list[int]] = {}

    def decide(now: float, queued: list[TraceJob], finished: list[int],
               out: Outcome) -> list[int]:
        for jid in finished:
            for g in held.pop(jid, []):
                busy.pop(g, None)
        started = []
        for j in queued:  # strict FIFO: the head blocks everyone behind it
            idle = [g for g in range(gpus) if g not in busy]
            if len(idle) < j.count:
                break
            held[j.id] = idle[:j.count]
            for g in held[j.id]:
                busy[g] = j.id
            started.append(j.id)
        return started

    return _run(jobs, decide)


def replay_first_fit(jobs: list[TraceJob], gpus: int, gib: int, *,
                     best: bool = False) -> Outcome:
    used = [0] * gpus
    held: dict[int, tuple[list[int], int]] = {}

    def decide(now: float, queued: list[TraceJob], finished: list[int],
               out: Outcome) -> list[int]:
        for jid in finished:
            gs, mem = held.pop(jid)
            for g in gs:
                used[g] -= mem
        started = []
        for j in queued:  # submit order; a job that does not fit is passed over
            ok = [g for g in range(gpus) if gib * GiB - used[g] - MARGIN >= j.mem]
            if best:  # the fullest GPUs that still hold it
                ok.sort(key=lambda g: -used[g])
            ok = ok[:j.count]
            if len(ok) < j.count:
                continue
            for g in ok:
                used[g] += j.mem
            held[j.id] = (ok, j.mem)
            started.append(j.id)
        return started

    return _run(jobs, decide)


def measure(jobs: list[TraceJob], out: Outcome, gpus: int, gib: int) -> dict[str, Any]:
    waits = [out.starts[j.id] - j.submit for j in jobs]
    large = [out.starts[j.id] - j.submit for j in jobs if j.large]
    first = min(j.submit for j in jobs)
    makespan = max(out.ends.values()) - first
    area = sum(j.mem * j.count * j.duration for j in jobs)
    return {"makespan_s": makespan, "mean_wait_s": sum(waits) / len(waits),
            "p95_wait_s": percentile(waits, 95), "max_wait_large_s": max(large or [0.0]),
            "mem_utilization": area / (gpus * gib * GiB * makespan)}


def decision_time(gpus: int, gib: int, queued: int, seed: int) -> dict[str, Any]:
    """One plan() over ``queued`` waiting jobs on busy GPUs, per job (the daemon's pass)."""
    jobs = generate(queued, gib, seed + 1)
    state = [GpuState(index=k, uuid=f"GPU-{k}", total=gib * GiB, reserve=RESERVE)
             for k in range(gpus)]
    queue = [QueuedJob(id=j.id, user=f"u{j.id % 50}", mem=j.mem, count=j.count,
                       submitted_at=j.submit, runtime=j.timeout) for j in jobs]
    policy = Policy(aging=3600.0, backfill=True, preemption=False)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        plan(state, queue, 0.0, now=0.0, policy=policy)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"queued": queued, "plan_s": best, "per_job_us": best / queued * 1e6}


def replay_gpuwarden_no_backfill(jobs: list[TraceJob], gpus: int, gib: int) -> Outcome:
    return replay_gpuwarden(jobs, gpus, gib, backfill=False)


def replay_best_fit(jobs: list[TraceJob], gpus: int, gib: int) -> Outcome:
    return replay_first_fit(jobs, gpus, gib, best=True)


POLICIES = {"gpuwarden": replay_gpuwarden, "gpuwarden, backfill off": replay_gpuwarden_no_backfill,
            "whole-fifo": replay_whole_fifo, "first-fit": replay_first_fit,
            "best-fit": replay_best_fit}
WORKLOADS = (  # name, arrivals (stream or burst), timeouts ("timeout", "none", "learned")
    ("burst", False, "timeout"), ("stream", True, "timeout"),
    ("burst, no timeout", False, "none"), ("stream, no timeout", True, "none"),
    ("burst, learned run times", False, "learned"),
    ("stream, learned run times", True, "learned"))


def longest_first(jobs: list[TraceJob]) -> list[TraceJob]:
    """The burst in decreasing memory x time: the order an offline planner would pick,
    which no shared queue can (it ignores who came first). It shows how far the lower
    bound itself is from reachable."""
    ranked = sorted(jobs, key=lambda j: -(j.mem * j.count * j.duration))
    return [replace(j, id=i + 1) for i, j in enumerate(ranked)]


def window_sweep(n: int, gpus: int, gib: int, seed: int, hours: float,
                 ) -> dict[str, dict[str, dict[str, float]]]:
    """gpuwarden on the traces without timeouts with other best-fit windows (1: none,
    jobs behind the first waiting one start in queue order): the trade it makes."""
    from gpuwarden.sched import queue

    default = queue.BEST_FIT_WINDOW
    out: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for w in sorted({1, 2, default, 8, 16, 64}):
            queue.BEST_FIT_WINDOW = w
            row = {}
            for name, h in (("burst, no timeout", 0.0), ("stream, no timeout", hours)):
                jobs = without_timeouts(generate(n, gib, seed, stream_hours=h), seed)
                m = measure(jobs, replay_gpuwarden(jobs, gpus, gib), gpus, gib)
                row[name] = {"makespan_s": m["makespan_s"], "mean_wait_s": m["mean_wait_s"]}
            out[str(w)] = row
    finally:
        queue.BEST_FIT_WINDOW = default
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gib", type=int, default=80)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stream-hours", type=float, default=24.0)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    from gpuwarden.sched.queue import BEST_FIT_WINDOW, DEFAULT_STARVE_AFTER

    result: dict[str, Any] = {"machine": machine(), "gpus": args.gpus, "gib": args.gib,
                              "jobs": args.jobs, "seed": args.seed, "margin": MARGIN,
                              "reserve": RESERVE, "best_fit_window": BEST_FIT_WINDOW,
                              "starve_after": DEFAULT_STARVE_AFTER, "workloads": {}}
    for name, streamed, timeouts in WORKLOADS:
        hours = args.stream_hours if streamed else 0.0
        jobs = generate(args.jobs, args.gib, args.seed, stream_hours=hours)
        if timeouts != "timeout":
            jobs = without_timeouts(jobs, args.seed, 0.8 if timeouts == "learned" else 0.0)
        kinds = {k: sum(1 for j in jobs if j.kind == k) for k in ("eval", "train", "multi")}
        w: dict[str, Any] = {"hours": hours, "kinds": kinds, "timeouts": timeouts,
                             "lower_bound_s": lower_bound(jobs, args.gpus, args.gib),
                             "policies": {}}
        for pname, fn in POLICIES.items():
            t0 = time.perf_counter()
            out = fn(jobs, args.gpus, args.gib)
            m = measure(jobs, out, args.gpus, args.gib)
            m["replay_s"] = time.perf_counter() - t0
            if out.plan_seconds:
                per_job = [s / q for s, q in zip(out.plan_seconds, out.plan_queue, strict=True)]
                m["plan_calls"] = len(out.plan_seconds)
                m["plan_per_job_us_p50"] = percentile(per_job, 50) * 1e6
                m["plan_per_job_us_max"] = max(per_job) * 1e6
            w["policies"][pname] = m
            print(f"{name:26} {pname:24} makespan {m['makespan_s'] / 3600:6.2f} h  mean wait "
                  f"{m['mean_wait_s'] / 3600:6.2f} h  util {m['mem_utilization']:.2f}",
                  file=sys.stderr)
        if name == "burst":
            ref = longest_first(jobs)
            w["longest_first"] = {p: measure(ref, POLICIES[p](ref, args.gpus, args.gib),
                                             args.gpus, args.gib)
                                  for p in ("gpuwarden", "first-fit")}
        result["workloads"][name] = w
    result["window"] = window_sweep(args.jobs, args.gpus, args.gib, args.seed,
                                    args.stream_hours)
    result["decision"] = decision_time(args.gpus, args.gib, args.queued, args.seed)
    args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
