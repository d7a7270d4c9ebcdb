"""What a doctor rule reads and what it returns: the finding, its severities and the
rule's one input. Apart from the rules so that both groups of them (doctor_gpus.py,
doctor_procs.py) and the registry that runs them (doctor.py) share one vocabulary."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from gpuwarden.mps.state import MpsState
from gpuwarden.observe.leaks import Leak
from gpuwarden.observe.snapshot import Snapshot

CRITICAL, WARNING, INFO = "critical", "warning", "info"
SEVERITIES = (CRITICAL, WARNING, INFO)  # most urgent first: the sort order


@dataclass(frozen=True)
class Finding:
    """One problem: what rule saw it, how bad, where, why we think so, how to fix it."""

    rule: str
    severity: str
    gpu: int | None
    pid: int | None
    evidence: str
    remedy: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Inputs:
    """What every rule reads; one argument so rules share one signature."""

    snapshot: Snapshot
    leaks: tuple[Leak, ...]
    mps: MpsState | None


Rule = Callable[[Inputs], Iterable[Finding]]


def percent(part: int, whole: int) -> str:
    """``part`` as a share of ``whole`` for evidence text; "n/a" when there is no whole."""
    return f"{100 * part / whole:.1f}%" if whole > 0 else "n/a"
