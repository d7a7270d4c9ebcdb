"""The loop's reconciling rules as values: what an active job's directory means for the
job each pass and after a restart, what a supervisor's recorded end makes of a job,
what an ended attempt keeps reserved and whether its memory is back, and what memory
counts as foreign. ``daemon/loop.py`` and its collaborators (``recovery``, ``exits``,
``holds``, ``gpu_states``) gather the facts (job directories, liveness, snapshots) and
carry the answers out; these functions read no files and signal no process, so they are
tested without either (docs/design.md, invariants 3, 5 and 8)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuwarden.jobs import model
from gpuwarden.jobs.model import NewHold
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.jobs.jobdir import ChildInfo, ExitInfo, SupervisorHandle, SupervisorStatus
    from gpuwarden.jobs.model import Hold, Job
    from gpuwarden.observe.snapshot import GpuView

PEAK_WINDOW = 300.0  # seconds a foreign process's peak keeps counting against headroom
# Memory no process accounts for counts against headroom only once it has persisted
# this long (as a leak finding must persist): the driver frees an ended process's memory
# a moment after it leaves the process list, and that memory is its job's (a hold).
UNACCOUNTED_PERSIST = 3.0
LEAK_TOLERANCE = 64 << 20  # unaccounted memory may drift this much without blame

# What a pass or a recovery does with an active job (``pass_step``, ``recovery_step``).
FINISH = "finish"  # its end is recorded: collect it
SETTLE = "settle"  # reserved, its supervisor not recorded: adopt one, else void and requeue
STARTED = "started"  # reserved, and its command runs: record the start
ADOPT = "adopt"  # its supervisor runs and the store does not name it: record it
VOID = "void"  # reserved, no supervisor claimed it: void the attempt (or adopt the winner)
REBOOTED = "rebooted"  # it ran in another boot: lost, or queued again if it asked
LOST = "lost"  # its supervisor is gone and recorded no end (read the directory once more)
KEEP = "keep"  # nothing new


def pass_step(job: Job, status: SupervisorStatus, alive: Callable[[SupervisorHandle], bool]) -> str:
    """What one pass does with an active job, from its job directory as just read."""
    if status.exit is not None:
        return FINISH
    if job.state == model.RESERVED and job.supervisor_pid is None:
        return SETTLE
    if job.state == model.RESERVED and status.child is not None:
        return STARTED
    if status.supervisor is not None and not alive(status.supervisor):
        return LOST
    return KEEP


def recovery_step(
    job: Job,
    status: SupervisorStatus,
    *,
    same_boot: bool,
    alive: Callable[[SupervisorHandle], bool],
) -> str:
    """What the daemon does with an active job when it (re)starts (invariant 3): collect
    an end recorded while it was down, settle a job of another boot, adopt a supervisor
    that kept running, void a launch that never happened; else the supervisor is lost."""
    if status.exit is not None:
        return FINISH
    if not same_boot:
        return REBOOTED
    if status.supervisor is not None and alive(status.supervisor):
        return ADOPT if job.supervisor_pid is None else KEEP
    if status.supervisor is None and job.state == model.RESERVED:
        return VOID
    return LOST


@dataclass(frozen=True)
class ExitVerdict:
    """What a recorded end makes of a job, before OOM retries and restart policies
    have their say. ``preempted``: cancelled by a preemption, so queued again (or
    cancelled for good under ``--no-requeue``). ``reason``: what the store keeps as the
    job's reason (None for a success)."""

    state: str
    detail: str
    reason: str | None
    preempted: bool = False


def exit_verdict(job: Job, exit_info: ExitInfo) -> ExitVerdict:
    """The job's end state from its supervisor's record: exit code 0 of a command that
    exited is a success, a cancel is a cancel unless the watchdog or a health check
    asked for it (then a failure, with their reason), anything else a failure."""
    why = exit_info.reason
    if why == "cancelled":
        state = model.CANCELLED
    elif exit_info.exit_code == 0 and why == "exited":
        state = model.SUCCEEDED
    else:
        state = model.FAILED
    detail = f"exit code {exit_info.exit_code}" + ("" if why == "exited" else f" ({why})")
    if not exit_info.tree_clean:
        detail += f"; processes survived SIGKILL: {exit_info.survivors}"
    if state == model.CANCELLED and job.preempting_at is not None:
        return ExitVerdict(state, detail, None, preempted=True)
    if state == model.CANCELLED and job.kill_reason is not None:
        state, why = model.FAILED, job.kill_reason
    reason = None if state == model.SUCCEEDED else why if why != "exited" else detail
    return ExitVerdict(state, detail, reason)


