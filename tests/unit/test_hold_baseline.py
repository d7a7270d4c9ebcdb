"""A hold's baseline (the memory no process accounted for while the attempt ran): its
memory is verified back once that figure did not grow, so a baseline taken from one
moment's skewed sample kept holds open on the H200 (5 s once, for good another time)."""

from __future__ import annotations

from gpuwarden.daemon.reconcile import UNACCOUNTED_PERSIST, foreign_figure, hold_baseline

MiB = 1 << 20
NOW = 1000.0


def test_no_sample_is_no_baseline() -> None:
    assert hold_baseline([], NOW) is None


def test_a_negative_sample_counts_as_zero() -> None:
    # NVML's device figure and its process list are read apart: their difference can
    # dip below zero for a moment. A steady 28 MiB afterwards is no growth.
    assert hold_baseline([(NOW - 1, 28 * MiB), (NOW - 0.5, -237 * MiB)], NOW) == 0


def test_a_moment_of_memory_in_flight_does_not_raise_it() -> None:
    # A process starting beside it shows as unaccounted for a moment (49 GB once):
    # the least of the recent samples is the baseline, not the last.
    seen = [(NOW - 2, 30 * MiB), (NOW - 1, 49_000 * MiB), (NOW - 0.2, 31 * MiB)]
    assert hold_baseline(seen, NOW) == 30 * MiB


def test_old_samples_do_not_count_but_the_latest_stands_in() -> None:
    old = NOW - UNACCOUNTED_PERSIST - 1
    assert (
        hold_baseline([(old - 1, 5 * MiB), (old, 40 * MiB), (NOW - 0.1, 60 * MiB)], NOW) == 60 * MiB
    )
    assert hold_baseline([(old - 1, 5 * MiB), (old, 40 * MiB)], NOW) == 40 * MiB


def test_the_foreign_figure_charges_what_persisted_and_never_less_than_zero() -> None:
    procs = [(NOW - 100, 2_000 * MiB), (NOW - 1, 500 * MiB)]
    # A skewed sample of -237 MiB must not lower the foreign processes' charge: before
    # the one rule, headroom grew by 237 MiB for that pass.
    assert foreign_figure(procs, [(NOW - 0.5, -237 * MiB), (NOW, 28 * MiB)], NOW) == 2_000 * MiB
    # A job starting shows 49 GB unaccounted for one pass: not charged; 30 MiB is.
    seen = [(NOW - 2, 30 * MiB), (NOW - 1, 49_000 * MiB), (NOW, 31 * MiB)]
    assert foreign_figure(procs, seen, NOW) == 2_030 * MiB
    assert foreign_figure([], [], NOW) == 0
