"""The loop's reconciling rules (daemon/reconcile.py), without processes or files: what
a pass and a recovery do with an active job, what an end makes of it, what an ended
attempt keeps reserved and when its memory counts as back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuwarden.daemon import reconcile as rc
from gpuwarden.jobs import model
from gpuwarden.jobs.jobdir import ChildInfo, ExitInfo, SupervisorHandle, SupervisorStatus
from gpuwarden.jobs.model import Hold, Job, JobSpec
from tests.helpers.builders import GiB, gpu, proc, snapshot

MiB = 1 << 20
SUP = SupervisorHandle(pid=40, start_time=100.0)
CHILD = ChildInfo(pid=41, start_time=101.0, started_at=101.5)


def job(state: str = model.RUNNING, **kw: Any) -> Job:
    spec = JobSpec(command=("python", "train.py"), user="alice", uid=1000, gid=1000)
    base: dict[str, Any] = dict(
        id=7,
        spec=spec,
        state=state,
        submitted_at=50.0,
        gpus=(0,),
        gpu_uuids=("GPU-0",),
        budget=10 * GiB,
        supervisor_pid=SUP.pid,
    )
    base.update(kw)
    return Job(**base)


def ended(code: int | None = 0, reason: str = "exited", **kw: Any) -> ExitInfo:
    return ExitInfo(
        exit_code=code, signal=None, reason=reason, ended_at=200.0, tree_clean=True, **kw
    )


def status(
    supervisor: SupervisorHandle | None = SUP,
    child: ChildInfo | None = CHILD,
    exit: ExitInfo | None = None,
) -> SupervisorStatus:
    return SupervisorStatus(supervisor=supervisor, child=child, exit=exit)


def alive(_: SupervisorHandle) -> bool:
    return True


def dead(_: SupervisorHandle) -> bool:
    return False


# -- a pass ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("j", "st", "is_alive", "step"),
    [
        (job(), status(exit=ended()), dead, rc.FINISH),  # the end is read before liveness
        (job(model.RESERVED, supervisor_pid=None), status(child=None), alive, rc.SETTLE),
        (
            job(model.RESERVED, supervisor_pid=None),
            status(supervisor=None, child=None),
            dead,
            rc.SETTLE,
        ),
        (job(model.RESERVED), status(), alive, rc.STARTED),
        (job(model.RESERVED), status(child=None), alive, rc.KEEP),  # still coming up
        (job(), status(), alive, rc.KEEP),
        (job(), status(), dead, rc.LOST),
        (job(), status(supervisor=None), dead, rc.KEEP),  # no handle to judge by yet
    ],
)
def test_a_pass_reads_each_job_directory_into_one_step(
    j: Job, st: SupervisorStatus, is_alive: Any, step: str
) -> None:
    assert rc.pass_step(j, st, is_alive) == step


# -- a recovery ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("j", "st", "same_boot", "is_alive", "step"),
    [
        (job(), status(exit=ended()), False, dead, rc.FINISH),  # recorded: collect it anyway
        (job(), status(), False, alive, rc.REBOOTED),
        (job(model.RESERVED, supervisor_pid=None), status(), True, alive, rc.ADOPT),
        (job(), status(), True, alive, rc.KEEP),
        (
            job(model.RESERVED, supervisor_pid=None),
            status(supervisor=None, child=None),
            True,
            dead,
            rc.VOID,
        ),
        (job(), status(supervisor=None), True, dead, rc.LOST),  # running, and no supervisor
        (job(), status(), True, dead, rc.LOST),
    ],
)
def test_a_restart_adopts_collects_voids_or_loses_each_active_job(
    j: Job, st: SupervisorStatus, same_boot: bool, is_alive: Any, step: str
) -> None:
    assert rc.recovery_step(j, st, same_boot=same_boot, alive=is_alive) == step


# -- an end ----------------------------------------------------------------------------


def test_exit_code_zero_succeeds_and_keeps_no_reason() -> None:
    v = rc.exit_verdict(job(), ended(0))
    assert (v.state, v.detail, v.reason, v.preempted) == (
        model.SUCCEEDED,
        "exit code 0",
        None,
        False,
    )


def test_a_non_zero_exit_fails_with_its_code_as_the_reason() -> None:
    v = rc.exit_verdict(job(), ended(3))
    assert (v.state, v.reason) == (model.FAILED, "exit code 3")


def test_a_signal_or_timeout_fails_and_names_it() -> None:
    v = rc.exit_verdict(job(), ended(None, "timeout"))
    assert (v.state, v.detail, v.reason) == (model.FAILED, "exit code None (timeout)", "timeout")


def test_a_cancel_is_a_cancel_unless_gpuwarden_killed_it() -> None:
    assert rc.exit_verdict(job(), ended(None, "cancelled")).state == model.CANCELLED
    v = rc.exit_verdict(job(kill_reason="over its limit"), ended(None, "cancelled"))
    assert (v.state, v.reason) == (model.FAILED, "over its limit")


def test_a_preempted_job_is_queued_again_even_if_a_kill_reason_is_set() -> None:
    v = rc.exit_verdict(job(preempting_at=150.0, kill_reason="x"), ended(None, "cancelled"))
    assert v.preempted and v.state == model.CANCELLED
    # Preemption is about a cancel: a job that exited on its own meanwhile just ended.
    assert not rc.exit_verdict(job(preempting_at=150.0), ended(0)).preempted


def test_survivors_of_sigkill_are_named_in_the_detail() -> None:
    v = rc.exit_verdict(job(), dataclasses.replace(ended(0), tree_clean=False, survivors=(9, 10)))
    assert v.detail == "exit code 0; processes survived SIGKILL: (9, 10)"
    assert v.state == model.SUCCEEDED


# -- what an ended attempt keeps reserved ----------------------------------------------


def test_a_hold_names_the_tree_and_the_command_but_not_the_supervisor() -> None:
    seen = {SUP.pid: 100.0, 42: 102.0, 43: None}
    h = rc.new_hold(
        job(),
        seen,
        CHILD,
        {"GPU-0": [(195.0, 30 * MiB), (199.0, 20 * MiB)]},
        exited_at=200.0,
        now=200.0,
    )
    assert h is not None
    assert h.pids == (41, 42, 43) and h.starts == {41: 101.0, 42: 102.0}
    assert h.baseline == {"GPU-0": 20 * MiB} and h.budget == 10 * GiB
    assert h.exited_at == 200.0 and h.gpu_uuids == ("GPU-0",)


def test_a_job_without_a_budget_holds_nothing() -> None:
    assert rc.new_hold(job(budget=None), {}, CHILD, {}, 200.0, 200.0) is None
    assert rc.new_hold(job(gpu_uuids=()), {}, CHILD, {}, 200.0, 200.0) is None


def hold(**kw: Any) -> Hold:
    base: dict[str, Any] = dict(
        id=1,
        job_id=7,
        attempt=1,
        gpu_uuids=("GPU-0",),
        budget=10 * GiB,
        pids=(41, 42),
        baseline={"GPU-0": 0},
        exited_at=200.0,
        starts={41: 101.0},
    )
    base.update(kw)
    return Hold(**base)


def test_memory_is_back_when_no_process_of_the_attempt_is_listed_and_none_runs() -> None:
    snap = snapshot([(gpu(0, used=5 * GiB), [proc(99, memory=5 * GiB)])])
    assert rc.hold_left(hold(), snap.gpus, running=(), pid_exists=lambda _: False) == []


def test_a_dead_process_still_listed_keeps_the_hold_and_says_so() -> None:
    snap = snapshot([(gpu(0, used=3 * GiB), [proc(41, memory=3 * GiB)])])
    assert rc.hold_left(hold(), snap.gpus, (), lambda _: False) == [
        "dead pid 41 still holds 3072MiB on GPU 0"
    ]
    # A pid the passes saw without its start time is dead only if no process has it.
    snap = snapshot([(gpu(0, used=GiB), [proc(42)])])
    assert rc.hold_left(hold(), snap.gpus, (), lambda _: True) == ["pid 42 holds 1024MiB on GPU 0"]
    assert rc.hold_left(hold(), snap.gpus, (), lambda _: False) == [
        "dead pid 42 still holds 1024MiB on GPU 0"
    ]


def test_memory_no_process_accounts_for_keeps_the_hold_past_the_tolerance() -> None:
    grown = snapshot([(gpu(0, used=rc.LEAK_TOLERANCE + 2 * MiB), [])])
    assert rc.hold_left(hold(), grown.gpus, (), lambda _: False) == [
        "GPU 0: 66MiB more in use by no process than while it ran"
    ]
    drift = snapshot([(gpu(0, used=rc.LEAK_TOLERANCE), [])])
    assert rc.hold_left(hold(), drift.gpus, (), lambda _: False) == []


def test_a_process_of_the_attempt_still_running_keeps_the_hold() -> None:
    snap = snapshot([(gpu(0), [])])
    assert rc.hold_left(hold(), snap.gpus, running=(41,), pid_exists=lambda _: True) == [
        "pid 41 still runs"
    ]


def test_a_gpu_gone_from_the_snapshot_is_not_judged() -> None:
    snap = snapshot([(gpu(1, used=40 * GiB), [proc(41, gpu_index=1)])])
    assert rc.hold_left(hold(), snap.gpus, (), lambda _: False) == []
