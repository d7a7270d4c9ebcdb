"""Memory history: samples from a snapshot, stored and pruned in real SQLite, shaped into
stacked chart series (downsampled keeping each bucket's peak), leak periods, and a job's
timeline."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.daemon.history import (
    GpuSample,
    job_timeline,
    leak_periods,
    sample_gpus,
    series,
)
from gpuwarden.daemon.store import Store
from gpuwarden.gpus.sim import SimBackend
from gpuwarden.observe.snapshot import DEAD, GARBAGE, take_snapshot
from gpuwarden.units import GiB, MiB

ROOT = Path(__file__).resolve().parents[2]


def test_a_snapshot_becomes_one_sample_per_gpu_split_by_job_and_user() -> None:
    backend = SimBackend.from_file(str(ROOT / "examples" / "leaky-4gpu.json"))
    snap = take_snapshot(backend, holders=False, detail=False, now=1000.0)
    gpu3 = next(v for v in snap.gpus if v.facts.index == 3)
    managed = {gpu3.processes[0].pid}  # pretend the daemon runs the first process on GPU 3
    job_use = {7: {gpu3.facts.uuid: gpu3.processes[0].memory or 0}}
    samples = sample_gpus(snap, job_use, managed, now=1000.7)
    assert [s.index for s in samples] == [v.facts.index for v in snap.gpus]
    assert {s.ts for s in samples} == {1000}
    by_index = {s.index: s for s in samples}
    gpu1 = next(v for v in snap.gpus if v.facts.index == 1)
    garbage = [p for p in gpu1.processes if p.state == GARBAGE]
    assert garbage and gpu1.unaccounted == 300 * MiB
    # leaked: memory no process accounts for, and what a garbage pid holds
    assert by_index[1].leaked == 300 * MiB + sum(p.memory or 0 for p in garbage)
    assert all(p.user not in by_index[1].users for p in garbage if p.user)
    gpu0 = next(v for v in snap.gpus if v.facts.index == 0)
    dead = next(p for p in gpu0.processes if p.state == DEAD)
    assert by_index[0].leaked == dead.memory and by_index[0].users == {}
    # the same dead pid left behind by an ended job stays that job's
    (again,) = [s for s in sample_gpus(snap, {}, {dead.pid}, 1000.0, {dead.pid: 9}) if s.index == 0]
    assert again.jobs == {9: dead.memory} and again.leaked == 0
    s3 = by_index[3]
    assert s3.jobs == {7: gpu3.processes[0].memory}
    others = [p for p in gpu3.processes[1:] if p.memory]
    assert sum(s3.users.values()) == sum(p.memory or 0 for p in others)
    assert s3.used == gpu3.facts.memory_used and s3.total == gpu3.facts.memory_total


def test_samples_are_stored_read_back_by_job_and_pruned(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        for ts in range(0, 100, 10):
            store.record_samples(
                [
                    GpuSample(ts, "GPU-a", 0, 80 * GiB, 10 * GiB, 0, {1: 4 * GiB}, {"bob": GiB}),
                    GpuSample(
                        ts,
                        "GPU-b",
                        1,
                        80 * GiB,
                        2 * GiB,
                        512 * MiB,
                        {12: GiB} if ts > 50 else {},
                        {},
                    ),
                ],
                keep=1000,
                now=ts,
            )
        got = store.samples(0)
        assert len(got) == 20 and got[0] == GpuSample(
            0, "GPU-a", 0, 80 * GiB, 10 * GiB, 0, {1: 4 * GiB}, {"bob": GiB}
        )
        assert [s.ts for s in store.samples(0, job_id=12)] == [60, 70, 80, 90]
        assert [s.ts for s in store.samples(0, job_id=1)][-1] == 90
        assert store.samples(0, job_id=2) == []  # job 12 is not job 1 or 2
        assert {s.ts for s in store.samples(35, 55)} == {40, 50}
        store.record_samples([], keep=30, now=100)  # drops what is older than 70
        assert min(s.ts for s in store.samples(0)) == 70
    finally:
        store.close()


def test_series_stack_jobs_and_users_and_fold_jobs_into_owners() -> None:
    rows = [
        GpuSample(
            t,
            "GPU-a",
            0,
            24 * GiB,
            9 * GiB,
            0,
            {1: 4 * GiB, 2: 2 * GiB} if t < 30 else {2: 2 * GiB},
            {"bob": GiB},
        )
        for t in range(0, 60, 10)
    ]
    owners = {1: "alice", 2: "alice"}
    (by_job,) = series(rows, owners)
    assert by_job.t == [0, 10, 20, 30, 40, 50]
    assert by_job.layers["job 1 (alice)"] == [4 * GiB] * 3 + [0] * 3
    assert by_job.layers["job 2 (alice)"] == [2 * GiB] * 6
    assert by_job.layers["user bob"] == [GiB] * 6
    (by_user,) = series(rows, owners, by="user")
    assert by_user.layers == {"user alice": [6 * GiB] * 3 + [2 * GiB] * 3, "user bob": [GiB] * 6}


def test_downsampling_keeps_each_buckets_peak() -> None:
    rows = [
        GpuSample(t, "GPU-a", 0, 24 * GiB, GiB, 0, {5: (20 * GiB if t == 503 else GiB)}, {})
        for t in range(1000)
    ]
    (s,) = series(rows, {}, points=100)
    assert len(s.t) == 100 and max(s.layers["job 5"]) == 20 * GiB  # a 1 s spike survives
    assert s.t[-1] == 999


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5000),
            st.dictionaries(st.integers(1, 4), st.integers(0, 10**10), max_size=3),
        ),
        min_size=1,
        max_size=200,
    ),
    st.integers(1, 50),
)
def test_series_never_exceed_points_and_never_lose_a_peak(
    raw: list[tuple[int, dict[int, int]]], points: int
) -> None:
    rows = [GpuSample(t, "GPU-a", 0, 10**11, 0, 0, jobs, {}) for t, jobs in raw]
    (s,) = series(rows, {}, points=points)
    assert len(s.t) <= points and s.t == sorted(s.t)
    for jid in {j for _, jobs in raw for j in jobs}:
        assert max(s.layers[f"job {jid}"]) == max(jobs.get(jid, 0) for _, jobs in raw)


def test_leak_periods_and_a_jobs_timeline() -> None:
    t = [0, 10, 20, 30, 40, 50]
    leaked = [0, 300 * MiB, 300 * MiB, 0, 0, 100 * MiB]
    assert leak_periods(t, leaked) == [(10, 30), (50, 50)]
    assert leak_periods(t, leaked, threshold=200 * MiB) == [(10, 30)]
    rows = [
        GpuSample(10, "GPU-a", 0, 1, 1, 0, {3: 2 * GiB}, {}),
        GpuSample(10, "GPU-b", 1, 1, 1, 0, {3: 5 * GiB}, {}),
        GpuSample(20, "GPU-a", 0, 1, 1, 0, {3: 3 * GiB}, {}),
        GpuSample(20, "GPU-b", 1, 1, 1, 0, {}, {}),
    ]
    assert job_timeline(rows, 3) == {"t": [10, 20], "used": [5 * GiB, 3 * GiB]}
