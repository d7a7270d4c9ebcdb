"""The daemon's GPU states: what each job's claim tells the policies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpuwarden.daemon.config import Config
from gpuwarden.daemon.gpu_states import GpuStates
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import Job, JobSpec
from gpuwarden.jobs.services import Service
from tests.helpers.builders import GiB, gpu, snapshot


def test_a_running_service_is_booked_as_a_service(tmp_path: Path) -> None:
    """Placement keeps other users' batch jobs away from a service only if the daemon's
    GPU states say which claims are services (sched/placement.gpu_users)."""
    with Store(tmp_path / "state.db") as store:
        states = GpuStates(store, Config(), tmp_path / "jobs", lambda: 1000.0, lambda j: None)
        spec = JobSpec(command=("x",), user="a", uid=1, gid=1, mem=GiB)

        def running(job_id: int, spec: JobSpec) -> Job:
            return Job(
                id=job_id,
                spec=spec,
                state="running",
                submitted_at=0.0,
                gpus=(0,),
                gpu_uuids=("GPU-0",),
                budget=GiB,
            )

        jobs = [running(1, spec), running(2, replace(spec, service=Service(restart="always")))]
        [gpu0] = states.update(snapshot([(gpu(0), [])]), jobs, set(), {}, [], {})
        assert {u.job_id: u.service for u in gpu0.managed} == {1: False, 2: True}
