"""Doctor: the troubleshooting table turned into rules. Each rule is a pure function of a
Snapshot (plus the leaks found over several of them and the MPS daemons), and each
finding is a value that carries its evidence and the exact command that fixes it. This
module is the registry that runs the rules and the ``doctor --json`` document; the
rules are in doctor_gpus.py (the GPUs' modes, sharing and health) and doctor_procs.py
(the processes on them), the finding and its severities in doctor_findings.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuwarden.mps.state import MpsState, read_mps_state
from gpuwarden.observe.doctor_findings import SEVERITIES, Finding, Inputs, Rule
from gpuwarden.observe.doctor_gpus import (
    ecc_errors,
    mig_instances,
    mps_no_memory_limit,
    mps_shared_users,
    persistence_off,
    shared_default_mode,
)
from gpuwarden.observe.doctor_procs import (
    alloc_conf_unset,
    container_namespace,
    leaked_pids,
    numa_mismatch,
    residual_memory,
)
from gpuwarden.observe.leaks import Leak
from gpuwarden.observe.snapshot import Snapshot

# The registry: add a rule by writing a function in doctor_gpus.py or doctor_procs.py and
# listing it here.
RULES: list[Rule] = [
    shared_default_mode,
    residual_memory,
    leaked_pids,
    numa_mismatch,
    persistence_off,
    mps_shared_users,
    mps_no_memory_limit,
    alloc_conf_unset,
    ecc_errors,
    mig_instances,
    container_namespace,
]

# Every id a finding's ``rule`` can take: the stable vocabulary of --json.
RULE_IDS = (
    "shared_default_mode",
    "residual_memory",
    "hidden_holder",
    "dead_pid",
    "garbage_pid",
    "other_namespace",
    "zombie",
    "orphan",
    "numa_mismatch",
    "persistence_off",
    "mps_shared_users",
    "mps_no_memory_limit",
    "alloc_conf_unset",
    "ecc_uncorrected",
    "retired_pages_pending",
    "retired_pages",
    "mig_no_instances",
    "mig_instance_full",
    "mig_shared_users",
    "mig_instances",
    "container_namespace",
)


def diagnose(
    snapshot: Snapshot, leaks: Sequence[Leak], mps: MpsState | None = None
) -> list[Finding]:
    """Run every rule; findings most severe first, then by GPU (machine-wide first)."""
    inp = Inputs(snapshot, tuple(leaks), mps)
    found = [f for rule in RULES for f in rule(inp)]
    sev = {s: i for i, s in enumerate(SEVERITIES)}
    order = {r: i for i, r in enumerate(RULE_IDS)}
    return sorted(
        found,
        key=lambda f: (
            sev[f.severity],
            -1 if f.gpu is None else f.gpu,
            order.get(f.rule, len(order)),
            f.pid or 0,
        ),
    )


def summarize(findings: Sequence[Finding]) -> dict[str, int]:
    """Count per severity, every severity present (zero included) for a stable schema."""
    return {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}


def report(findings: Sequence[Finding]) -> dict[str, object]:
    """The ``doctor --json`` document, which the screens draw too (render/doctor.py)."""
    return {"findings": [f.to_json() for f in findings], "summary": summarize(findings)}


def mps_state(warn: Callable[[str], None]) -> MpsState | None:
    """The MPS daemons as /proc shows them; None, with a warning, when they cannot be
    read: the MPS rules are then skipped rather than reporting on a guess."""
    try:
        return read_mps_state()
    except (OSError, ValueError) as e:
        warn(f"could not read the MPS daemons: {e}")
        return None
