"""What ``reap`` may do about each leak: a pure plan, decided before any signal is sent.

The rules: kill hidden holders and orphans; ask a zombie's parent to reap it; never touch
a monitor, another user's process (unless root), gpuwarden itself, init, or — unless the
user named its pid — a process of a running gpuwarden job or one the driver shows
actively computing. Memory with no process
behind it cannot be killed: the plan says what to run instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.errors import UsageError
from gpuwarden.observe.leaks import Leak
from gpuwarden.observe.snapshot import Snapshot
from gpuwarden.procs.model import ProcInfo

TERMINATE, SIGNAL_PARENT, NONE = "terminate", "signal_parent", "none"


def persistence_cycle(gpu: int | None) -> str:
    target = "" if gpu is None else f" -i {gpu}"
    return f"sudo nvidia-smi{target} -pm 0 && sudo nvidia-smi{target} -pm 1"


@dataclass(frozen=True)
class ReapAction:
    action: str  # terminate | signal_parent | none
    kind: str  # the leak kind, or "named" for a process the user named with --pid
    pid: int | None
    start_time: float | None
    gpus: tuple[int, ...]
    user: str | None
    expect_bytes: int | None  # memory expected back, when known
    reason: str
    next_step: str | None = None
    target: int | None = None  # the pid actually signalled (the parent, for a zombie)

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action,
            "kind": self.kind,
            "pid": self.pid,
            "gpus": list(self.gpus),
            "user": self.user,
            "expect_bytes": self.expect_bytes,
            "reason": self.reason,
            "next_step": self.next_step,
            "target": self.target,
        }


_NO_PROCESS_STEPS = {
    "dead_pid": "wait ~30 s for the driver to tear the context down; if it stays: {cycle}",
    "garbage_pid": "upgrade nvidia-ml-py to match the driver (pip install -U nvidia-ml-py), "
    "then look again with `gpuwarden status`",
    "other_namespace": "run gpuwarden on the host (or in a container with --pid=host) to see "
    "and reap that process",
    "unaccounted": "if `gpuwarden leaks` shows no holder for it: {cycle}",
}


def _sum(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def job_processes(
    pids: Iterable[int], info: Callable[[int], ProcInfo], daemon: Mapping[str, Any] | None
) -> dict[int, int]:
    """Which of ``pids`` belong to a running gpuwarden job, as {pid: job id}: in the tree
    the daemon reports for one (``daemon``: its /v1/job-pids answer, None when no daemon
    answers), or with GPUWARDEN_JOB in its own or an ancestor's environment. With a
    daemon, GPUWARDEN_JOB counts only for a job it still runs: a worker left behind by an
    ended job is a leak like any other."""
    trees = {int(p): int(j) for p, j in (daemon or {}).get("pids", {}).items()}
    running = None if daemon is None else set(trees.values())
    out: dict[int, int] = {}
    for pid in pids:
        if pid in trees:
            out[pid] = trees[pid]
            continue
        cur: int | None = pid
        for _ in range(64):  # an ancestry is never this deep; a loop in /proc is no reason
            if cur is None or cur <= 1:
                break
            facts = info(cur)
            raw = (facts.env or {}).get("GPUWARDEN_JOB", "")
            if raw.isascii() and raw.isdigit() and (running is None or int(raw) in running):
                out[pid] = int(raw)
                break
            cur = facts.ppid
    return out


def plan_reap(
    leaks: Sequence[Leak],
    snap: Snapshot,
    *,
    caller_uid: int,
    named: Iterable[int] = (),
    protected: Iterable[int] = (1,),
    managed: Mapping[int, int] | None = None,
) -> list[ReapAction]:
    """One action per process (a hidden holder of several GPUs is killed once).
    ``managed``: processes of running jobs ({pid: job id}, ``job_processes``), left
    alone unless named."""
    named_set = set(named)
    never = set(protected) | {snap.observer_pid}
    by_pid: dict[int, list[Leak]] = {}
    plans: list[ReapAction] = []
    for lk in leaks:
        if named_set and lk.pid not in named_set:
            continue
        if lk.pid is None:
            step = _NO_PROCESS_STEPS["unaccounted"].format(cycle=persistence_cycle(lk.gpu))
            plans.append(
                ReapAction(
                    NONE,
                    lk.kind,
                    None,
                    None,
                    (lk.gpu,) if lk.gpu is not None else (),
                    None,
                    lk.memory,
                    "no process holds it",
                    step,
                )
            )
            continue
        by_pid.setdefault(lk.pid, []).append(lk)

    for pid in named_set - set(by_pid):
        views = snap.process(pid)
        holder = next((h for h in snap.holders if h.pid == pid), None)
        if not views and holder is None:
            raise UsageError(f"pid {pid} holds no GPU memory and no NVIDIA device file")
        if views:
            v = views[0]
            by_pid[pid] = [
                Leak(
                    gpu=x.gpu.gpu_index,
                    kind="named",
                    memory=x.memory,
                    pid=pid,
                    user=v.user,
                    evidence="named by --pid",
                    command=v.command,
                    start_time=v.info.start_time,
                    parent=v.info.ppid,
                )
                for x in views
            ]
        elif holder is not None:
            by_pid[pid] = [
                Leak(
                    gpu=None,
                    kind="named",
                    memory=None,
                    pid=pid,
                    user=holder.user,
                    evidence="named by --pid",
                    command=holder.command,
                    start_time=holder.start_time,
                )
            ]

    for pid, group in sorted(by_pid.items()):
        plans.append(_decide(pid, group, snap, caller_uid, named_set, never, managed or {}))
    return sorted(plans, key=lambda a: (a.gpus or (-1,), a.pid or 0))


def _decide(
    pid: int,
    group: list[Leak],
    snap: Snapshot,
    caller_uid: int,
    named: set[int],
    never: set[int],
    managed: Mapping[int, int],
) -> ReapAction:
    first = group[0]
    kinds = {lk.kind for lk in group}
    gpus = tuple(sorted({lk.gpu for lk in group if lk.gpu is not None}))
    cycle = persistence_cycle(gpus[0] if len(gpus) == 1 else None)

    def act(
        action: str, reason: str, next_step: str | None = None, target: int | None = None
    ) -> ReapAction:
        return ReapAction(
            action=action,
            kind=first.kind if len(kinds) == 1 else "+".join(sorted(kinds)),
            pid=pid,
            start_time=first.start_time,
            gpus=gpus,
            user=first.user,
            expect_bytes=_sum(lk.memory for lk in group),
            reason=reason,
            next_step=next_step,
            target=target,
        )

    if first.kind in _NO_PROCESS_STEPS:
        return act(
            NONE, "no process here to signal", _NO_PROCESS_STEPS[first.kind].format(cycle=cycle)
        )
    if first.kind == "monitor":
        return act(NONE, "a monitoring tool holding only control files: harmless")
    if pid in never:
        return act(NONE, "protected process (init or gpuwarden itself)")
    if pid in managed and pid not in named:
        return act(
            NONE,
            f"a process of running gpuwarden job {managed[pid]} (a worker it "
            f"started?); name it with --pid {pid} to reap it anyway",
        )
    views = snap.process(pid)
    owner_uid = views[0].info.uid if views else None
    if caller_uid != 0 and owner_uid is not None and owner_uid != caller_uid:
        return act(
            NONE, f"belongs to user {first.user}; run as root to reap another user's process"
        )
    if any((v.gpu.sm_utilization or 0) > 0 for v in views) and pid not in named:
        return act(
            NONE, f"the driver shows it computing; name it with --pid {pid} to reap it anyway"
        )
    if first.kind == "zombie":
        parent = first.parent
        if parent is None or parent in never:
            return act(NONE, "a zombie whose parent is init or unknown", cycle)
        return act(
            SIGNAL_PARENT,
            f"defunct; asking its parent {parent} to reap it (SIGCHLD)",
            f"kill {parent}  # the parent that does not reap it",
            target=parent,
        )
    why = {
        "hidden_holder": "holds GPU device files the driver does not list",
        "orphan": "orphaned worker still holding GPU memory",
        "named": "named by --pid",
    }.get(first.kind, first.kind)
    return act(TERMINATE, why, cycle, target=pid)
