"""Queue order and the scheduling pass: rules by example, then invariant 1 and the rest as
properties over random GPU states and queues."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuwarden.sched import limits
from gpuwarden.sched.booking import apply
from gpuwarden.sched.headroom import headroom
from gpuwarden.sched.model import (
    Decision,
    GpuState,
    Infeasible,
    ManagedUse,
    Place,
    QueuedJob,
    Wait,
)
from gpuwarden.sched.placement import fits, infeasible_reason
from gpuwarden.sched.queue import Policy, order, plan

GiB = 1 << 30
MiB = 1 << 20


def g(index: int, total: float = 80, used: tuple[float, ...] = ()) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        total=int(total * GiB),
        managed=tuple(ManagedUse(100 + i, int(b * GiB)) for i, b in enumerate(used)),
    )


def job(
    id: int, mem: float | None = 10, *, priority: int = 0, at: float = 0.0, count: int = 1
) -> QueuedJob:
    return QueuedJob(
        id=id,
        user="alice",
        mem=None if mem is None else int(mem * GiB),
        count=count,
        priority=priority,
        submitted_at=at,
    )


def by_id(decisions: Iterable[Decision]) -> dict[int, Decision]:
    return {d.job_id: d for d in decisions}


# --- order ------------------------------------------------------------------------------


def test_order_is_priority_then_submit_time_then_id() -> None:
    queue = [
        job(1, at=5),
        job(2, priority=1, at=9),
        job(3, at=1),
        job(4, at=1),
        job(5, priority=-1),
    ]
    assert [j.id for j in order(reversed(queue))] == [2, 3, 4, 1, 5]


# --- plan -------------------------------------------------------------------------------


def test_one_pass_never_overbooks_a_gpu() -> None:
    decisions = plan([g(0, 50)], [job(1, 30, at=1), job(2, 30, at=2)], 0.1)
    assert decisions[0] == Place(1, (0,), 30 * GiB)
    assert isinstance(decisions[1], Wait)
    assert decisions[1].reason == "waiting for 30.0GiB free on one GPU; best has 20.0GiB (GPU 0)"


def test_jobs_pack_by_best_fit_within_a_pass() -> None:
    gpus = [g(0, 80), g(1, 40)]
    decisions = plan(gpus, [job(1, 30, at=1), job(2, 30, at=2), job(3, 30, at=3)], 0.1)
    assert [d.gpus for d in decisions if isinstance(d, Place)] == [(1,), (0,), (0,)]


def test_priority_goes_first() -> None:
    decisions = plan([g(0, 40)], [job(1, 30, at=1), job(2, 30, priority=5, at=2)], 0.1)
    assert [type(d) for d in decisions] == [Place, Wait]
    assert decisions[0].job_id == 2


def test_smaller_jobs_backfill_when_the_head_waits() -> None:
    gpus = [g(0, 80, used=(60,))]
    decisions = by_id(plan(gpus, [job(1, 30, at=1), job(2, 10, at=2), job(3, 15, at=3)], 0.1))
    assert isinstance(decisions[1], Wait)
    assert decisions[2] == Place(2, (0,), 10 * GiB)
    assert isinstance(decisions[3], Wait)  # 10 GiB left after job 2


def test_infeasible_jobs_are_decided_and_do_not_block() -> None:
    decisions = plan([g(0, 40)], [job(1, 50, at=1), job(2, 10, at=2), job(3, count=2, at=3)])
    assert isinstance(decisions[0], Infeasible) and "40.0GiB" in decisions[0].reason
    assert decisions[1] == Place(2, (0,), 10 * GiB)
    assert isinstance(decisions[2], Infeasible)
    assert decisions[2].reason == "needs 2 GPUs but only 1 usable on this machine"


def test_whole_gpu_job_waits_for_idle_gpu_while_others_pack() -> None:
    gpus = [g(0, 80, used=(1,)), g(1, 80)]
    decisions = plan(gpus, [job(1, 5, at=1), job(2, None, at=2), job(3, None, at=3)], 0.1)
    assert decisions[0] == Place(1, (0,), 5 * GiB)  # best fit keeps GPU 1 idle
    assert decisions[1] == Place(2, (1,), 80 * GiB)
    assert isinstance(decisions[2], Wait)


def test_a_job_listed_twice_is_decided_once() -> None:
    decisions = plan([g(0)], [job(1, 10), job(1, 10)])
    assert decisions == [Place(1, (0,), 10 * GiB)]


def test_empty_queue_and_no_gpus() -> None:
    assert plan([g(0)], []) == []
    assert plan([], [job(1)]) == [Infeasible(1, "this machine has no GPUs")]


def test_ordering_and_fit_are_replaceable_seams() -> None:
    def fifo(queue: Iterable[QueuedJob]) -> list[QueuedJob]:
        return sorted(queue, key=lambda j: j.submitted_at)

    def roomiest(j: QueuedJob, gpus: Sequence[GpuState], spike: float) -> Place | None:
        room = max(gpus, key=lambda x: headroom(x, spike))
        return Place(j.id, (room.index,), j.mem or 0) if j.mem else None

    queue = [job(1, 30, at=1), job(2, 30, priority=5, at=2)]
    assert [d.job_id for d in plan([g(0, 40)], queue, ordering=fifo)] == [1, 2]
    decisions = plan([g(0, 80), g(1, 40)], [job(1, 5)], fit=roomiest)
    assert decisions == [Place(1, (0,), 5 * GiB)]


def test_a_fit_that_overbooks_is_refused() -> None:
    def greedy(j: QueuedJob, gpus: Sequence[GpuState], spike: float) -> Place | None:
        return Place(j.id, (0,), j.mem or 0)

    with pytest.raises(ValueError, match="exceeds its headroom"):
        plan([g(0, 40)], [job(1, 30, at=1), job(2, 30, at=2)], fit=greedy)


# --- an OOM retry that crept into its cap: room up to its ceiling, when no job needs it ---


def crept(id: int, mem: float, ceiling: float, *, at: float = 0.0) -> QueuedJob:
    return replace(job(id, mem, at=at), mem_ceiling=int(ceiling * GiB))


def test_a_crept_retry_gets_the_room_no_job_of_the_pass_takes() -> None:
    # Two jobs of 35 and 20 ended on an 80 GiB GPU where a 15 GiB job still runs; first
    # in line a retry asking 20 GiB (up to 40 where there is room), then a 30 GiB job.
    # Taking 40 would have left the 30 GiB job waiting behind 25 GiB.
    gpus = [g(0, 80, used=(15,))]
    decisions = by_id(plan(gpus, [crept(1, 20, 40, at=1), job(2, 30, at=2)], 0))
    assert decisions[2] == Place(2, (0,), 30 * GiB)
    assert decisions[1] == Place(1, (0,), 35 * GiB)  # 20 asked, the 15 left over
    alone = plan(gpus, [crept(1, 20, 40, at=1)], 0)
    assert alone == [Place(1, (0,), 40 * GiB)]  # room to spare: all of its ceiling
    few = plan([g(0, 80, used=(40,))], [crept(1, 20, 60, at=1)], 0)
    assert few == [Place(1, (0,), 40 * GiB)]  # all there is, short of its ceiling


def test_crept_retries_share_the_spare_room_in_queue_order() -> None:
    gpus = [g(0, 80)]
    decisions = plan(gpus, [crept(2, 20, 40, at=2), crept(1, 20, 40, at=1)], 0)
    assert decisions == [Place(1, (0,), 40 * GiB), Place(2, (0,), 40 * GiB)]
    decisions = plan([g(0, 70)], [crept(2, 20, 40, at=2), crept(1, 20, 40, at=1)], 0)
    assert by_id(decisions) == {1: Place(1, (0,), 40 * GiB), 2: Place(2, (0,), 30 * GiB)}


def test_a_crept_retry_leaves_the_room_a_starving_first_job_holds() -> None:
    # The 50 GiB job has waited past the guard: the room it needs once the 40 GiB job
    # ends is held. The retry may start within its request, but takes no more.
    gpus = [g(0, 80, used=(40,))]
    queue = [job(1, 50, at=0), crept(2, 20, 40, at=1)]
    decisions = by_id(plan(gpus, queue, 0, now=2000.0, policy=Policy(preemption=False)))
    assert isinstance(decisions[1], Wait)
    assert decisions[2] == Place(2, (0,), 20 * GiB)
    early = by_id(plan(gpus, queue, 0, now=100.0, policy=Policy(preemption=False)))
    assert early[2] == Place(2, (0,), 40 * GiB)  # before the guard, nothing is held


def test_a_crept_retry_grows_no_further_than_its_users_memory_limit() -> None:
    lim = limits.Limits(default=limits.UserLimits(max_memory=30 * GiB))
    decisions = plan([g(0, 80)], [crept(1, 20, 40)], 0, policy=Policy(limits=lim))
    assert decisions == [Place(1, (0,), 30 * GiB)]


# --- properties -------------------------------------------------------------------------

MODES = ["Default"] * 6 + ["Exclusive_Process", "Exclusive_Thread", "Prohibited"]
SPIKES = [0.0, 0.1, 0.25, 0.5, 1.0]
SIZES = st.one_of(  # mostly sizes that fit somewhere, some that never do
    st.integers(0, 24).map(lambda n: n * GiB),
    st.integers(0, 24 * GiB),
    st.integers(0, 12).map(lambda n: n * GiB),
    st.integers(0, 90 * GiB),
)


@st.composite
def gpu_states(draw: st.DrawFn) -> list[GpuState]:
    n = draw(st.integers(1, 8))
    indices = draw(st.permutations(range(n)))
    states = []
    for index in indices:
        total = draw(st.sampled_from([8, 16, 24, 40, 80])) * GiB + draw(st.integers(0, MiB))
        budgets = draw(st.lists(st.integers(0, total // 2), max_size=4))
        alone = draw(
            st.lists(
                st.sampled_from([False, False, False, True]),
                min_size=len(budgets),
                max_size=len(budgets),
            )
        )
        states.append(
            GpuState(
                index=index,
                uuid=f"GPU-{index}",
                total=total,
                reserve=draw(st.sampled_from([0, 512 * MiB, GiB, 3 * GiB + 7])),
                context=draw(st.sampled_from([0, 0, 512 * MiB, 700 * MiB + 3])),
                numa_node=draw(st.sampled_from([0, 1, None])),
                nvlink_peers=tuple(sorted(draw(st.sets(st.integers(0, n - 1))) - {index})),
                compute_mode=draw(st.sampled_from(MODES)),
                managed=tuple(
                    ManagedUse(1000 + 10 * index + i, b, x, context=c)
                    for i, (b, x, c) in enumerate(
                        zip(
                            budgets,
                            alone,
                            draw(
                                st.lists(
                                    st.sampled_from([0, 512 * MiB]),
                                    min_size=len(budgets),
                                    max_size=len(budgets),
                                )
                            ),
                            strict=True,
                        )
                    )
                ),
                foreign_peak=draw(st.one_of(st.just(0), st.integers(0, total))),
                foreign_processes=draw(st.integers(0, 2)),
            )
        )
    return states


@functools.cache
def queued(id: int, gpus: int = 8) -> st.SearchStrategy[QueuedJob]:
    """A job; its ``gpu_ids`` mostly name GPUs among the first ``gpus``, sometimes not.
    Cached: building strategies anew for every draw doubles the suite's time."""
    return st.builds(
        QueuedJob,
        id=st.just(id),
        user=st.sampled_from(["alice", "bob"]),
        mem=st.one_of(st.none(), SIZES),
        count=st.sampled_from([1, 1, 1, 1, 2, 2, 3, 4, 0, 9]),
        gpu_ids=st.one_of(
            st.none(),
            st.none(),
            st.lists(st.integers(0, gpus - 1), min_size=1, max_size=4).map(tuple),
            st.lists(st.integers(0, 9), max_size=4).map(tuple),
        ),
        exclusive=st.sampled_from([False, False, False, True]),
        priority=st.integers(0, 3),
        submitted_at=st.integers(0, 50).map(float),
        runtime=st.one_of(st.none(), st.integers(1, 3600).map(float)),
        estimate=st.one_of(st.none(), st.integers(1, 3600).map(float)),
        mem_ceiling=st.one_of(st.none(), st.none(), st.none(), SIZES),  # crept OOM retries
        wait_for_ceiling=st.booleans(),
        not_before=st.sampled_from([0.0, 0.0, 0.0, 0.0, 1e9]),  # some back off
        returning=st.sampled_from([False, False, False, True]),  # services coming back
    )


