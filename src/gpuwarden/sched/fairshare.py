"""Fair share (config ``fairshare_halflife``): among waiting jobs of equal priority and QoS
class, those of users who used less of the GPUs lately go first, as Slurm's fair-share
factor orders them. A user's usage is the memory their jobs reserved times the time they
held it (bytes x GPUs x seconds), each moment's use weighing half as much for every
half-life since. Pure: spans in, usage out."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """Memory a job held: ``nbytes`` over all its GPUs from ``start`` to ``end`` (None:
    it still holds it)."""

    user: str
    nbytes: int
    start: float
    end: float | None = None


def decayed(span: Span, now: float, halflife: float) -> float:
    """The span's byte-seconds, each second weighed 2^-(age / halflife): the integral of
    nbytes x 2^-((now - t) / halflife) over the span, so usage fades smoothly, not in
    steps."""
    end = now if span.end is None else min(span.end, now)
    start = min(span.start, end)
    if halflife <= 0 or span.nbytes <= 0 or end <= start:
        return 0.0
    rate = math.log(2) / halflife
    return span.nbytes / rate * (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start)))


def usage(spans: Iterable[Span], now: float, halflife: float) -> dict[str, float]:
    """Each user's decayed usage in byte-seconds (users with none are absent)."""
    out: dict[str, float] = {}
    for s in spans:
        used = decayed(s, now, halflife)
        if used > 0:
            out[s.user] = out.get(s.user, 0.0) + used
    return out


def horizon(halflife: float) -> float:
    """Seconds back past which use weighs less than 2^-20 (one millionth): older spans
    need not be read."""
    return 20 * halflife
