"""Leak holds: the memory an ended attempt keeps reserved until it is verified back
(docs/design.md, invariant 5). The loop records each attempt's processes as its passes
see them; a hold keeps them when the attempt ends, each pass verifies the open holds,
and a hold whose memory is not back in time is a leak, attributed to its job, that
starts the reap logic on what the attempt left. The rules themselves are values in
``daemon/reconcile.py``; this module gathers their facts and carries them out."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from gpuwarden.daemon.reconcile import hold_left, new_hold
from gpuwarden.jobs.jobdir import job_dir, read_status
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.daemon.config import Config
    from gpuwarden.daemon.store import Store
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.jobs.model import Hold, Job, NewHold
    from gpuwarden.observe.snapshot import Snapshot


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _still_running(hold: Hold) -> list[int]:
    """The ended attempt's processes that still run: the same processes (pid and start
    time) the passes saw in its tree, not zombies. A supervisor ends the whole tree, so
    these are what a lost supervisor or launcher left."""
    from gpuwarden.procs.identity import alive

    return [pid for pid, start in sorted(hold.starts.items()) if alive(pid, start)]


class Holds:
    """Owns the processes each running attempt was seen with (``seen_pids``), the hold
    an ending attempt leaves, the verification of the open holds each pass, and the
    reaping of what a leaked attempt left."""

    def __init__(
        self,
        store: Store,
        config: Config,
        jobs_dir: Path,
        clock: Callable[[], float],
        backend: Callable[[], Backend],
        unaccounted_seen: Mapping[str, Sequence[tuple[float, int]]],
    ) -> None:
        self.store = store
        self.config = config
        self.jobs_dir = jobs_dir
        self.clock = clock
        self.backend = backend  # the loop's backend, opened once
        # uuid -> recent samples of the memory no process accounts for (the GPU states')
        self.unaccounted_seen = unaccounted_seen
        # job id -> its processes this attempt, with their start times where known
        self.seen_pids: dict[int, dict[int, float | None]] = {}

    def record_tree(self, job_id: int, supervisor_pid: int) -> list[psutil.Process]:
        """The processes of a job's supervisor tree now, each one not seen before in
        this attempt recorded with its start time (what the attempt's hold keeps)."""
        procs = _tree(supervisor_pid)
        seen = self.seen_pids.setdefault(job_id, {})
        for proc in procs:
            if proc.pid not in seen:
                try:
                    seen[proc.pid] = proc.create_time()
                except psutil.Error:
                    seen[proc.pid] = None
        return procs

    def new(self, job: Job, exited_at: float) -> NewHold | None:
        """What the ending attempt leaves reserved until its memory is verified back."""
        return new_hold(
            job,
            self.seen_pids.pop(job.id, {}),
            read_status(job_dir(self.jobs_dir, job)).child,
            self.unaccounted_seen,
            exited_at,
            self.clock(),
        )

    def verify(self, snap: Snapshot) -> list[Hold]:
        """Release the memory of ended attempts once it is back: none of their processes
        is listed on their GPUs and the memory no process accounts for did not grow.
        Past ``release_timeout`` what is left is a leak, attributed to the job (one
        event) and handed to the reap logic; the memory stays reserved meanwhile.
        Returns the holds still open."""
        now = self.clock()
        still: list[Hold] = []
        for h in self.store.open_holds():
            left = hold_left(h, snap.gpus, _still_running(h), psutil.pid_exists)
            took = now - h.exited_at
            if not left:
                how = (
                    "verified"
                    if h.pids or h.baseline
                    else "unverified: the daemon did not see the attempt run"
                )
                self.store.close_hold(
                    h.id,
                    now,
                    how,
                    kind="memory_returned",
                    detail=f"{format_bytes(h.budget)} on "
                    f"{len(h.gpu_uuids)} GPU(s) back {took:.2f} s "
                    "after the end" + ("" if how == "verified" else f" ({how})"),
                )
                continue
            if took > self.config.release_timeout and h.leak is None:
                what = "; ".join(left) + f" ({took:.1f} s after the end)"
                if self.store.report_leak(h.id, what, now):
                    self._reap_for(h)
            still.append(h)
        return still

    def _reap_for(self, hold: Hold) -> None:
        """Run the reap logic on what the attempt left: kill its processes that are
        still there; for memory no process holds, say what would free it. Once per
        leak, so it takes a full snapshot (holders and process details: the pass's own
        leaves them out to stay cheap). A process counts as the attempt's only by the
        (pid, start time) a pass recorded for it: a pid reused since is someone else's."""
        from gpuwarden.observe.leaks import Leak, find_leaks
        from gpuwarden.observe.reap import plan_reap
        from gpuwarden.observe.snapshot import take_snapshot
        from gpuwarden.procs.terminate import same_start, signal_parent, terminate

        snap = take_snapshot(self.backend())
        self._end_orphans(hold)
        gpus = {v.facts.index for v in snap.gpus if v.facts.uuid in hold.gpu_uuids}
        mine: list[Leak] = []
        reused: set[int] = set()
        for lk in find_leaks([snap]):
            if lk.pid is None:
                if lk.gpu in gpus:
                    mine.append(lk)
            elif lk.pid in hold.starts and (
                lk.start_time is None  # gone: advice only
                or same_start(lk.start_time, hold.starts[lk.pid])
            ):
                mine.append(lk)
            elif lk.pid in hold.pids and lk.start_time is not None:
                reused.add(lk.pid)
        for pid in sorted(reused):
            self.store.add_event(
                hold.job_id,
                "reap_advice",
                f"pid {pid} is now another process than the job's: left alone",
                self.clock(),
            )
        for a in plan_reap(mine, snap, caller_uid=os.geteuid()):
            acted = True  # "reaped" only for a process signalled; else what would free it
            if a.action == "terminate" and a.pid is not None:
                result = terminate(a.pid, hold.starts[a.pid], self.config.grace)
            elif a.action == "signal_parent" and a.target is not None and a.pid is not None:
                result = signal_parent(a.target, a.pid)
            else:
                acted = False
                result = "; ".join(x for x in (a.reason, a.next_step) if x)
            who = (
                None
                if a.pid is None
                else f"dead pid {a.pid}"
                if a.kind == "dead_pid"
                else f"{a.kind} pid {a.pid}"
            )
            self.store.add_event(
                hold.job_id,
                "reaped" if acted else "reap_advice",
                result if who is None else f"{who}: {result}",
                self.clock(),
            )

    def _end_orphans(self, hold: Hold) -> None:
        """Processes of the job still running after its end: what a supervisor (or an
        attached job's launcher) killed before it could end the tree leaves. They go
        the way the tree would have (invariant 5) — only those whose pid and start
        time a pass recorded for this attempt (``terminate`` checks the start again as
        it signals): a pid the passes did not see with its start, or one reused since,
        may be anyone's process."""
        from gpuwarden.procs.terminate import terminate

        targets = {pid: hold.starts[pid] for pid in _still_running(hold)}
        for pid, started in sorted(targets.items()):
            result = terminate(pid, started, self.config.grace)
            self.store.add_event(
                hold.job_id, "reaped", f"pid {pid}, left running by the job: {result}", self.clock()
            )