@st.composite
def machines(draw: st.DrawFn) -> tuple[list[GpuState], list[QueuedJob]]:
    """Random GPU states (1-8 GPUs) and a random queue (0-30 jobs) for them."""
    gpus = draw(gpu_states())
    n = draw(st.integers(0, 30))
    return gpus, [draw(queued(i + 1, len(gpus))) for i in range(n)]


def available(gpu: GpuState, spike: float) -> Fraction:
    """What invariant 1 allows new reservations to take, exactly (spike as the decimal):
    each claim books its budget and its CUDA context allowance."""
    booked = sum(u.budget + u.context for u in gpu.managed)
    return gpu.total - gpu.reserve - booked - gpu.foreign_peak * (1 + Fraction(str(spike)))


def empty(gpus: Sequence[GpuState]) -> list[GpuState]:
    return [
        GpuState(
            index=x.index,
            uuid=x.uuid,
            total=x.total,
            reserve=x.reserve,
            context=x.context,
            numa_node=x.numa_node,
            nvlink_peers=x.nvlink_peers,
            compute_mode=x.compute_mode,
        )
        for x in gpus
    ]


PROPERTY = settings(max_examples=200, deadline=None)
# Passes without backfill (the default), with backfill and best fit behind a waiting job
# (its room free while its start is unknown, or held at once), with preemption too.
POLICIES = st.sampled_from(
    [None, Policy(preemption=False), Policy(preemption=False, starve_after=0), Policy()]
)
BACKFILL = st.sampled_from(
    [None, Policy(preemption=False), Policy(preemption=False, starve_after=0)]
)


