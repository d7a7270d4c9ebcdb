"""The CUDA context allowance: one measurement per ended job, the median of the latest
as the allowance, the config's value over both, the default before any sample."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.sched.context import (
    DEFAULT_CONTEXT,
    SAMPLE_RANGE,
    SAMPLES_KEPT,
    allowance,
    sample,
)

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
