"""Decisions from a job's history: learned budgets (``--mem auto``), learned run times
(backfill's estimates) and the failure streak that holds a group instead of burning
through it. Pure: the daemon reads the history from its store and carries out what these
return."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.units import MiB, format_bytes, format_duration

MARGIN = 1.2  # a learned budget is the highest earlier peak plus this much
ROUND = 256 * MiB
RUNS = 5  # the most recent successful runs a learned budget looks at
STREAK = 3  # this many failures in a row, the same way, hold the group


def learned_budget(peaks: Sequence[int]) -> tuple[int | None, str]:
    """The budget for ``--mem auto`` from the peaks of earlier successful runs (newest
    first), and how it was found. None: no history, the job gets a whole GPU."""
    seen = [p for p in peaks[:RUNS] if p and p > 0]
    if not seen:
        return None, "no earlier successful run with a recorded peak: a whole GPU"
    top = max(seen)
    budget = -(-int(top * MARGIN) // ROUND) * ROUND
    return budget, (
        f"{format_bytes(budget)} = {MARGIN:g} × the highest peak "
        f"{format_bytes(top)} of {len(seen)} earlier run(s)"
    )


def learned_runtime(durations: Sequence[float]) -> tuple[float | None, str | None]:
    """How long a job is expected to run, from the run times of earlier successful runs
    of its key or name (newest first), and how it was found. The longest of the recent
    runs: an estimate that is too short lets backfill delay the first waiting job, one
    too long only starts fewer jobs early. None: no history."""
    seen = [d for d in durations[:RUNS] if d is not None and d > 0]
    if not seen:
        return None, None
    top = max(seen)
    return top, (f"{format_duration(top)}, the longest of {len(seen)} earlier successful run(s)")


def failure_signature(
    state: str, exit_code: int | None, reason: str | None, oom: bool
) -> str | None:
    """How a job ended, coarse enough that two runs failing alike compare equal; None
    for an end that is not a failure."""
    if state != "failed":
        return None
    if oom:
        return "CUDA out of memory"
    if exit_code is not None:
        return f"exit code {exit_code}"
    return reason or "failed"


def failing_streak(signatures: Sequence[str | None]) -> str | None:
    """The failure that the last ``STREAK`` ended jobs (newest first) share, if they do."""
    last = list(signatures[:STREAK])
    if len(last) < STREAK or last[0] is None or any(s != last[0] for s in last):
        return None
    return last[0]


def declared_vs_actual(declared: int | None, peak: int | None) -> str | None:
    """One phrase comparing the declared memory with the peak (``show``, ``wait``)."""
    if declared is None or peak is None or declared <= 0:
        return None
    diff = declared - peak
    pct = abs(diff) * 100 / declared
    if pct < 1:
        return f"peak {format_bytes(peak)}: as declared"
    if diff >= 0:
        return (
            f"peak {format_bytes(peak)} of {format_bytes(declared)} declared: "
            f"over-declared by {format_bytes(diff)} ({pct:.0f}%)"
        )
    return (
        f"peak {format_bytes(peak)} of {format_bytes(declared)} declared: "
        f"under-declared by {format_bytes(-diff)} ({pct:.0f}%)"
    )