@PROPERTY
@given(machine=machines(), spike=st.sampled_from(SPIKES), policy=POLICIES)
def test_a_pass_never_books_more_than_headroom(
    machine: tuple[list[GpuState], list[QueuedJob]], spike: float, policy: Policy | None
) -> None:
    gpus, queue = machine
    decisions = plan(gpus, queue, spike, now=100.0, policy=policy)
    new: dict[int, int] = {x.index: 0 for x in gpus}
    context = {x.index: x.context for x in gpus}
    for d in decisions:
        if isinstance(d, Place):
            for i in d.gpus:
                new[i] += d.budget + context[i]  # a placed job books its context too
    for x in gpus:
        room = available(x, spike)
        assert new[x.index] <= max(room, Fraction(0)), (x, new[x.index])
        assert new[x.index] <= headroom(x, spike)
        if room >= 0:  # not overbooked before the pass: not after it either
            after = sum(u.budget + u.context for u in x.managed) + new[x.index]
            assert after <= x.total - x.reserve - x.foreign_peak * (1 + Fraction(str(spike)))


@PROPERTY
@given(machine=machines(), spike=st.sampled_from(SPIKES), policy=POLICIES)
def test_every_job_gets_one_decision_and_places_are_well_formed(
    machine: tuple[list[GpuState], list[QueuedJob]], spike: float, policy: Policy | None
) -> None:
    gpus, queue = machine
    decisions = plan(gpus, queue, spike, now=100.0, policy=policy)
    assert sorted(d.job_id for d in decisions) == sorted(j.id for j in queue)
    jobs = {j.id: j for j in queue}
    states = {x.index: x for x in gpus}
    alone: set[int] = set()  # GPUs a whole/exclusive job took in this pass
    used: dict[int, int] = {}
    for d in decisions:
        if not isinstance(d, Place):
            continue
        j = jobs[d.job_id]
        assert len(d.gpus) == len(set(d.gpus)) == j.count
        assert set(d.gpus) <= set(states)
        if j.gpu_ids is not None:
            assert set(d.gpus) <= set(j.gpu_ids)
        if j.mem is not None and j.mem_ceiling is None:
            assert d.budget == j.mem
        elif j.mem is not None:  # as much as there is room for, up to its ceiling
            assert j.mem <= d.budget <= max(j.mem, j.mem_ceiling)
        for i in d.gpus:
            x = states[i]
            assert x.compute_mode != "Prohibited"
            assert not any(u.exclusive for u in x.managed)
            assert i not in alone
            if j.mem is None or j.exclusive or x.compute_mode != "Default":
                assert not x.managed and x.foreign_processes == 0 and i not in used
            if j.mem is None or j.exclusive:
                alone.add(i)
            used[i] = used.get(i, 0) + 1


