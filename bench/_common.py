"""Helpers shared by the benchmark scripts: timing statistics and machine facts.

Not part of gpuwarden; the scripts put ``bench/`` on ``sys.path`` by being run from it."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation): a value that was actually measured."""
    s = sorted(samples)
    if not s:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(s)))
    return s[min(rank, len(s)) - 1]


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """median / p95 / min / max of seconds, plus the raw samples (rounded to 1 µs)."""
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "p95": percentile(samples, 95),
        "min": min(samples),
        "max": max(samples),
        "samples": [round(x, 6) for x in samples],
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def mem_available() -> int | None:
    """MemAvailable in bytes, from /proc/meminfo."""
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def machine() -> dict[str, Any]:
    """Facts that make two result files comparable (or not)."""
    psmisc = subprocess.run(
        ["/usr/bin/fuser", "--version"], capture_output=True, text=True, check=False
    )
    fuser_version = (psmisc.stdout + psmisc.stderr).splitlines()[0:1]
    mem = _read("/proc/meminfo") or ""
    total = next(
        (int(x.split()[1]) * 1024 for x in mem.splitlines() if x.startswith("MemTotal:")), None
    )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "mem_total": total,
        "fuser": fuser_version[0] if fuser_version else "unknown",
        "loadavg": _read("/proc/loadavg"),
    }


SET_C = [
    (70, 12),
    (10, 45),
    (40, 18),
    (20, 10),
    (60, 10),
    (15, 35),
    (30, 18),
    (10, 20),
    (50, 10),
    (25, 20),
    (35, 12),
    (10, 25),
    (45, 12),
    (12, 40),
]
"""Set c of the real-job benchmark (bench_peers.py) as (GiB, seconds), in the order it
is submitted: the trace replay models it too (bench_trace.py)."""
