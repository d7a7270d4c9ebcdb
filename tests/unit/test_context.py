"""The CUDA context allowance: one measurement per ended job, the median of the latest
as the allowance, the config's value over both, the default before any sample; and the
ceiling the watchdog allows for contexts that differ by the kernels a job loads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.daemon.config import Config
from gpuwarden.daemon.gpu_states import GpuStates
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import Job, JobSpec
from gpuwarden.sched.context import (
    DEFAULT_CONTEXT,
    MAX_SPREAD,
    SAMPLE_RANGE,
    SAMPLES_KEPT,
    allowance,
    ceiling,
    sample,
)
from tests.helpers.builders import gpu, snapshot

MiB = 1 << 20
GiB = 1 << 30


def test_a_sample_is_the_drivers_peak_less_the_allocators() -> None:
    assert sample(10 * GiB + 676 * MiB, 10 * GiB) == 676 * MiB
    assert sample(None, 10 * GiB) is None and sample(10 * GiB, None) is None
    # Implausible: a peak the sampling missed, or a report that lies.
    assert sample(10 * GiB, 10 * GiB) is None
    assert sample(10 * GiB, 11 * GiB) is None
    assert sample(40 * GiB, 0) is None
    assert sample(GiB, -5) is None


def test_the_allowance_is_configured_else_measured_else_the_default() -> None:
    assert allowance([]) == DEFAULT_CONTEXT
    assert allowance([600 * MiB]) == 600 * MiB
    assert allowance([600 * MiB], configured=900 * MiB) == 900 * MiB
    assert allowance([600 * MiB, 3000 * MiB, 610 * MiB]) == 610 * MiB  # one odd job
    assert allowance([600 * MiB + 1]) == 601 * MiB  # rounded up to a MiB


@given(st.lists(st.integers(*SAMPLE_RANGE), min_size=1, max_size=40))
def test_the_allowance_is_within_the_latest_samples(samples: list[int]) -> None:
    latest = samples[-SAMPLES_KEPT:]
    value = allowance(samples)
    assert min(latest) <= value <= max(latest) + MiB
    assert value % MiB == 0


def test_the_ceiling_is_the_upper_quartile_within_a_spread_of_the_allowance() -> None:
    assert ceiling([]) == DEFAULT_CONTEXT
    assert ceiling([600 * MiB], configured=900 * MiB) == 900 * MiB  # the admin's, whole
    # Seen on an H100: 518 MiB right after CUDA starts, 610 once a fill kernel loaded.
    assert allowance([518 * MiB, 610 * MiB]) == 564 * MiB
    assert ceiling([518 * MiB, 610 * MiB]) == 610 * MiB
    assert ceiling([500 * MiB, 600 * MiB, 700 * MiB, 800 * MiB]) == 700 * MiB
    assert ceiling([600 * MiB] * 14 + [3000 * MiB]) == 600 * MiB  # one odd job
    # Jobs that report false peaks widen the tolerance by MAX_SPREAD at most.
    lying = [500 * MiB] * 8 + [4000 * MiB] * 7
    assert ceiling(lying) == allowance(lying) + MAX_SPREAD == 756 * MiB


@given(st.lists(st.integers(*SAMPLE_RANGE), min_size=1, max_size=40))
def test_the_ceiling_is_between_the_allowance_and_its_spread(samples: list[int]) -> None:
    base, top = allowance(samples), ceiling(samples)
    assert base <= top <= base + MAX_SPREAD
    assert top <= max(samples[-SAMPLES_KEPT:]) + MiB
    assert top % MiB == 0


def test_the_watchdog_allows_a_job_the_contexts_measured_on_its_gpu_model(tmp_path: Path) -> None:
    """A running job is judged against the larger of the context booked for it and
    the ceiling of its GPU model's samples (real SQLite keeps them)."""
    with Store(tmp_path / "state.db") as store:
        states = GpuStates(store, Config(), tmp_path / "jobs", lambda: 1000.0, lambda j: None)
        snap = snapshot([(gpu(0), [])])
        job = Job(
            id=1,
            spec=JobSpec(command=("x",), user="a", uid=1, gid=1),
            state="running",
            submitted_at=0.0,
            gpus=(0,),
            gpu_uuids=("GPU-0",),
            budget=10 * (1 << 30),
            context=564 * MiB,
        )
        states.contexts(snap)  # learns GPU-0's model
        assert states.context_ceiling(job) == DEFAULT_CONTEXT  # nothing measured yet
        for at, value in ((1.0, 518), (2.0, 610), (3.0, 676)):
            store.add_context_sample("Test GPU", "1", value * MiB, at)
        states._context_samples = None  # as measure_context leaves it
        assert states.context_ceiling(job) == 676 * MiB
        assert states.context_ceiling(replace(job, context=800 * MiB)) == 800 * MiB
