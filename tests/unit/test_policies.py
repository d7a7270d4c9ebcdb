"""The queue's policies as pure decisions: aging, backfill that never delays the head job,
preemption's victim choice, per-user limits and retry backoff — rules by example, then
the guarantees as properties over random GPU states and queues."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, note, settings
from hypothesis import strategies as st

from gpuwarden.jobs.request import BESTEFFORT, BURSTABLE, GUARANTEED, QOS_CLASSES
from gpuwarden.sched import backfill, preempt
from gpuwarden.sched.booking import apply, claims, release
from gpuwarden.sched.limits import Limits, UserLimits
from gpuwarden.sched.model import (
    QOS_RANK,
    Decision,
    GpuState,
    ManagedUse,
    Place,
    Preempt,
    QueuedJob,
    Wait,
)
from gpuwarden.sched.placement import fits
from gpuwarden.sched.queue import (
    DEFAULT_STARVE_AFTER,
    Policy,
    aged_order,
    effective_priority,
    plan,
)

GiB = 1 << 30
NOW = 10_000.0
ALL = Policy()  # backfill and preemption on, no aging, no limits


def use(
    job_id: int,
    gib: float,
    *,
    qos: str = BURSTABLE,
    priority: int = 0,
    started: float = NOW - 100,
    ends: float | None = None,
    used: float | None = None,
    user: str = "bob",
    exclusive: bool = False,
    preempting: bool = False,
    expected: float | None = None,
) -> ManagedUse:
    return ManagedUse(
        job_id,
        int(gib * GiB),
        exclusive=exclusive,
        user=user,
        qos=qos,
        priority=priority,
        started_at=started,
        ends_at=ends,
        expected_end=expected,
        used=None if used is None else int(used * GiB),
        preempting=preempting,
    )


def g(index: int, *uses: ManagedUse, total: float = 80) -> GpuState:
    return GpuState(index=index, uuid=f"GPU-{index}", total=int(total * GiB), managed=uses)


def job(
    id: int,
    gib: float | None = 10,
    *,
    qos: str = BURSTABLE,
    priority: int = 0,
    at: float = NOW - 10,
    runtime: float | None = None,
    user: str = "alice",
    count: int = 1,
    not_before: float = 0.0,
    estimate: float | None = None,
) -> QueuedJob:
    return QueuedJob(
        id=id,
        user=user,
        mem=None if gib is None else int(gib * GiB),
        count=count,
        priority=priority,
        submitted_at=at,
        qos=qos,
        runtime=runtime,
        not_before=not_before,
        estimate=estimate,
    )


def by_id(decisions: Iterable[Decision]) -> dict[int, Decision]:
    return {d.job_id: d for d in decisions}


# --- aging ------------------------------------------------------------------------------


def test_aging_raises_priority_with_waiting_time() -> None:
    old = job(1, at=NOW - 3600)
    assert effective_priority(old, NOW, 600) == 6
    assert effective_priority(old, NOW, 0) == 0


def test_an_old_job_overtakes_a_stream_of_higher_priority_newcomers() -> None:
    big = job(1, 70, at=NOW - 7200)  # waited two hours
    small = [job(10 + i, 5, priority=5, at=NOW - i) for i in range(5)]
    assert next(j.id for j in aged_order(NOW, 600)([*small, big])) == 1
    assert [j.id for j in aged_order(NOW, 0)([*small, big])][-1] == 1


def test_qos_class_breaks_priority_ties() -> None:
    a, b = job(1, qos=BESTEFFORT, at=1), job(2, qos=GUARANTEED, at=2)
    assert [j.id for j in aged_order(NOW, 0)([a, b])] == [2, 1]


# --- backfill ---------------------------------------------------------------------------


def test_backfill_admits_a_job_that_ends_before_the_head_can_start() -> None:
    gpus = [g(0, use(100, 60, ends=NOW + 3600))]
    head, short = job(1, 40, at=1), job(2, 10, at=2, runtime=600)
    d = by_id(plan(gpus, [head, short], 0, now=NOW, policy=ALL))
    assert isinstance(d[1], Wait) and "expected to start by" in d[1].reason
    assert isinstance(d[2], Place)


def test_backfill_refuses_a_job_that_would_delay_the_head() -> None:
    gpus = [g(0, use(100, 60, ends=NOW + 3600))]
    head, long_ = job(1, 75, at=1), job(2, 10, at=2, runtime=7200)
    d = by_id(plan(gpus, [head, long_], 0, now=NOW, policy=ALL))
    assert isinstance(d[2], Wait) and "would delay job 1" in d[2].reason


def test_a_starving_head_with_an_unknown_start_holds_its_room() -> None:
    # The running job has no timeout and no estimate, and the head job has waited past
    # starve_after: it may start any moment, so only jobs that leave its room alone may
    # start — whatever their own timeout.
    gpus = [g(0, use(100, 60)), g(1, total=80)]
    head = job(1, 75, at=1)
    d = by_id(plan(gpus, [head, job(2, 30, at=2, runtime=1)], 0, now=NOW, policy=ALL))
    # GPU 1 is free: the head job fits there now and is simply placed.
    assert d[1] == Place(1, (1,), 75 * GiB)
    gpus = [g(0, use(100, 60))]
    d = by_id(plan(gpus, [head, job(2, 10, at=2, runtime=1)], 0, now=NOW, policy=ALL))
    assert isinstance(d[1], Wait) and "its room is held" in d[1].reason
    assert isinstance(d[2], Wait) and "would delay job 1" in d[2].reason
    assert "its room is held: it has waited over 15m00s" in d[2].reason


def test_backfill_may_use_room_the_head_job_does_not_need() -> None:
    gpus = [g(0, use(100, 60, ends=NOW + 3600), total=80)]
    head, fill = job(1, 30, at=1), job(2, 5, at=2)  # 80 - 60 - 5 = 15 now; 80 - 5 ≥ 30 later
    d = by_id(plan(gpus, [head, fill], 0, now=NOW, policy=ALL))
    assert isinstance(d[1], Wait) and isinstance(d[2], Place)


# --- preemption -------------------------------------------------------------------------


def test_guaranteed_job_preempts_the_cheapest_victims() -> None:
    gpus = [
        g(
            0,
            use(100, 30, qos=BESTEFFORT),
            use(101, 30, qos=BURSTABLE),
            use(102, 15, qos=GUARANTEED),
        )
    ]
    d = plan(gpus, [job(1, 30, qos=GUARANTEED)], 0, now=NOW, policy=ALL)
    assert d == [Preempt(1, (100,), d[0].reason)]  # type: ignore[union-attr]


def test_guaranteed_jobs_are_never_victims() -> None:
    gpus = [g(0, use(100, 70, qos=GUARANTEED, priority=-5))]
    d = plan(gpus, [job(1, 30, qos=GUARANTEED, priority=10)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Wait)


def test_same_class_needs_higher_priority() -> None:
    gpus = [g(0, use(100, 70, priority=0))]
    assert isinstance(plan(gpus, [job(1, 30)], 0, now=NOW, policy=ALL)[0], Wait)
    d = plan(gpus, [job(1, 30, priority=1)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Preempt) and d[0].victims == (100,)


def test_a_burstable_job_over_its_request_goes_before_one_within_it() -> None:
    gpus = [g(0, use(100, 35, used=20), use(101, 35, used=50))]
    d = plan(gpus, [job(1, 30, qos=GUARANTEED)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Preempt) and d[0].victims == (101,)


def test_least_run_time_lost_breaks_ties() -> None:
    gpus = [g(0, use(100, 35, started=NOW - 5000), use(101, 35, started=NOW - 50))]
    d = plan(gpus, [job(1, 30, qos=GUARANTEED)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Preempt) and d[0].victims == (101,)


def test_unneeded_victims_are_dropped() -> None:
    # Cheapest first would take 100 (5 GiB) and then 101 (40 GiB); 101 alone suffices.
    gpus = [
        g(0, use(100, 5, qos=BESTEFFORT), use(101, 40, priority=-1), use(102, 30, qos=GUARANTEED))
    ]
    d = plan(gpus, [job(1, 40, qos=GUARANTEED)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Preempt) and d[0].victims == (101,)


def test_a_job_waits_for_victims_already_stopping_instead_of_taking_more() -> None:
    gpus = [g(0, use(100, 40, qos=BESTEFFORT, preempting=True), use(101, 40, qos=BESTEFFORT))]
    d = plan(gpus, [job(1, 30, qos=GUARANTEED)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Wait) and "preempted job(s) 100" in d[0].reason


def test_room_freed_by_preemption_is_not_backfilled() -> None:
    gpus = [g(0, use(100, 70, qos=BESTEFFORT))]
    d = by_id(
        plan(gpus, [job(1, 60, qos=GUARANTEED, at=1), job(2, 5, at=2)], 0, now=NOW, policy=ALL)
    )
    assert isinstance(d[1], Preempt)
    # 10 GiB are free now; job 2 (5 GiB, no timeout) would still run when job 1 starts,
    # and 80 - 5 ≥ 60, so it does not delay job 1 and may start.
    assert isinstance(d[2], Place)
    d = by_id(
        plan(gpus, [job(1, 78, qos=GUARANTEED, at=1), job(2, 5, at=2)], 0, now=NOW, policy=ALL)
    )
    assert isinstance(d[1], Preempt) and isinstance(d[2], Wait)


def test_preemption_off_means_waiting() -> None:
    gpus = [g(0, use(100, 70, qos=BESTEFFORT))]
    d = plan(gpus, [job(1, 30, qos=GUARANTEED)], 0, now=NOW, policy=Policy(preemption=False))
    assert isinstance(d[0], Wait)


# --- limits and backoff -------------------------------------------------------------------


def test_per_user_limits() -> None:
    lim = Limits(
        default=UserLimits(max_running=2),
        users={"carol": UserLimits(max_gpus=1, max_memory=20 * GiB)},
    )
    pol = Policy(limits=lim)
    gpus = [g(0, use(100, 5, user="alice"), use(101, 5, user="alice")), g(1), g(2)]
    d = by_id(plan(gpus, [job(1, 5), job(2, 5, user="dave")], 0, now=NOW, policy=pol))
    assert isinstance(d[1], Wait) and "user alice may run 2 job(s) at once" in d[1].reason
    assert isinstance(d[2], Place)
    d = by_id(
        plan(
            gpus,
            [job(3, 15, user="carol"), job(4, 15, user="carol"), job(5, 5, user="carol", at=NOW)],
            0,
            now=NOW,
            policy=pol,
        )
    )
    assert isinstance(d[3], Place)
    assert isinstance(d[4], Wait) and "may hold 1 GPU(s)" in d[4].reason
    lim2 = Limits(default=UserLimits(max_memory=20 * GiB))
    d = by_id(
        plan([g(0)], [job(6, 15), job(7, 15, at=NOW)], 0, now=NOW, policy=Policy(limits=lim2))
    )
    assert isinstance(d[6], Place)
    assert isinstance(d[7], Wait) and "may reserve 20.0GiB" in d[7].reason


def test_a_job_in_backoff_waits() -> None:
    d = plan([g(0)], [job(1, not_before=NOW + 30)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Wait) and d[0].reason.startswith("retry backs off until")


# --- properties ---------------------------------------------------------------------------


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[GpuState], list[QueuedJob]]:
    n = draw(st.integers(1, 3))
    jid = iter(range(100, 1000))
    gpus = []
    for i in range(n):
        uses = []
        room = 80
        for _ in range(draw(st.integers(0, 3))):
            size = draw(st.integers(1, 40))
            if size > room:
                break
            room -= size
            uses.append(
                use(
                    next(jid),
                    size,
                    qos=draw(st.sampled_from(QOS_CLASSES)),
                    priority=draw(st.integers(-2, 2)),
                    started=NOW - draw(st.integers(0, 5000)),
                    ends=draw(st.one_of(st.none(), st.integers(1, 7200).map(lambda s: NOW + s))),
                    expected=draw(
                        st.one_of(st.none(), st.integers(-600, 7200).map(lambda s: NOW + s))
                    ),
                    used=draw(st.one_of(st.none(), st.integers(0, 60))),
                )
            )
        gpus.append(g(i, *uses))
    queue = [
        job(
            i,
            draw(st.one_of(st.none(), st.integers(1, 79))),
            qos=draw(st.sampled_from(QOS_CLASSES)),
            priority=draw(st.integers(-2, 2)),
            at=NOW - draw(st.sampled_from((0, 100, 899, 900, 2000))),
            runtime=draw(st.one_of(st.none(), st.integers(1, 7200).map(float))),
            estimate=draw(st.one_of(st.none(), st.integers(1, 7200).map(float))),
            count=draw(st.integers(1, 2)),
        )
        for i in range(1, draw(st.integers(1, 6)))
    ]
    return gpus, queue


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_backfill_never_delays_the_head_job(
    scene: tuple[list[GpuState], list[QueuedJob]],
) -> None:
    gpus, queue = scene
    decisions = plan(gpus, queue, 0, now=NOW, policy=Policy(preemption=False))
    waiting = [d for d in decisions if isinstance(d, Wait)]
    if not waiting:
        return
    jobs = {j.id: j for j in queue}
    # The head: the first job that waited for room (not for a limit or a delay rule).
    heads = [d for d in waiting if "would delay" not in d.reason]
    if not heads:
        return
    head = jobs[heads[0].job_id]
    placed_before = [d for d in decisions[: decisions.index(heads[0])] if isinstance(d, Place)]
    state = list(gpus)
    for p in placed_before:
        state = apply(state, jobs[p.job_id], p, 0, started_at=NOW)
    before = backfill.reserve(head, state, NOW, 0, fits)
    if before is None or (
        before.shadow is None and not backfill.starving(head, NOW, DEFAULT_STARVE_AFTER)
    ):
        return  # an unknown start that holds no room yet: the next property
    # Every job placed after the head was considered runs as a claim with its own end
    # (as expected: the guarantee is that the plan never delays the head job).
    after = state
    for d in decisions[decisions.index(heads[0]) :]:
        if isinstance(d, Place):
            j = jobs[d.job_id]
            after = [
                gpu
                if gpu.index not in d.gpus
                else GpuState(
                    gpu.index,
                    gpu.uuid,
                    gpu.total,
                    managed=(
                        *gpu.managed,
                        use(
                            j.id,
                            d.budget / GiB,
                            ends=None if j.runtime is None else NOW + j.runtime,
                            exclusive=j.mem is None,
                            expected=None
                            if j.expected_runtime is None
                            else NOW + j.expected_runtime,
                        ),
                    ),
                )
                for gpu in after
            ]
    note(f"gpus={gpus}")
    note(f"decisions={decisions}")
    if before.shadow is None:
        # Unknown start (taken as now): with the same jobs gone as in the reservation,
        # the head job must still fit beside everything that was backfilled.
        gone = set(claims(state)) - set(claims(before.at_shadow))
        assert fits(head, release(after, gone), 0) is not None
    else:
        res = backfill.reserve(head, after, NOW, 0, fits)
        assert res is not None and res.shadow is not None
        assert res.shadow <= before.shadow


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_preemption_only_hits_cheaper_jobs_and_never_guaranteed(
    scene: tuple[list[GpuState], list[QueuedJob]],
) -> None:
    gpus, queue = scene
    held = claims(gpus)
    jobs = {j.id: j for j in queue}
    stopped: set[int] = set()
    for d in plan(gpus, queue, 0, now=NOW, policy=ALL):
        if not isinstance(d, Preempt):
            continue
        me = jobs[d.job_id]
        assert d.victims and not (set(d.victims) & stopped)  # nobody is stopped twice
        stopped |= set(d.victims)
        for v in d.victims:
            u = held[v][0]
            assert u.qos != GUARANTEED
            assert (QOS_RANK[u.qos], u.priority) < (QOS_RANK[me.qos], me.priority)
            assert preempt.may_preempt(me, u)


# --- OOM retry ----------------------------------------------------------------------------


def test_oom_signatures_are_found_in_the_output_tail() -> None:
    from gpuwarden.sched.oom import oom_signature

    for text in (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors ...",
        "cudaErrorMemoryAllocation: out of memory",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
        "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
        "jax: RESOURCE_EXHAUSTED: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    ):
        assert oom_signature("step 1\n" + text + "\n") is not None, text
    assert oom_signature("Traceback ...\nValueError: bad shape\n") is None
    assert oom_signature("x" * 1000 + " CUDA out of memory")
    assert len(oom_signature("x" * 1000 + " CUDA out of memory") or "") == 300


# The retry budget and its timing: tests/unit/test_sched_oom.py.


# --- watchdog -----------------------------------------------------------------------------


def test_watchdog_acts_per_class() -> None:
    from gpuwarden.sched.watchdog import KILL, NOTE, WARN, check

    over = {"GPU-0": 12 * GiB}
    assert check(1, GUARANTEED, 10 * GiB, 10 * GiB, over, True).action == WARN  # type: ignore[union-attr]
    assert check(1, BESTEFFORT, 10 * GiB, 10 * GiB, over, False).action == KILL  # type: ignore[union-attr]
    assert check(1, BURSTABLE, 10 * GiB, 10 * GiB, over, False).action == WARN  # type: ignore[union-attr]
    assert check(1, BURSTABLE, 10 * GiB, 10 * GiB, over, True).action == KILL  # type: ignore[union-attr]
    burst = check(1, BURSTABLE, 10 * GiB, 16 * GiB, over, True)
    assert burst is not None and burst.action == NOTE and "bursting" in burst.detail
    assert check(1, BURSTABLE, 10 * GiB, 16 * GiB, {"GPU-0": 9 * GiB}, True) is None
    assert check(1, BESTEFFORT, None, None, over, True) is None  # a whole GPU: no limit
    d = check(1, BESTEFFORT, 10 * GiB, 10 * GiB, {"GPU-0": 11 * GiB, "GPU-1": 13 * GiB}, True)
    assert d is not None and d.gpu == "GPU-1" and d.used == 13 * GiB


def test_a_bursting_job_counts_at_what_it_uses() -> None:
    gpus = [g(0, use(100, 10, used=40))]
    d = plan(gpus, [job(1, 45)], 0, now=NOW, policy=Policy(preemption=False))
    assert isinstance(d[0], Wait) and d[0].cause == "room"  # 80 - 40 < 45 though 10 booked


# --- history: learned budgets, failure streaks ---------------------------------------------


def test_learned_budget_is_the_highest_recent_peak_plus_a_margin_rounded_up() -> None:
    from gpuwarden.sched.history import learned_budget

    budget, how = learned_budget([10 * GiB, 12 * GiB, 11 * GiB])
    assert budget == int(14.5 * GiB)  # 1.2 × 12 GiB = 14.4 GiB, up to 256 MiB steps
    assert "3 earlier run(s)" in how
    assert learned_budget([]) == (
        None,
        "no earlier successful run with a recorded peak: a whole GPU",
    )
    # Only the five most recent runs count.
    assert learned_budget([GiB] * 5 + [50 * GiB])[0] == int(1.25 * GiB)


def test_a_streak_is_three_failures_the_same_way() -> None:
    from gpuwarden.sched.history import failing_streak, failure_signature

    oom = failure_signature("failed", 1, "exit code 1", True)
    assert oom == "CUDA out of memory"
    assert failing_streak([oom, oom, oom]) == oom
    assert failing_streak([oom, oom]) is None
    three = failure_signature("failed", 3, None, False)
    assert failing_streak([three, three, oom]) is None
    assert failing_streak([failure_signature("succeeded", 0, None, False)] * 3) is None
    assert (
        failure_signature("failed", None, "command not found: x", False) == "command not found: x"
    )


def test_declared_vs_actual() -> None:
    from gpuwarden.sched.history import declared_vs_actual

    assert (
        declared_vs_actual(10 * GiB, 8 * GiB)
        == "peak 8192MiB of 10.0GiB declared: over-declared by 2048MiB (20%)"
    )
    assert "under-declared by" in (declared_vs_actual(10 * GiB, 11 * GiB) or "")
    assert declared_vs_actual(None, GiB) is None
    assert declared_vs_actual(GiB, GiB) == "peak 1024MiB: as declared"


# --- CPU cores held alone (--cpus) ----------------------------------------------------------


def _cpu_gpu(index: int, cores: set[int], free: set[int] | None = None) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        total=80 * GiB,
        local_cpus=frozenset(cores),
        free_cpus=frozenset(cores if free is None else free),
    )


def test_cores_are_held_alone_and_booked_within_a_pass() -> None:
    from dataclasses import replace

    gpus = [_cpu_gpu(0, {0, 1, 2, 3}), _cpu_gpu(1, {0, 1, 2, 3})]  # one NUMA node
    a, b, c = (replace(job(i, 5), cpus=2) for i in (1, 2, 3))
    d = by_id(plan(gpus, [a, b, c], 0, now=NOW, policy=ALL))
    assert isinstance(d[1], Place) and d[1].cpus == (0, 1)
    assert isinstance(d[2], Place) and d[2].cpus == (2, 3)
    assert isinstance(d[3], Wait) and "0 free CPU core(s) near it" in d[3].reason


def test_cores_come_from_each_gpus_node() -> None:
    from dataclasses import replace

    gpus = [_cpu_gpu(0, {0, 1, 2, 3}), _cpu_gpu(1, {4, 5, 6, 7}, free={6, 7})]
    two = replace(job(1, 5, count=2), cpus=4)
    [p] = plan(gpus, [two], 0, now=NOW, policy=ALL)
    assert isinstance(p, Place) and p.cpus == (0, 1, 6, 7)


def test_more_cores_than_any_gpu_has_is_infeasible() -> None:
    from dataclasses import replace

    from gpuwarden.sched.model import Infeasible

    [d] = plan([_cpu_gpu(0, {0, 1})], [replace(job(1, 5), cpus=3)], 0, now=NOW, policy=ALL)
    assert isinstance(d, Infeasible) and "at most 2 are near each GPU" in d.reason


def test_jobs_without_cpus_ignore_cores() -> None:
    d = plan([_cpu_gpu(0, {0}, free=set())], [job(1, 5)], 0, now=NOW, policy=ALL)
    assert isinstance(d[0], Place) and d[0].cpus == ()
