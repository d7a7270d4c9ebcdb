"""Backfill without known run times: the starvation guard, run-time estimates and best
fit behind the first waiting job — rules by example, then as properties."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from hypothesis import given, note, settings

from gpuwarden.daemon.queueview import estimate_view, learned_runtime, queued_view
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import QUEUED, RESERVED, RUNNING, SUCCEEDED, JobSpec
from gpuwarden.sched import backfill
from gpuwarden.sched.booking import apply, reservation
from gpuwarden.sched.history import learned_runtime as learn
from gpuwarden.sched.model import GpuState, ManagedUse, Place, QueuedJob, Wait
from gpuwarden.sched.placement import fits
from gpuwarden.sched.queue import BEST_FIT_WINDOW, Policy, plan
from tests.unit.test_policies import NOW, by_id, g, job, scenes, use

GiB = 1 << 30
FREE = Policy(preemption=False)  # the default guard: 15 minutes


# --- the starvation guard -----------------------------------------------------------------


def test_a_job_that_fits_starts_while_the_heads_start_is_unknown() -> None:
    # One 80 GiB GPU, 40G running with no timeout, 60G waiting: a 30G that fits starts.
    gpus = [g(0, use(100, 40))]
    d = by_id(
        plan(gpus, [job(1, 60, at=NOW - 60), job(2, 30, at=NOW - 1)], 0, now=NOW, policy=FREE)
    )
    assert d[2] == Place(2, (0,), 30 * GiB)
    assert isinstance(d[1], Wait)
    assert "jobs that fit start before it for 14m00s more, then its room is held" in d[1].reason


def test_past_starve_after_the_heads_room_is_held() -> None:
    gpus = [g(0, use(100, 40))]
    d = by_id(
        plan(gpus, [job(1, 60, at=NOW - 901), job(2, 30, at=NOW - 1)], 0, now=NOW, policy=FREE)
    )
    assert isinstance(d[2], Wait) and d[2].cause == "backfill"
    assert "would delay job 1" in d[2].reason and "15m00s" in d[2].reason
    # A job that leaves the head job's room alone still starts.
    d = by_id(
        plan(gpus, [job(1, 60, at=NOW - 901), job(2, 20, at=NOW - 1)], 0, now=NOW, policy=FREE)
    )
    assert isinstance(d[2], Place)


def test_starve_after_zero_holds_the_room_at_once_and_aging_still_orders() -> None:
    gpus = [g(0, use(100, 40))]
    queue = [job(1, 60, at=NOW - 1), job(2, 30, at=NOW - 1)]
    d = by_id(plan(gpus, queue, 0, now=NOW, policy=Policy(preemption=False, starve_after=0)))
    assert isinstance(d[2], Wait) and d[2].cause == "backfill"
    # Aging raises the older job above a newer one of higher priority: it is the head.
    old, new = job(1, 60, at=NOW - 7200), job(2, 60, priority=1, at=NOW - 1)
    first = plan(gpus, [new, old], 0, now=NOW, policy=Policy(aging=3600, preemption=False))[0]
    assert first.job_id == 1


def test_starving_is_waiting_at_least_starve_after() -> None:
    assert not backfill.starving(job(1, at=NOW - 899), NOW, 900)
    assert backfill.starving(job(1, at=NOW - 900), NOW, 900)
    assert backfill.starving(job(1, at=NOW), NOW, 0)


# --- run-time estimates -------------------------------------------------------------------


def test_the_expected_run_time_is_the_shorter_of_estimate_and_timeout() -> None:
    assert job(1).expected_runtime is None
    assert job(1, runtime=600).expected_runtime == 600
    assert job(1, estimate=300).expected_runtime == 300
    assert job(1, runtime=600, estimate=900).expected_runtime == 600
    u = reservation(job(1, runtime=600, estimate=300), GiB, started_at=NOW)
    assert (u.ends_at, u.expected_end) == (NOW + 600, NOW + 300)
    assert reservation(job(1), GiB, started_at=NOW).expected_end is None


def test_an_estimate_gives_the_head_a_start_that_backfill_respects() -> None:
    # 40G expected to end in 10 minutes: the 60G head job starts then. A 30G expected to
    # take an hour would delay it, even before the guard; one of 5 minutes would not.
    gpus = [g(0, use(100, 40, expected=NOW + 600))]
    head = job(1, 60, at=NOW - 60)
    d = by_id(plan(gpus, [head, job(2, 30, estimate=3600)], 0, now=NOW, policy=FREE))
    assert isinstance(d[1], Wait) and "expected to start by" in d[1].reason
    assert isinstance(d[2], Wait) and d[2].cause == "backfill"
    d = by_id(plan(gpus, [head, job(2, 30, estimate=300)], 0, now=NOW, policy=FREE))
    assert isinstance(d[2], Place)


def test_a_job_past_its_estimate_has_an_unknown_end_but_a_timeout_still_bounds_it() -> None:
    late = use(100, 40, expected=NOW - 10)
    assert backfill.expected_end(late, NOW) == math.inf
    gpus = [g(0, late)]
    d = by_id(
        plan(gpus, [job(1, 60, at=NOW - 60), job(2, 30, estimate=3600)], 0, now=NOW, policy=FREE)
    )
    assert isinstance(d[2], Place)  # the head's start is unknown again: the guard decides
    bounded = use(100, 40, expected=NOW - 10, ends=NOW + 600)
    assert backfill.expected_end(bounded, NOW) == NOW + 600
    d = by_id(
        plan(
            [g(0, bounded)],
            [job(1, 60, at=NOW - 60), job(2, 30, estimate=3600)],
            0,
            now=NOW,
            policy=FREE,
        )
    )
    assert isinstance(d[2], Wait) and d[2].cause == "backfill"


def test_a_learned_run_time_is_the_longest_of_the_last_five() -> None:
    assert learn([]) == (None, None)
    assert learn([0.0, -1.0]) == (None, None)
    seconds, how = learn([600.0, 900.0, 300.0, 60.0, 120.0, 7200.0])  # newest first
    assert seconds == 900.0  # the sixth (7200 s) is too old to count
    assert how == "15m00s, the longest of 5 earlier successful run(s)"


def _run(
    store: Store,
    spec: JobSpec,
    start: float,
    end: float,
    state: str = SUCCEEDED,
) -> int:
    job, _ = store.submit(spec, start - 1)
    store.transition(job.id, QUEUED, RESERVED, now=start, kind="placed")
    store.transition(job.id, RESERVED, RUNNING, now=start, kind="started", started_at=start)
    store.transition(job.id, RUNNING, state, now=end, kind=state, ended_at=end)
    return job.id


def test_run_times_are_learned_per_user_and_key_else_name(tmp_path: Path) -> None:
    base: dict[str, Any] = dict(command=("python", "eval.py"), user="alice", uid=1000, gid=1000)
    with Store(tmp_path / "state.db") as store:
        _run(store, JobSpec(**base, name="eval"), 100, 400)
        _run(store, JobSpec(**base, name="eval"), 500, 1100)
        _run(store, JobSpec(**base, name="eval"), 2000, 9000, "failed")
        _run(store, JobSpec(**{**base, "uid": 1001}, name="eval"), 0, 9000)
        _run(store, JobSpec(**base, key="k1"), 0, 50)
        assert store.runtimes(1000, name="eval") == [600.0, 300.0]  # newest first
        assert store.runtimes(1000, key="k1", name="eval") == [50.0]  # the key wins
        assert store.runtimes(1000) == []
        waiting, _ = store.submit(JobSpec(**base, name="eval", timeout=3600), 10_000)
        learned, how = learned_runtime(store, waiting)
        assert learned == 600.0
        assert queued_view(waiting, learned).estimate == 600.0
        assert queued_view(waiting, learned).runtime == 3600.0
        view = estimate_view(waiting, learned, how)
        assert view["seconds"] == 600.0
        assert view["how"] == (
            "learned: 10m00s, the longest of 2 earlier successful run(s) "
            "(--timeout 1h00m bounds it)"
        )
        fresh, _ = store.submit(JobSpec(**base, name="new"), 10_000)
        assert estimate_view(fresh, *learned_runtime(store, fresh))["how"].startswith(
            "unknown: no --timeout"
        )
        short, _ = store.submit(JobSpec(**base, name="eval", timeout=60), 10_000)
        assert estimate_view(short, *learned_runtime(store, short)) == {
            "seconds": 60.0,
            "learned": 600.0,
            "how": "its --timeout, 1m00s",
        }


# --- best fit behind the head -------------------------------------------------------------


def test_behind_a_waiting_job_the_job_that_fills_the_hole_goes_first() -> None:
    # 40 GiB free, the 60G head waits: in queue order the 10G would start and leave the
    # 38G waiting; best fit starts the 38G, the GPU is full, the 10G waits.
    gpus = [g(0, use(100, 40))]
    queue = [job(1, 60, at=NOW - 60), job(2, 10, at=NOW - 5), job(3, 38, at=NOW - 4)]
    decisions = plan(gpus, queue, 0, now=NOW, policy=FREE)
    d = by_id(decisions)
    assert d[3] == Place(3, (0,), 38 * GiB)
    assert isinstance(d[2], Wait) and d[2].cause == "room"
    # Before any job waits, jobs start in queue order.
    d = by_id(plan([g(0)], [job(2, 10, at=1), job(3, 38, at=2)], 0, now=NOW, policy=FREE))
    assert isinstance(d[2], Place) and isinstance(d[3], Place)


def test_best_fit_picks_the_tightest_gpu_and_never_delays_a_starving_head() -> None:
    # GPU 0 has 12 GiB free, GPU 1 30: the 12G fills GPU 0 first; the head (starving,
    # 75G, may start when either GPU empties) keeps the room it needs.
    gpus = [g(0, use(100, 68)), g(1, use(101, 50))]
    queue = [job(1, 75, at=NOW - 2000), job(2, 5, at=NOW - 5), job(3, 12, at=NOW - 4)]
    d = by_id(plan(gpus, queue, 0, now=NOW, policy=FREE))
    assert d[3] == Place(3, (0,), 12 * GiB)
    assert d[2] == Place(2, (1,), 5 * GiB)  # 75 + 5 on GPU 1 once its job has gone


def test_no_job_is_passed_over_by_more_than_the_window() -> None:
    # Many small jobs, then a big one: the small ones further back than the window
    # start in queue order before it; it goes before the last ones, which fill the rest.
    gpus = [g(0, use(100, 40))]
    n = BEST_FIT_WINDOW + 4
    early = n - BEST_FIT_WINDOW + 1  # started before the big job is weighed
    big = 40 - early - (BEST_FIT_WINDOW - 1)
    queue = [
        job(1, 60, at=NOW - 60),
        *(job(10 + i, 1, at=NOW - 50 + i) for i in range(n)),
        job(99, big, at=NOW - 1),
    ]
    decisions = plan(gpus, queue, 0, now=NOW, policy=FREE)
    order = [d.job_id for d in decisions if isinstance(d, Place)]
    assert order[:early] == [10 + i for i in range(early)]
    assert order[early] == 99 and sorted(order[early + 1 :]) == list(range(10 + early, 10 + n))
    assert sum(d.budget for d in decisions if isinstance(d, Place)) == 40 * GiB


# --- services coming back keep their room ---------------------------------------------------


def back(id: int, gib: float, *, not_before: float = 0.0) -> QueuedJob:
    """A service queued again after it ended (a restart, an OOM retry)."""
    return dataclasses.replace(job(id, gib, at=NOW - 3600, not_before=not_before), returning=True)


def test_a_service_coming_back_goes_ahead_of_higher_priority_work() -> None:
    # 30G running; a priority-100 job that needs 45G and a service retried at 10G: both
    # cannot fit, and the service, admitted before, is placed first.
    gpus = [g(0, use(100, 30))]
    d = by_id(
        plan(gpus, [job(1, 45, priority=100, at=NOW - 1), back(2, 10)], 0, now=NOW, policy=FREE)
    )
    assert d[2] == Place(2, (0,), 10 * GiB)
    assert isinstance(d[1], Wait)


def test_a_service_backing_off_keeps_its_room() -> None:
    gpus = [g(0, use(100, 30))]
    queue = [job(1, 45, priority=100, at=NOW - 1), back(2, 10, not_before=NOW + 1)]
    d = by_id(plan(gpus, queue, 0, now=NOW, policy=FREE))
    assert isinstance(d[2], Wait) and d[2].cause == "backoff"
    assert isinstance(d[1], Wait) and d[1].cause == "room"
    # The same job not coming back (a new submission backing off) holds nothing.
    fresh = dataclasses.replace(queue[1], returning=False)
    assert isinstance(by_id(plan(gpus, [queue[0], fresh], 0, now=NOW, policy=FREE))[1], Place)


def test_a_service_coming_back_bigger_has_its_room_held_at_once() -> None:
    # 40G running with no end known; the service's OOM retry needs 50G: it is first in
    # line and, unlike a new job, does not let a 35G that fits now take its room.
    gpus = [g(0, use(100, 40))]
    d = by_id(plan(gpus, [back(1, 50), job(2, 35, at=NOW - 1)], 0, now=NOW, policy=FREE))
    assert isinstance(d[1], Wait) and "its room is held" in d[1].reason
    assert isinstance(d[2], Wait) and d[2].cause == "backfill"
    # A new job in its place would let the 35G start (its start is unknown).
    new = job(1, 50, at=NOW - 60)
    assert isinstance(
        by_id(plan(gpus, [new, job(2, 35, at=NOW - 1)], 0, now=NOW, policy=FREE))[2], Place
    )


def test_memory_coming_back_from_an_ended_attempt_holds_the_room_for_the_head() -> None:
    # A preempted job's memory is not back yet (a hold): the job that preempted it waits
    # for that memory, and the victim, queued again, must not take the room back (else
    # it is preempted again, and again: a livelock).
    hold = ManagedUse(-7, 5 * GiB, qos="guaranteed", started_at=NOW - 1, ended=True)
    gpus = [GpuState(index=0, uuid="GPU-0", total=24 * GiB, managed=(hold,))]
    queue = [job(1, 20, priority=100, at=NOW - 1), job(2, 6, at=NOW - 60)]
    d = by_id(plan(gpus, queue, 0, now=NOW, policy=FREE))
    assert isinstance(d[1], Wait) and isinstance(d[2], Wait) and d[2].cause == "backfill"
    # A job that leaves the room alone still starts.
    d = by_id(plan(gpus, [queue[0], job(2, 4, at=NOW - 60)], 0, now=NOW, policy=FREE))
    assert isinstance(d[2], Place)


# --- properties -----------------------------------------------------------------------------


def _booked(
    gpus: list[GpuState], jobs: dict[int, QueuedJob], decisions: list[object]
) -> list[GpuState]:
    state = list(gpus)
    for d in decisions:
        if isinstance(d, Place):
            state = apply(state, jobs[d.job_id], d, 0, started_at=NOW)  # invariant 1
    return state


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_while_no_start_is_known_and_none_starves_no_job_that_fits_waits(
    scene: tuple[list[GpuState], list[QueuedJob]],
) -> None:
    gpus, queue = scene
    pol = Policy(preemption=False, starve_after=math.inf)
    decisions = plan(gpus, queue, 0, now=NOW, policy=pol)
    jobs = {j.id: j for j in queue}
    note(f"decisions={decisions}")
    final = _booked(gpus, jobs, list(decisions))
    head: backfill.Reservation | None = None
    for i, d in enumerate(decisions):
        if isinstance(d, Wait) and d.cause == "room":
            assert fits(jobs[d.job_id], final, 0) is None  # work-conserving
            if head is None:  # the first one that gets a reservation is the head
                before = _booked(gpus, jobs, list(decisions[:i]))
                head = backfill.reserve(jobs[d.job_id], before, NOW, 0, fits)
        if isinstance(d, Wait) and d.cause == "backfill":
            # Only a head job with a known (expected) start holds room.
            assert head is not None and head.shadow is not None
