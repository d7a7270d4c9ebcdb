"""A queued attached job waits for its launcher: the API stores the job and then, in
another thread, names the launcher in the job directory. The scheduling pass must never
take a launcher being named at that moment for one that went away (a resubmitted Ray
job was cancelled so, its launcher alive)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.daemon import attached
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.mps_jobs import MpsPool
from gpuwarden.daemon.placing import CLAIM_WAIT, Placer
from gpuwarden.daemon.store import Store
from gpuwarden.jobs import model
from gpuwarden.jobs.jobdir import SupervisorHandle, job_dir, write_claim
from gpuwarden.jobs.model import Job, JobSpec
from gpuwarden.procs.identity import boot_id, start_ticks

NOW = 1_000_000.0
World = tuple[Placer, Store, Job, list[float]]


def _no_cancel(job: Job) -> None:
    raise AssertionError(f"job {job.id} is queued: nothing runs to cancel")


def _placer(tmp_path: Path, store: Store, clock: list[float]) -> Placer:
    return Placer(
        store,
        Config(),
        tmp_path / "jobs",
        boot_id(),
        lambda: clock[0],
        None,
        MpsPool(tmp_path / "mps"),
        lambda gpus: 0,
        lambda job: 0,
        _no_cancel,
    )


def _claim(placer: Placer, job: Job, pid: int) -> None:
    import psutil

    d = job_dir(placer.jobs_dir, job)
    d.mkdir(parents=True, exist_ok=True)
    write_claim(
        d,
        job.id,
        SupervisorHandle(
            pid=pid,
            start_time=psutil.Process(pid).create_time(),
            boot_id=boot_id(),
            start_ticks=start_ticks(pid),
        ),
        "attached",
    )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    store = Store(tmp_path / "state.db")
    job, _ = store.submit(
        JobSpec(command=("true",), user="ann", uid=50001, gid=50001, attach="ray job x"), NOW
    )
    clock = [NOW + 1]
    yield _placer(tmp_path, store, clock), store, job, clock
    store.close()


def test_a_launcher_not_yet_named_is_waited_for_then_given_up(world: World) -> None:
    placer, store, job, clock = world
    assert placer.waiting_launcher(job) is None
    assert store.get(job.id).state == model.QUEUED
    clock[0] = NOW + CLAIM_WAIT + 1
    assert placer.waiting_launcher(job) is None
    assert store.get(job.id).state == model.CANCELLED


def test_a_named_launcher_that_runs_is_the_jobs(world: World) -> None:
    placer, store, job, _ = world
    _claim(placer, job, os.getpid())
    handle = placer.waiting_launcher(job)
    assert handle is not None and handle.pid == os.getpid()
    assert store.get(job.id).state == model.QUEUED


def test_a_named_launcher_that_ended_cancels_the_job(world: World) -> None:
    placer, store, job, _ = world
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    _claim(placer, job, p.pid)
    p.wait()
    assert placer.waiting_launcher(job) is None
    got = store.get(job.id)
    assert got.state == model.CANCELLED and "went away" in (got.reason or "")


def test_a_launcher_named_while_the_pass_reads_is_not_taken_for_gone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read misses the claim, which the API writes just after: the pass must not
    then find the file and cancel the job."""
    placer, store, job, _ = world
    read = attached.live_launcher

    def read_then_named(jobdir: Path) -> SupervisorHandle | None:
        found = read(jobdir)
        _claim(placer, job, os.getpid())
        return found

    monkeypatch.setattr(attached, "live_launcher", read_then_named)
    assert placer.waiting_launcher(job) is None
    assert store.get(job.id).state == model.QUEUED
    monkeypatch.setattr(attached, "live_launcher", read)
    assert placer.waiting_launcher(job) is not None
