"""Placement and select share one preference after topology: GPUs without other users'
processes first, then fewest other users, before memory. On the same state the daemon's
placement and ``select`` pick the same GPUs (examples/a100x8-shared.json: GPUs 0 and 1
carry another user's inference servers while 4, 5 and 7 are idle). For placement, other
users' batch jobs are not kept apart from a batch job (they are capped: packing them is
the point); their services are, and a service keeps away from every other user's work."""

from __future__ import annotations

from gpuwarden.gpus.sim import SimBackend
from gpuwarden.observe.snapshot import take_snapshot
from gpuwarden.sched.headroom import DEFAULT_RESERVE, gpu_states
from gpuwarden.sched.model import GpuState, ManagedUse, QueuedJob
from gpuwarden.sched.placement import fits
from gpuwarden.sched.select import Choice, Request, choose_gpus
from tests.helpers.builders import GiB, gpu, proc, snapshot
from tests.helpers.paths import EXAMPLES


def _place(snap: object, job: QueuedJob) -> tuple[int, ...]:
    place = fits(job, gpu_states(snap, {}, set(), reserve=DEFAULT_RESERVE))  # type: ignore[arg-type]
    assert place is not None
    return place.gpus


def test_placement_prefers_a_gpu_without_other_users_over_a_tighter_fit() -> None:
    snap = snapshot(
        [(gpu(0, used=30 * GiB), [proc(10, 0, 30 * GiB, user="inference")]), (gpu(1), [])]
    )
    assert _place(snap, QueuedJob(id=1, user="alice", mem=10 * GiB)) == (1,)


def test_the_jobs_own_users_processes_are_no_other_users() -> None:
    snap = snapshot([(gpu(0, used=30 * GiB), [proc(10, 0, 30 * GiB, user="alice")]), (gpu(1), [])])
    assert _place(snap, QueuedJob(id=1, user="alice", mem=10 * GiB)) == (0,)  # best fit


def test_then_fewest_other_users() -> None:
    snap = snapshot(
        [
            (gpu(0, used=2 * GiB), [proc(10, 0, GiB, user="bob"), proc(11, 0, GiB, user="carol")]),
            (gpu(1, used=GiB), [proc(12, 1, GiB, user="bob")]),
        ]
    )
    assert _place(snap, QueuedJob(id=1, user="alice", mem=10 * GiB)) == (1,)
    got = choose_gpus(snap.gpus, Request(memory=10 * GiB, user="alice"))
    assert isinstance(got, Choice) and got.indices == (1,)


def test_select_prefers_a_gpu_without_other_users_over_more_free_memory() -> None:
    snap = snapshot(
        [(gpu(0, used=GiB), [proc(10, 0, GiB, user="inference")]), (gpu(1, used=10 * GiB), [])]
    )
    got = choose_gpus(snap.gpus, Request(memory=10 * GiB, user="alice"))
    assert isinstance(got, Choice) and got.indices == (1,)
    mine = snapshot(
        [(gpu(0, used=GiB), [proc(10, 0, GiB, user="alice")]), (gpu(1, used=10 * GiB), [])]
    )
    got = choose_gpus(mine.gpus, Request(memory=10 * GiB, user="alice"))
    assert isinstance(got, Choice) and got.indices == (0,)  # the most free, as before


def test_placement_and_select_agree_on_the_shared_a100_machine() -> None:
    snap = take_snapshot(
        SimBackend.from_file(str(EXAMPLES / "a100x8-shared.json")),
        holders=False,
        detail=False,
        now=1000.0,
    )
    got = choose_gpus(snap.gpus, Request(memory=40 * GiB, count=2, user="alice"))
    assert isinstance(got, Choice) and got.indices == (4, 5)
    assert _place(snap, QueuedJob(id=1, user="alice", mem=40 * GiB, count=2)) == (4, 5)
    # One GPU: both keep off the GPUs with other users' processes (0, 1, 2, 6); among
    # the rest placement packs (best fit) and select takes the most free memory.
    one = choose_gpus(snap.gpus, Request(memory=40 * GiB, user="alice"))
    assert isinstance(one, Choice) and one.indices[0] in (3, 4, 5, 7)
    assert _place(snap, QueuedJob(id=2, user="alice", mem=40 * GiB))[0] in (3, 4, 5, 7)


def _running(user: str, *, service: bool) -> list[GpuState]:
    """GPU 0 runs one 30 GiB job of ``user`` (a service or not); GPU 1 is empty."""
    use = ManagedUse(job_id=5, budget=30 * GiB, user=user, service=service)
    return [
        GpuState(index=0, uuid="GPU-0", total=80 * GiB, managed=(use,)),
        GpuState(index=1, uuid="GPU-1", total=80 * GiB),
    ]


def test_a_batch_job_packs_beside_another_users_batch_job() -> None:
    place = fits(QueuedJob(id=1, user="alice", mem=10 * GiB), _running("bob", service=False))
    assert place is not None and place.gpus == (0,)  # best fit


def test_a_batch_job_keeps_away_from_another_users_service() -> None:
    place = fits(QueuedJob(id=1, user="alice", mem=10 * GiB), _running("bob", service=True))
    assert place is not None and place.gpus == (1,)


def test_a_service_keeps_away_from_another_users_batch_job_but_not_its_own() -> None:
    server = QueuedJob(id=1, user="alice", mem=10 * GiB, service=True)
    place = fits(server, _running("bob", service=False))
    assert place is not None and place.gpus == (1,)
    place = fits(server, _running("alice", service=False))
    assert place is not None and place.gpus == (0,)