def hold_baseline(seen: Sequence[tuple[float, int]], now: float) -> int | None:
    """The memory no process accounted for while an attempt ran, from the passes'
    samples (time, bytes): a hold is verified back once that figure did not grow. The
    least of the last ``UNACCOUNTED_PERSIST`` seconds (a process starting or ending moves
    it for a moment: one H200 sample was 49 GB), never below zero (NVML's two figures are
    read apart: a sample of -237 MB kept a hold open for 5 s, another for good); the
    latest sample when none is that recent; None when there is none."""
    if not seen:
        return None
    recent = [b for t, b in seen if now - t < UNACCOUNTED_PERSIST] or [seen[-1][1]]
    return max(0, min(recent))


def foreign_figure(
    procs_seen: Sequence[tuple[float, int]],
    unaccounted_seen: Sequence[tuple[float, int]],
    now: float,
) -> int:
    """What placement charges a GPU for memory that is not its jobs': the peak of foreign
    processes' memory over the samples given (``PEAK_WINDOW``), plus the memory no process
    accounts for that persisted, by the same rule as a hold's baseline: a moment's
    in-flight memory is not charged, and a negative sample never adds headroom."""
    peak = max((b for _, b in procs_seen), default=0)
    return peak + (hold_baseline(unaccounted_seen, now) or 0)


def new_hold(
    job: Job,
    seen: Mapping[int, float | None],
    child: ChildInfo | None,
    unaccounted_seen: Mapping[str, Sequence[tuple[float, int]]],
    exited_at: float,
    now: float,
) -> NewHold | None:
    """What an ending attempt leaves reserved until its memory is verified back
    (invariant 5): its budget on its GPUs, the processes the passes saw in its tree (and
    its command, even if no pass saw it run) but not its supervisor or launcher, and
    each GPU's unaccounted memory while it ran. None for a job without a budget."""
    if job.budget is None or not job.gpu_uuids:
        return None
    pids = dict(seen)
    if child is not None:
        pids.setdefault(child.pid, child.start_time)
    if job.supervisor_pid is not None:  # gpuwarden's shim, or an attached job's
        pids.pop(job.supervisor_pid, None)  # launcher: not the job's GPU user
    baseline = {
        u: b
        for u in job.gpu_uuids
        if (b := hold_baseline(unaccounted_seen.get(u, ()), now)) is not None
    }
    return NewHold(
        gpu_uuids=job.gpu_uuids,
        budget=job.budget,
        pids=tuple(sorted(pids)),
        baseline=baseline,
        exited_at=exited_at,
        starts={p: t for p, t in pids.items() if t is not None},
    )


def hold_left(
    hold: Hold, gpus: Sequence[GpuView], running: Collection[int], pid_exists: Callable[[int], bool]
) -> list[str]:
    """What keeps an ended attempt's memory from being verified back, in words (none:
    it is back): one of its processes still listed on its GPUs (a dead one, or one whose
    pid was reused, still holds memory the driver keeps), more memory in use by no
    process than while it ran, or one of its processes still running (``running``: those
    alive with the start time the passes saw)."""
    views = {v.facts.uuid: v for v in gpus}
    left: list[str] = []
    for uuid in hold.gpu_uuids:
        view = views.get(uuid)
        if view is None:
            continue
        for p in view.processes:
            if p.pid in hold.pids:
                dead = p.pid not in running and (p.pid in hold.starts or not pid_exists(p.pid))
                left.append(
                    f"{'dead pid' if dead else 'pid'} {p.pid} "
                    f"{'still holds' if dead else 'holds'} "
                    f"{format_bytes(p.memory)} on GPU {view.facts.index}"
                )
        base, unacc = hold.baseline.get(uuid), view.unaccounted
        if base is not None and unacc is not None and unacc - base > LEAK_TOLERANCE:
            left.append(
                f"GPU {view.facts.index}: {format_bytes(unacc - base)} more in use "
                "by no process than while it ran"
            )
    return left + [f"pid {pid} still runs" for pid in running]
