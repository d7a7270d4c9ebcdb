"""Fair share: a user's usage is memory x time, each moment fading by half every
half-life (exactly: the integral, not steps), and at equal priority and QoS the jobs of
the user who used less go first; priority and QoS still come before it."""

from __future__ import annotations

import math

import pytest

from gpuwarden.jobs.request import GUARANTEED
from gpuwarden.sched.fairshare import Span, decayed, horizon, usage
from gpuwarden.sched.model import QueuedJob
from gpuwarden.sched.queue import order

GiB = 1 << 30
H = 7 * 86400.0
NOW = 1_000_000_000.0


def test_a_use_fades_by_half_every_halflife() -> None:
    hour = Span("a", 10 * GiB, NOW - 3600, NOW)
    fresh = decayed(hour, NOW, H)
    # An hour against a week's half-life: almost the plain 10 GiB x 1 h...
    assert fresh == pytest.approx(10 * GiB * 3600, rel=3e-3) and fresh < 10 * GiB * 3600
    # ...and exactly the integral of 2^-(age/H).
    rate = math.log(2) / H
    assert fresh == pytest.approx(10 * GiB / rate * (1 - math.exp(-rate * 3600)), rel=1e-12)
    old = Span("a", 10 * GiB, NOW - H - 3600, NOW - H)
    assert decayed(old, NOW, H) == pytest.approx(fresh / 2, rel=1e-12)
    assert decayed(Span("a", GiB, NOW - 60), NOW, H) == pytest.approx(GiB * 60, rel=1e-4)
    assert decayed(Span("a", GiB, NOW + 5, NOW + 10), NOW, H) == 0.0  # not yet
    assert decayed(hour, NOW, 0.0) == 0.0  # off
    assert horizon(H) == 20 * H


def test_usage_sums_each_users_spans() -> None:
    got = usage(
        [
            Span("a", GiB, NOW - 100, NOW),
            Span("a", GiB, NOW - 50),
            Span("b", 2 * GiB, NOW - 10, NOW),
            Span("c", 0, NOW - 10, NOW),
        ],
        NOW,
        H,
    )
    assert set(got) == {"a", "b"}
    assert got["a"] == pytest.approx(150 * GiB, rel=1e-4)
    assert got["b"] == pytest.approx(20 * GiB, rel=1e-4)


def test_less_usage_goes_first_at_equal_priority_and_qos_only() -> None:
    heavy = QueuedJob(id=1, user="a", mem=GiB, submitted_at=1.0, fair_usage=5e12)
    light = QueuedJob(id=2, user="b", mem=GiB, submitted_at=2.0, fair_usage=1e9)
    assert [j.id for j in order([heavy, light])] == [2, 1]
    off = [
        QueuedJob(id=1, user="a", mem=GiB, submitted_at=1.0),
        QueuedJob(id=2, user="b", mem=GiB, submitted_at=2.0),
    ]
    assert [j.id for j in order(off)] == [1, 2]  # off: submission order
    urgent = QueuedJob(id=1, user="a", mem=GiB, submitted_at=1.0, fair_usage=5e12, priority=1)
    assert [j.id for j in order([urgent, light])] == [1, 2]
    classy = QueuedJob(id=1, user="a", mem=GiB, submitted_at=1.0, fair_usage=5e12, qos=GUARANTEED)
    assert [j.id for j in order([classy, light])] == [1, 2]
