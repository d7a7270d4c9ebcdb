"""The snapshot collector: units, labels, summing without pids, series that go away with
their process, and one snapshot per cache interval."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gpuwarden.metrics.collector import SnapshotCollector
from gpuwarden.observe.snapshot import Snapshot
from tests.helpers.builders import GiB, gpu, proc, snapshot


def scrape(collector: SnapshotCollector) -> dict[str, float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    out = {}
    for line in generate_latest(reg).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def two_jobs() -> Snapshot:
    a = proc(101, 0, 2 * GiB, sm=50, env={"GPUWARDEN_JOB": "7"})
    b = proc(102, 0, 3 * GiB, sm=70, env={"GPUWARDEN_JOB": "7"})
    c = proc(103, 0, GiB, sm=None, user="bob")
    return snapshot(
        [
            (
                gpu(
                    0,
                    used=7 * GiB,
                    utilization=40,
                    temperature=50,
                    compute_mode="Exclusive_Process",
                ),
                [a, b, c],
            )
        ]
    )


def test_units_and_labels() -> None:
    m = scrape(SnapshotCollector(two_jobs))
    assert m['gpuwarden_gpu_memory_used_bytes{gpu="0"}'] == 7 * GiB
    assert m['gpuwarden_gpu_utilization_ratio{gpu="0"}'] == 0.4
    assert m['gpuwarden_gpu_compute_mode{gpu="0",mode="Exclusive_Process"}'] == 1
    assert m['gpuwarden_gpu_compute_mode{gpu="0",mode="Default"}'] == 0
    key = 'gpuwarden_process_memory_bytes{container="",gpu="0",job_id="7",pid="101",user="alice"}'
    assert m[key] == 2 * GiB
    assert (
        m[
            'gpuwarden_process_sm_utilization_ratio{container="",gpu="0",job_id="7",'
            'pid="102",user="alice"}'
        ]
        == 0.7
    )
    assert m['gpuwarden_user_memory_bytes{user="alice"}'] == 5 * GiB
    assert m['gpuwarden_gpu_users{gpu="0"}'] == 2
    assert m['gpuwarden_gpu_unaccounted_bytes{gpu="0"}'] == GiB  # 7 used - 6 listed


def test_without_pid_labels_processes_are_summed() -> None:
    m = scrape(SnapshotCollector(two_jobs, pid_labels=False))
    assert (
        m['gpuwarden_process_memory_bytes{container="",gpu="0",job_id="7",user="alice"}'] == 5 * GiB
    )
    assert not any("pid=" in k for k in m)


def test_a_process_gone_is_gone_from_the_next_scrape_and_snapshots_are_cached() -> None:
    snaps = [two_jobs(), snapshot([(gpu(0, used=GiB), [proc(103, 0, GiB, user="bob")])])]
    taken = []

    def take() -> Snapshot:
        taken.append(1)
        return snaps[min(len(taken) - 1, 1)]

    now = [0.0]
    c = SnapshotCollector(take, cache_seconds=1.0, clock=lambda: now[0])
    assert any('pid="101"' in k for k in scrape(c))
    scrape(c)
    assert len(taken) == 1  # within the cache interval: the same snapshot
    now[0] = 1.5
    assert not any('pid="101"' in k for k in scrape(c))
    assert len(taken) == 2
