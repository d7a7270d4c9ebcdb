"""What a job used over all its attempts: the store keeps an attempt's GPU-seconds and
memory-seconds when a requeue, an OOM retry, a restart or ``retry`` clears its fields,
and ``report`` counts them beside the last attempt's."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.daemon.accounting import usage_row
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import FAILED, QUEUED, RESERVED, RUNNING, SUCCEEDED, JobSpec

GiB = 1 << 30


def test_every_attempt_counts_in_the_report(tmp_path: Path) -> None:
    with Store(tmp_path / "jobs.db") as store:
        job, _ = store.submit(JobSpec(command=("x",), user="a", uid=1, gid=1, gpus=2), 0.0)

        def run(start: float) -> None:
            store.transition(
                job.id, QUEUED, RESERVED, now=start, kind="placed", gpus=(0, 1), budget=2 * GiB
            )
            store.transition(
                job.id,
                RESERVED,
                RUNNING,
                now=start,
                kind="started",
                started_at=start,
                peak_memory=GiB,
            )

        run(100.0)  # 300 s on 2 GPUs, then an OOM retry queues it again
        store.transition(
            job.id,
            RUNNING,
            QUEUED,
            now=400.0,
            kind="retried",
            started_at=None,
            gpus=(),
            budget=None,
        )
        e = store.get(job.id).earlier
        assert (e.gpu_seconds, e.reserved, e.used) == (600.0, 600.0 * 2 * GiB, 600.0 * GiB)
        run(500.0)  # 100 s, fails; `retry` later counts it to its end, not to the retry
        store.transition(job.id, RUNNING, FAILED, now=600.0, kind="failed", ended_at=600.0)
        store.transition(
            job.id,
            FAILED,
            QUEUED,
            now=5000.0,
            kind="retried",
            started_at=None,
            ended_at=None,
            gpus=(),
            budget=None,
        )
        assert store.get(job.id).earlier.gpu_seconds == 800.0
        run(6000.0)  # the last attempt: 50 s
        done = store.transition(
            job.id, RUNNING, SUCCEEDED, now=6050.0, kind="succeeded", ended_at=6050.0
        )
        row = usage_row(done)
        assert row["gpu_hours"] == pytest.approx((800 + 100) / 3600)
        assert row["reserved_gib_hours"] == pytest.approx(900 * 2 / 3600)
        assert row["used_gib_hours"] == pytest.approx(900 / 3600)
    with Store(tmp_path / "jobs.db") as again:  # from the disk
        assert again.get(job.id).earlier.gpu_seconds == 800.0
