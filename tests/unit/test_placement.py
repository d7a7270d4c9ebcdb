"""Placement rules, one at a time: headroom, GPU states from a snapshot, the fit check,
and the reasons a job waits or can never run."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from gpuwarden.sched.booking import apply, reservation
from gpuwarden.sched.headroom import (
    DEFAULT_RESERVE,
    capacity,
    foreign_charge,
    foreign_parts,
    foreign_usage,
    gpu_states,
    headroom,
)
from gpuwarden.sched.model import GpuState, ManagedUse, Place, QueuedJob
from gpuwarden.sched.placement import (
    fits,
    infeasible_reason,
    missing_links,
    numa_nodes,
    wait_reason,
)
from tests.helpers.builders import gpu as facts
from tests.helpers.builders import proc, snapshot

GiB = 1 << 30
MiB = 1 << 20


def g(
    index: int,
    total: float = 80,
    *,
    reserve: float = 0,
    used: tuple[float, ...] = (),
    foreign: float = 0,
    fprocs: int = 0,
    mode: str = "Default",
    numa: int | None = 0,
    peers: tuple[int, ...] = (),
    exclusive_use: bool = False,
) -> GpuState:
    """A GPU state in GiB: ``used`` are budgets of managed jobs (ids 100+)."""
    managed = tuple(ManagedUse(100 + i, int(b * GiB), exclusive_use) for i, b in enumerate(used))
    return GpuState(
        index=index,
        uuid=f"GPU-{index}",
        total=int(total * GiB),
        reserve=int(reserve * GiB),
        numa_node=numa,
        nvlink_peers=peers,
        compute_mode=mode,
        managed=managed,
        foreign_peak=int(foreign * GiB),
        foreign_processes=fprocs,
    )


def job(
    mem: float | None = 10,
    *,
    id: int = 1,
    count: int = 1,
    gpu_ids: tuple[int, ...] | None = None,
    exclusive: bool = False,
) -> QueuedJob:
    return QueuedJob(
        id=id,
        user="alice",
        mem=None if mem is None else int(mem * GiB),
        count=count,
        gpu_ids=gpu_ids,
        exclusive=exclusive,
    )


def placed(result: Place | None) -> tuple[int, ...]:
    assert isinstance(result, Place), result
    return result.gpus


# --- headroom ----------------------------------------------------------------------------


def test_headroom_subtracts_reserve_budgets_and_foreign_peak_with_spike() -> None:
    gpu = g(0, 80, reserve=1, used=(10, 5), foreign=20)
    assert headroom(gpu, 0.1) == 80 * GiB - 1 * GiB - 15 * GiB - 22 * GiB
    assert headroom(gpu, 0.0) == 80 * GiB - 1 * GiB - 15 * GiB - 20 * GiB


def test_headroom_is_floored_at_zero() -> None:
    assert headroom(g(0, 10, used=(8,), foreign=5), 0.1) == 0


def test_foreign_charge_rounds_up_and_is_exact() -> None:
    assert foreign_charge(10, 0.1) == 11
    assert foreign_charge(3, 0.5) == 5  # 4.5 → 5
    for peak in (1, 7, 12345, 79 * GiB + 3):  # the decimal 0.1, not the float above it
        assert foreign_charge(peak, 0.1) >= peak * Fraction("1.1")
        assert foreign_charge(peak, 0.1) - 1 < peak * Fraction("1.1")
    with pytest.raises(ValueError):
        foreign_charge(1, -0.1)


# --- gpu_states --------------------------------------------------------------------------


def test_gpu_states_splits_managed_and_foreign_and_counts_leaks() -> None:
    snap = snapshot(
        [
            # 3 GiB managed (pid 10), 2 GiB foreign (pid 20), 1 GiB nobody accounts for.
            (
                facts(0, used=6 * GiB, numa_node=1, nvlink_peers=(1,)),
                [proc(10, 0, memory=3 * GiB), proc(20, 0, memory=2 * GiB)],
            ),
            (facts(1, used=0, compute_mode="Prohibited"), []),
        ]
    )
    uses = {"GPU-0": [ManagedUse(7, 4 * GiB)]}
    s0, s1 = gpu_states(snap, uses, {10}, {"GPU-1": 5 * GiB})
    assert (s0.index, s0.uuid, s0.numa_node, s0.nvlink_peers) == (0, "GPU-0", 1, (1,))
    assert s0.managed == (ManagedUse(7, 4 * GiB),)
    assert s0.foreign_peak == 3 * GiB and s0.foreign_processes == 1
    assert s0.reserve == DEFAULT_RESERVE == 512 * MiB
    # The remembered peak wins over a lower current reading.
    assert s1.foreign_peak == 5 * GiB and s1.foreign_processes == 0
    assert s1.compute_mode == "Prohibited" and s1.managed == ()


def test_gpu_states_takes_the_daemons_foreign_figure_as_given() -> None:
    """The daemon's figure already holds the current reading of foreign processes (in
    its peaks) and leaves out memory no process accounts for that has not persisted
    (a job's memory the driver is still freeing): the snapshot does not override it."""
    snap = snapshot([(facts(0, used=8 * GiB), [proc(20, 0, memory=2 * GiB)])])
    (s,) = gpu_states(
        snap, {}, set(), {"GPU-0": 2 * GiB}, reserve=GiB, contexts={"GPU-0": 300 * MiB}
    )
    assert s.foreign_peak == 2 * GiB and s.reserve == GiB and s.context == 300 * MiB
    (s,) = gpu_states(snap, {}, set())  # no figure: this snapshot's, leaked memory too
    assert s.foreign_peak == 8 * GiB and s.context == 0
    assert foreign_parts(snap.gpus[0], set()) == (2 * GiB, 6 * GiB)


def test_gpu_states_withheld_process_memory_counts_all_but_managed() -> None:
    snap = snapshot(
        [(facts(0, used=10 * GiB), [proc(10, 0, memory=4 * GiB), proc(20, 0, memory=None)])]
    )
    (s,) = gpu_states(snap, {}, {10})
    assert s.foreign_peak == 6 * GiB
    assert foreign_usage(snap, {10}) == {"GPU-0": 6 * GiB}


def test_gpu_states_missing_compute_mode_is_default() -> None:
    snap = snapshot([(facts(0, compute_mode=None), [])])
    assert gpu_states(snap, {}, set())[0].compute_mode == "Default"


# --- best fit ----------------------------------------------------------------------------


def test_best_fit_picks_the_tightest_gpu() -> None:
    gpus = [g(0, used=(10,)), g(1, used=(60,)), g(2, used=(65,)), g(3, used=(75,))]
    # Headroom 70, 20, 15, 5: a 12 GiB job fits on 0-2, tightest after placing is 2.
    assert placed(fits(job(12), gpus, 0.1)) == (2,)
    assert placed(fits(job(16), gpus, 0.1)) == (1,)
    assert placed(fits(job(21), gpus, 0.1)) == (0,)


def test_best_fit_ties_go_to_the_lower_index() -> None:
    assert placed(fits(job(10), [g(3), g(1), g(2)], 0.1)) == (1,)


def test_foreign_peak_with_spike_buffer_decides_the_fit() -> None:
    gpu = [g(0, 80, foreign=60)]  # 60 × 1.1 = 66 → 14 GiB headroom
    assert placed(fits(job(14), gpu, 0.1)) == (0,)
    assert fits(job(14.5), gpu, 0.1) is None
    assert placed(fits(job(19), gpu, 0.0)) == (0,)


def test_place_budget_is_the_request() -> None:
    result = fits(job(12), [g(0)], 0.1)
    assert result == Place(job_id=1, gpus=(0,), budget=12 * GiB)


# --- whole GPUs and exclusive ------------------------------------------------------------


def test_whole_gpu_job_only_on_idle_gpus_with_all_headroom() -> None:
    gpus = [g(0, reserve=1, used=(1,)), g(1, reserve=1, fprocs=1, foreign=1), g(2, reserve=1)]
    result = fits(job(None), gpus, 0.1)
    assert result == Place(1, (2,), 79 * GiB)
    assert fits(job(None), gpus[:2], 0.1) is None


def test_whole_gpu_on_a_leaky_idle_gpu_gets_what_is_left() -> None:
    # No process, but 10 GiB unaccounted: the budget leaves it out (invariant 1).
    result = fits(job(None), [g(0, reserve=0, foreign=10)], 0.0)
    assert result == Place(1, (0,), 70 * GiB)


def test_exclusive_needs_a_gpu_without_other_jobs_or_processes() -> None:
    gpus = [g(0, used=(1,)), g(1, fprocs=1, foreign=1), g(2, total=40)]
    assert placed(fits(job(10, exclusive=True), gpus, 0.1)) == (2,)
    assert fits(job(10, exclusive=True), gpus[:2], 0.1) is None
    assert fits(job(50, exclusive=True), gpus, 0.1) is None
    whole = fits(job(None, exclusive=True), gpus, 0.1)
    assert whole == Place(1, (2,), 40 * GiB)


def test_nobody_joins_a_gpu_held_alone() -> None:
    gpus = [g(0, used=(1,), exclusive_use=True), g(1, used=(70,))]
    assert fits(job(20), gpus, 0.1) is None
    assert placed(fits(job(5), gpus, 0.1)) == (1,)
    assert reservation(job(None), 5).exclusive and reservation(job(1, exclusive=True), 5).exclusive
    assert not reservation(job(1), 5).exclusive


# --- compute modes ------------------------------------------------------------------------


def test_prohibited_never_qualifies() -> None:
    assert fits(job(1), [g(0, mode="Prohibited")], 0.1) is None
    assert placed(fits(job(1), [g(0, mode="Prohibited"), g(1, used=(70,))], 0.1)) == (1,)


@pytest.mark.parametrize("mode", ["Exclusive_Process", "Exclusive_Thread"])
def test_exclusive_process_only_when_empty(mode: str) -> None:
    assert placed(fits(job(1), [g(0, mode=mode)], 0.1)) == (0,)
    assert fits(job(1), [g(0, mode=mode, used=(1,))], 0.1) is None
    assert fits(job(1), [g(0, mode=mode, fprocs=1, foreign=1)], 0.1) is None
    # A second job in the same pass sees the first one's reservation.
    gpus = apply([g(0, mode=mode)], job(1), Place(1, (0,), GiB), 0.1)
    assert fits(job(1, id=2), gpus, 0.1) is None


# --- gpu_ids ------------------------------------------------------------------------------


def test_gpu_ids_restrict_the_candidates() -> None:
    gpus = [g(0, used=(70,)), g(1), g(2)]
    assert placed(fits(job(5), gpus, 0.1)) == (0,)
    assert placed(fits(job(5, gpu_ids=(1, 2)), gpus, 0.1)) == (1,)
    assert placed(fits(job(5, gpu_ids=(2,)), gpus, 0.1)) == (2,)
    assert fits(job(20, gpu_ids=(0,)), gpus, 0.1) is None
    assert fits(job(5, gpu_ids=(2, 9)), gpus, 0.1) is None  # unknown GPU: never a fit


# --- multi-GPU ---------------------------------------------------------------------------


def test_multi_gpu_takes_distinct_gpus_on_one_numa_node() -> None:
    # Node 0 has the tightest pair overall (0 and 3), but only node 1 holds two.
    gpus = [g(0, used=(60,), numa=0), g(1, numa=1), g(2, numa=1), g(3, used=(60,), numa=2)]
    assert placed(fits(job(10, count=2), gpus, 0.1)) == (1, 2)


def test_multi_gpu_prefers_one_node_over_a_tighter_fit() -> None:
    gpus = [
        g(0, used=(65,), numa=0),
        g(1, numa=0),
        g(2, used=(65,), numa=1),
        g(3, numa=1),
        g(4, used=(66,), numa=1),
    ]
    # Node 1 offers 2+4 (tight), node 0 only 0+1; best fit within a node wins.
    assert placed(fits(job(10, count=2), gpus, 0.1)) == (2, 4)


def test_multi_gpu_prefers_nvlink_peers_then_best_fit() -> None:
    gpus = [
        g(0, used=(60,), peers=()),
        g(1, used=(60,), peers=()),
        g(2, peers=(3,)),
        g(3, peers=(2,)),
    ]
    assert placed(fits(job(10, count=2), gpus, 0.1)) == (2, 3)
    without_links = [g(i, used=(u,)) for i, u in enumerate((60, 60, 0, 0))]
    assert placed(fits(job(10, count=2), without_links, 0.1)) == (0, 1)


def test_multi_gpu_crosses_nodes_when_it_must() -> None:
    gpus = [g(0, numa=0), g(1, numa=1), g(2, used=(79,), numa=1)]
    assert placed(fits(job(10, count=2), gpus, 0.1)) == (0, 1)
    assert fits(job(10, count=3), gpus, 0.1) is None


def test_multi_gpu_whole_budget_is_the_smallest_headroom() -> None:
    gpus = [g(0, 80, reserve=1), g(1, 40, reserve=1), g(2, 80, reserve=1, used=(1,))]
    assert fits(job(None, count=2), gpus, 0.1) == Place(1, (0, 1), 39 * GiB)


def test_many_gpus_take_the_greedy_path_and_stay_valid() -> None:
    gpus = [g(i, used=(float(i),), numa=i % 2) for i in range(24)]
    result = fits(job(10, count=6), gpus, 0.1)
    chosen = placed(result)
    assert len(set(chosen)) == 6 and numa_nodes(gpus[i] for i in chosen) == 1
    assert chosen == (13, 15, 17, 19, 21, 23)  # the tightest six of node 1


def test_topology_helpers() -> None:
    gpus = [g(0, numa=0, peers=(1,)), g(1, numa=0), g(2, numa=None)]
    assert numa_nodes(gpus) == 2
    assert missing_links(gpus[:2]) == 0  # one side listing the other is a link
    assert missing_links(gpus) == 2


# --- apply: the guard of invariant 1 ----------------------------------------------------


def test_apply_books_the_reservation_and_refuses_overbooking() -> None:
    gpus = [g(0, 20), g(1, 20)]
    after = apply(gpus, job(15), Place(1, (1,), 15 * GiB), 0.1)
    assert after[0] == gpus[0]
    assert after[1].managed == (ManagedUse(1, 15 * GiB, user="alice"),)
    with pytest.raises(ValueError, match="headroom"):
        apply(after, job(6, id=2), Place(2, (1,), 6 * GiB), 0.1)
    with pytest.raises(ValueError, match="unknown GPU"):
        apply(gpus, job(1), Place(1, (5,), GiB), 0.1)


# --- infeasible --------------------------------------------------------------------------


def test_infeasible_when_more_than_any_empty_gpu_can_give() -> None:
    why = infeasible_reason(job(80), [g(0, 80, reserve=0.5), g(1, 40, reserve=0.5)])
    assert why == (
        "80.0GiB per GPU is more than this machine can give "
        "(largest: 79.5GiB = 80.0GiB total − 512MiB reserve)"
    )
    # Busy GPUs do not make a job infeasible: only empty capacity counts.
    assert infeasible_reason(job(70), [g(0, 80, used=(70,), foreign=10)]) is None


def test_infeasible_when_too_few_gpus() -> None:
    assert infeasible_reason(job(1, count=3), [g(0), g(1)]) == (
        "needs 3 GPUs but only 2 usable on this machine"
    )
    why = infeasible_reason(job(60, count=2), [g(0, 80), g(1, 40)])
    assert why == "only 1 GPU on this machine can give 60.0GiB (GPU 0); 2 can never fit"


def test_infeasible_unknown_gpu_ids_and_prohibited() -> None:
    gpus = [g(0), g(1, mode="Prohibited")]
    assert infeasible_reason(job(1, gpu_ids=(0, 7)), gpus) == (
        "unknown GPU 7: this machine has GPU 0,1"
    )
    assert infeasible_reason(job(1, gpu_ids=(1,)), gpus) == (
        "GPU 1: compute mode Prohibited (no process may use it)"
    )
    assert infeasible_reason(job(1, count=2), gpus) == (
        "needs 2 GPUs but only 1 usable on this machine (GPU 1: Prohibited)"
    )
    assert infeasible_reason(job(1, gpu_ids=(0,)), gpus) is None
    assert infeasible_reason(job(1), []) == "this machine has no GPUs"
    assert infeasible_reason(job(1, gpu_ids=()), gpus) == "the list of allowed GPUs is empty"


def test_infeasible_bad_requests() -> None:
    assert infeasible_reason(job(1, count=0), [g(0)]) is not None
    assert infeasible_reason(job(-1), [g(0)]) is not None
    assert infeasible_reason(job(None), [g(0, 1, reserve=1)]) is not None
    assert infeasible_reason(job(None), [g(0, 1, reserve=0.5)]) is None


# --- wait reasons ------------------------------------------------------------------------


def test_wait_reason_names_the_best_gpu_with_numbers() -> None:
    gpus = [g(0, used=(70,)), g(1, used=(66,))]  # 10 and 14 GiB of headroom
    assert wait_reason(job(15), gpus, 0.0) == (
        "waiting for 15.0GiB free on one GPU; best has 14.0GiB (GPU 1)"
    )
    assert wait_reason(job(15, exclusive=True), [g(0, used=(66,))], 0.0) == (
        "waiting for 15.0GiB free on one GPU, with no other job or process; GPU 0: in use by 1 job"
    )


def test_wait_reason_for_sets_whole_gpus_and_blocked_gpus() -> None:
    gpus = [g(0), g(1, used=(75,)), g(2, mode="Exclusive_Process", fprocs=1, foreign=1)]
    assert wait_reason(job(10, count=2), gpus, 0.0) == (
        "waiting for 10.0GiB free on each of 2 GPUs; only GPU 0 qualifies; "
        "next best has 5120MiB (GPU 1); GPU 2: Exclusive_Process and in use"
    )
    assert wait_reason(job(None, count=2), gpus, 0.0) == (
        "waiting for 2 idle GPUs; only GPU 0 qualifies; GPU 1: in use by 1 job; "
        "GPU 2: Exclusive_Process and in use"
    )
    held = [g(0, used=(1,), exclusive_use=True)]
    assert wait_reason(job(1), held, 0.0) == (
        "waiting for 1024MiB free on one GPU; GPU 0: held alone by job 100"
    )


# --- the CUDA context allowance ---------------------------------------------------------


def test_a_job_books_its_budget_and_its_context_and_is_capped_at_the_budget() -> None:
    gpu = replace(g(0, 24), context=512 * MiB)
    place = fits(job(10), [gpu], 0.0)
    assert place is not None and place.budget == 10 * GiB  # the allocator's cap: --mem
    (after,) = apply([gpu], job(10), place, 0.0)
    assert after.managed[0].context == 512 * MiB and after.managed[0].booked == 10.5 * GiB
    assert headroom(after, 0.0) == 13.5 * GiB
    # A second 13.5 GiB fits its budget in the room but not its context beside it.
    assert fits(job(13.5, id=2), [after], 0.0) is None
    assert fits(job(13, id=2), [after], 0.0) is not None
    assert "best has 13.0GiB (GPU 0)" in wait_reason(job(13.5, id=2), [after], 0.0)
    with pytest.raises(ValueError, match="context"):
        apply([after], job(13.5, id=2), Place(2, (0,), int(13.5 * GiB)), 0.0)


def test_whole_gpu_jobs_and_capacity_leave_room_for_the_context() -> None:
    gpu = replace(g(0, 80, reserve=0.5), context=GiB)
    place = fits(job(None), [gpu], 0.0)
    assert place is not None and place.budget == 78.5 * GiB
    assert capacity(gpu) == 78.5 * GiB
    assert infeasible_reason(job(79), [gpu]) == (
        "79.0GiB per GPU is more than this machine can give (largest: 78.5GiB = 80.0GiB "
        "total − 512MiB reserve − 1024MiB CUDA context)"
    )


def test_a_job_using_more_than_its_budget_and_context_counts_at_its_use() -> None:
    use = ManagedUse(1, 10 * GiB, context=512 * MiB, used=12 * GiB)
    assert use.booked == 12 * GiB
    assert ManagedUse(1, 10 * GiB, context=512 * MiB, used=10 * GiB).booked == 10.5 * GiB


# --- a ceiling: an OOM retry that crept into its cap ---------------------------------------


def test_a_job_with_a_ceiling_books_its_request_on_the_gpu_that_can_give_most() -> None:
    # Placement books its request; the room up to its ceiling comes at the end of the
    # pass (tests/unit/test_queue.py), so the GPU that can give most is the one to take.
    crept = replace(job(20), mem_ceiling=40 * GiB)
    gpus = [g(0, used=(50,)), g(1, used=(70,)), g(2, used=(20,))]
    place = fits(crept, gpus, 0)
    assert isinstance(place, Place) and place.gpus == (2,) and place.budget == 20 * GiB
    place = fits(crept, [g(0, used=(50,)), g(1, used=(55,))], 0)
    assert isinstance(place, Place) and place.gpus == (0,) and place.budget == 20 * GiB
    assert fits(crept, [g(0, used=(65,))], 0) is None  # 15 GiB: under its request


def test_a_job_with_a_ceiling_waits_for_it_while_jobs_on_the_gpu_may_end() -> None:
    crept = replace(job(20), mem_ceiling=40 * GiB, wait_for_ceiling=True)
    assert fits(crept, [g(0, used=(50,))], 0) is None  # 30 GiB now; 50 may free up
    ok = fits(crept, [g(0, used=(50,)), g(1, used=(30,))], 0)
    assert isinstance(ok, Place) and ok.gpus == (1,)
    # Nothing managed there that could end: it takes what there is.
    alone = fits(crept, [g(0, foreign=50, fprocs=1)], 0)
    assert isinstance(alone, Place)
    # Once its wait is over (the daemon clears the flag), what there is.
    late = fits(replace(crept, wait_for_ceiling=False), [g(0, used=(50,))], 0)
    assert isinstance(late, Place) and late.budget == 20 * GiB