@PROPERTY
@given(machine=machines(), spike=st.sampled_from(SPIKES), policy=POLICIES)
def test_a_crept_retry_takes_no_room_a_job_waiting_for_room_could_use(
    machine: tuple[list[GpuState], list[QueuedJob]], spike: float, policy: Policy | None
) -> None:
    # Booked at their requests, the pass's placements leave every job that waits for room
    # without a fit: what crept retries got above their requests no waiting job could use.
    gpus, queue = machine
    assume(not any(j.returning and j.not_before > 100.0 for j in queue))  # their holds
    decisions = plan(gpus, queue, spike, now=100.0, policy=policy)
    jobs = {j.id: j for j in queue}
    state = list(gpus)
    for d in decisions:
        if isinstance(d, Place):
            j = jobs[d.job_id]
            asked = d.budget if j.mem is None or j.mem_ceiling is None else j.mem
            state = apply(state, j, replace(d, budget=asked), spike)
    for d in decisions:
        if isinstance(d, Wait) and d.cause == "room":
            assert fits(jobs[d.job_id], state, spike) is None, d


@PROPERTY
@given(machine=machines())
def test_infeasible_means_it_cannot_fit_even_on_empty_gpus(
    machine: tuple[list[GpuState], list[QueuedJob]],
) -> None:
    gpus, queue = machine
    idle = empty(gpus)
    for d in plan(gpus, queue, 0.1):
        j = next(q for q in queue if q.id == d.job_id)
        if isinstance(d, Infeasible):
            assert d.reason and fits(j, idle, 0.1) is None
        else:  # and the converse: a feasible job fits on an empty machine
            assert infeasible_reason(j, gpus) is None
            assert fits(j, idle, 0.1) is not None


@PROPERTY
@given(
    gpus=gpu_states(),
    template=queued(1, 2),
    n=st.integers(0, 30),
    keys=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), min_size=30, max_size=30),
    spike=st.sampled_from(SPIKES),
    policy=BACKFILL,
)
def test_identical_jobs_are_placed_in_priority_order(
    gpus: list[GpuState],
    template: QueuedJob,
    n: int,
    keys: list[tuple[int, int]],
    spike: float,
    policy: Policy | None,
) -> None:
    queue = [
        QueuedJob(
            id=i + 1,
            user=template.user,
            mem=template.mem,
            count=template.count,
            gpu_ids=template.gpu_ids,
            exclusive=template.exclusive,
            priority=p,
            submitted_at=float(t),
        )
        for i, (p, t) in enumerate(keys[:n])
    ]
    decisions = by_id(plan(gpus, queue, spike, now=100.0, policy=policy))
    kinds = [type(decisions[j.id]) for j in order(queue)]
    placed = [k is Place for k in kinds]
    # The placed jobs are a prefix of the order: nobody of lower rank jumped ahead.
    assert placed == sorted(placed, reverse=True)
    assert len(set(kinds)) <= 2
