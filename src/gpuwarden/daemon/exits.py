"""A job's recorded end, collected: what the supervisor wrote (``exit.json``) made into
the job's next state (``daemon/reconcile.py``'s verdict) — an end, a requeue after a
preemption, a retry with a bigger budget after a CUDA OOM, a service's restart after its
backoff — and a failing group's queued jobs held. Each is one transition that also
records the ended attempt's hold (docs/design.md, invariants 2, 3 and 5)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.daemon.reconcile import exit_verdict
from gpuwarden.daemon.restart import cancel_asked
from gpuwarden.daemon.store_errors import Conflict, JobNotFound
from gpuwarden.jobs import model
from gpuwarden.jobs.jobdir import job_dir, read_status
from gpuwarden.sched.headroom import capacity
from gpuwarden.sched.oom import (
    CREEP_WAIT,
    GiveUp,
    OomAsk,
    after_oom,
    describe_ask,
    oom_signature,
    parse_oom,
)
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.daemon.config import Config
    from gpuwarden.daemon.gpu_states import GpuStates
    from gpuwarden.daemon.holds import Holds
    from gpuwarden.daemon.store import Store
    from gpuwarden.jobs.jobdir import ExitInfo
    from gpuwarden.jobs.model import Job


class ExitCollector:
    """Owns what a job's end does to the job: its verdict carried out, the retries and
    restarts it earns, and the hold its ended attempt leaves (``Holds.new``)."""

    def __init__(
        self,
        store: Store,
        config: Config,
        jobs_dir: Path,
        clock: Callable[[], float],
        gpus: GpuStates,
        holds: Holds,
    ) -> None:
        self.store = store
        self.config = config
        self.jobs_dir = jobs_dir
        self.clock = clock
        self.gpus = gpus  # the context allowances, the largest GPU (an OOM retry's bound)
        self.holds = holds

    def finish(self, job: Job, exit_info: ExitInfo) -> None:
        """Collect an attempt's recorded end (``exit_verdict``): requeue a preempted
        job, retry one that ran out of GPU memory, restart a service, else end the job,
        leaving its hold; a failing group's queued jobs may be held after it."""
        verdict = exit_verdict(job, exit_info)
        state, detail, reason = verdict.state, verdict.detail, verdict.reason
        started = job.started_at
        if started is None:
            child = read_status(job_dir(self.jobs_dir, job)).child
            started = child.started_at if child is not None else None
        now = self.clock()
        self.gpus.measure_context(job, exit_info.started, state == model.SUCCEEDED)
        if verdict.preempted:
            self._requeue_preempted(job, detail)
            return
        oom: dict[str, Any] = {}  # what a final OOM asked for (``show``, ``wait``)
        if state == model.FAILED and exit_info.started:
            tail = self._output_tail(job)
            signature = oom_signature(tail)
            ask = None if signature is None else parse_oom(tail)
            if signature is not None and job.spec.attach is not None:
                self.store.add_event(
                    job.id,
                    "oom",
                    f"{signature}; {detail}; a retry is its launcher's ({job.spec.attach})",
                    now,
                )
            elif signature is not None and self._after_oom(job, signature, ask, detail):
                return
            if signature is not None:
                oom = {
                    "oom_tried": None if ask is None else ask.tried,
                    "oom_need": None if ask is None else ask.need(self.gpus.context_allowance(job)),
                }
        svc = job.spec.service
        if (
            svc is not None
            and state != model.CANCELLED
            and not cancel_asked(job.events)
            and svc.restarts_from(state == model.SUCCEEDED)
        ):
            given_up = self._restart(job, detail, now)
            if given_up is None:
                return
            if state != model.SUCCEEDED:  # a success keeps no reason
                reason = given_up
        self.store.transition(
            job.id,
            model.ACTIVE,
            state,
            **oom,
            now=now,
            kind=state,
            detail=detail,
            exit_code=exit_info.exit_code,
            ended_at=exit_info.ended_at,
            started_at=started,
            preempting_at=None,
            reason=reason,
            hold=self.holds.new(job, exit_info.ended_at),
        )
        if state == model.FAILED and job.spec.group is not None:
            self._hold_failing_group(job)

    def _restart(self, job: Job, detail: str, now: float) -> str | None:
        """Queue a service that ended again, in its place (its submission time kept) with
        the same budget, after its backoff; None when it was. Past its restart limit it
        is given up: one ``restart_limit`` event, and the reason it ends with returned."""
        from gpuwarden.daemon.restart import backoff, recent_restarts
        from gpuwarden.jobs.lifecycle import RESTART_LIMIT, RESTARTED
        from gpuwarden.units import format_duration

        svc = job.spec.service
        assert svc is not None
        recent = recent_restarts(job.events, now, svc.window)
        if recent >= svc.limit:
            why = (
                f"restart limit: {recent} restart(s) within {format_duration(svc.window)} "
                f"(--restart-limit {svc.limit}/{format_duration(svc.window)}); last end: "
                f"{detail}"
            )
            self.store.add_event(job.id, RESTART_LIMIT, why, now)
            return why
        delay = backoff(recent)
        self.store.transition(
            job.id,
            model.ACTIVE,
            model.QUEUED,
            now=now,
            kind=RESTARTED,
            detail=f"restart {job.restarts + 1} ({svc.restart}) after {detail}; in {delay:g}s",
            reason=f"restarting after {detail}",
            **model.fresh_attempt(job),
            restarts=job.restarts + 1,
            not_before=now + delay,
            hold=self.holds.new(job, now),
        )
        return None

    def _hold_failing_group(self, job: Job) -> None:
        """A group whose last jobs all failed the same way is held, not burned through:
        its queued jobs wait for the user to look (``release`` lets them go)."""
        from gpuwarden.sched.history import STREAK, failing_streak, failure_signature

        assert job.spec.group is not None
        recent = self.store.recent_ends(job.spec.uid, job.spec.group, STREAK)
        same = failing_streak(
            [
                failure_signature(
                    j.state, j.exit_code, j.reason, any(e.kind == "oom" for e in j.events)
                )
                for j in recent
            ]
        )
        if same is None:
            return
        why = (
            f"group {job.spec.group}: its last {STREAK} jobs failed the same way "
            f"({same}); held until released"
        )
        now = self.clock()
        for waiting in self.store.list(
            states=[model.QUEUED],
            user=job.spec.user,
            group=job.spec.group,
            with_events=False,
            with_env=False,
        ):
            if waiting.spec.uid != job.spec.uid:
                continue
            with contextlib.suppress(Conflict, JobNotFound):
                self.store.transition(
                    waiting.id,
                    (model.QUEUED,),
                    model.HELD,
                    now=now,
                    kind="group_held",
                    detail=why,
                    reason=why,
                )

    def _requeue_preempted(self, job: Job, detail: str) -> None:
        now = self.clock()
        if job.spec.no_requeue:
            self.store.transition(
                job.id,
                model.ACTIVE,
                model.CANCELLED,
                now=now,
                kind=model.CANCELLED,
                detail=f"preempted; {detail}",
                reason="preempted (--no-requeue)"
                if job.spec.attach is None
                else f"preempted; {job.spec.attach} may start it again",
                ended_at=now,
                preempting_at=None,
                preemptions=job.preemptions + 1,
                hold=self.holds.new(job, now),
            )
            return
        self.store.transition(
            job.id,
            model.ACTIVE,
            model.QUEUED,
            now=now,
            kind="requeued",
            detail=f"after preemption {job.preemptions + 1}; {detail}",
            reason="requeued after preemption",
            **model.fresh_attempt(job),
            preemptions=job.preemptions + 1,
            hold=self.holds.new(job, now),
        )

    def _after_oom(self, job: Job, signature: str, ask: OomAsk | None, detail: str) -> bool:
        """Record the OOM; queue the job again with a bigger budget when it may: at once
        (a bigger budget waits only for room), in its place in the queue (its submission
        time is kept). True when it was queued again (the caller records nothing more)."""
        now = self.clock()
        context = self.gpus.context_allowance(job)
        asked = "" if ask is None else f"; {describe_ask(ask, context)}"
        self.store.add_event(job.id, "oom", f"{signature}; {detail}{asked}", now)
        largest = max((capacity(g) for g in self.gpus.last), default=0)
        decision = after_oom(
            old_budget=job.budget if job.request is not None else None,
            peak=job.peak_memory,
            largest=largest,
            used=job.oom_retries,
            allowed=job.spec.retries,
            backoff=self.config.retry_backoff,
            ask=ask,
            context=context,
        )
        if isinstance(decision, GiveUp):
            self.store.add_event(job.id, "not_retried", decision.reason, now)
            return False
        shown = (
            ""
            if decision.need is None
            else f"shown to need {format_bytes(decision.need)}"
            + (
                " (the OOM message)"
                if ask is not None and decision.need == ask.need(context)
                else " (its peak)"
            )
            + "; "
        )
        self.store.transition(
            job.id,
            model.ACTIVE,
            model.QUEUED,
            now=now,
            kind="retried",
            detail=(
                f"CUDA OOM retry {job.oom_retries + 1} of {job.spec.retries}: {shown}"
                f"budget {format_bytes(job.budget or 0)} -> "
                f"{format_bytes(decision.budget)}"
                + (
                    ""
                    if decision.ceiling is None
                    else f" or up to {format_bytes(decision.ceiling)} where a GPU has room (it "
                    "crept into its cap in small steps: the message shows only that it "
                    "needs more)"
                )
                + ", "
                + (
                    f"in {decision.delay:g}s (the same budget: backing off)"
                    if decision.delay > 0
                    else "as soon as it fits"
                )
            ),
            reason="retrying after a CUDA OOM",
            **model.fresh_attempt(job),
            oom_retries=job.oom_retries + 1,
            retry_mem=decision.budget,
            retry_ceiling=decision.ceiling,
            ceiling_until=None if decision.ceiling is None else now + CREEP_WAIT,
            not_before=now + decision.delay,
            oom_tried=None if ask is None else ask.tried,
            oom_need=decision.need,
            hold=self.holds.new(job, now),
        )
        return True

    def _output_tail(self, job: Job, limit: int = 64 << 10) -> str:
        """The end of the job's stderr and stdout, where an OOM message would be."""
        from gpuwarden.jobs.jobdir import STDERR, STDOUT

        parts = []
        for name in (STDERR, STDOUT):
            try:
                with open(job_dir(self.jobs_dir, job) / name, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(f.tell() - limit, 0))
                    parts.append(f.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(parts)
