from __future__ import annotations

import pytest

from gpuwarden.errors import UsageError
from gpuwarden.observe.leaks import find_leaks
from gpuwarden.observe.reap import NONE, SIGNAL_PARENT, TERMINATE, plan_reap
from tests.helpers.builders import GiB, gpu, holder, proc, snapshot

ORPHAN = dict(ppid=1, pgid=9, group_leader_alive=False, parent_pgid=1)


def _plan(snap, uid=1000, named=()):  # type: ignore[no-untyped-def]
    return {a.pid: a for a in plan_reap(find_leaks([snap]), snap, caller_uid=uid, named=named)}


def test_orphans_and_hidden_holders_are_terminated_once() -> None:
    s = snapshot(
        [(gpu(0, used=2 * GiB), [proc(10, **ORPHAN)]), (gpu(1), [])],
        holders=[holder(20, ("/dev/nvidia0", "/dev/nvidia1"), (0, 1), user="alice")],
    )
    plan = _plan(s)
    assert plan[10].action == TERMINATE and plan[10].expect_bytes == GiB
    assert plan[20].action == TERMINATE and plan[20].gpus == (0, 1)


def test_other_users_need_root() -> None:
    s = snapshot([(gpu(0, used=GiB), [proc(10, uid=1001, user="bob", **ORPHAN)])])
    assert _plan(s, uid=1000)[10].action == NONE
    assert "run as root" in _plan(s, uid=1000)[10].reason
    assert _plan(s, uid=0)[10].action == TERMINATE


def test_computing_processes_only_when_named() -> None:
    s = snapshot([(gpu(0, used=GiB), [proc(10, sm=55, **ORPHAN)])])
    assert _plan(s)[10].action == NONE
    assert _plan(s, named=(10,))[10].action == TERMINATE


def test_zombie_asks_parent_and_names_next_step() -> None:
    s = snapshot([(gpu(0, used=GiB), [proc(10, status="zombie", ppid=42)])])
    a = _plan(s)[10]
    assert a.action == SIGNAL_PARENT and a.target == 42
    assert a.next_step is not None and "kill 42" in a.next_step


def test_memory_without_process_gets_persistence_cycle() -> None:
    s = snapshot([(gpu(3, used=GiB), [])])
    [a] = plan_reap(find_leaks([s]), s, caller_uid=0)
    assert a.action == NONE and a.pid is None
    assert a.next_step is not None and "nvidia-smi -i 3 -pm 0" in a.next_step


def test_dead_and_garbage_pids_cannot_be_killed() -> None:
    s = snapshot(
        [
            (
                gpu(0, used=2 * GiB),
                [proc(10, exists=False), proc(2**32 - 1, exists=False, garbage=True)],
            )
        ]
    )
    plan = _plan(s, uid=0)
    assert plan[10].action == NONE and plan[2**32 - 1].action == NONE
    assert "nvidia-ml-py" in (plan[2**32 - 1].next_step or "")


def test_monitors_init_and_self_are_never_killed() -> None:
    s = snapshot(
        [(gpu(0), [])],
        holders=[
            holder(30, ("/dev/nvidiactl",), ()),
            holder(1, ("/dev/nvidia0",), (0,)),
            holder(99999, ("/dev/nvidia0",), (0,)),
        ],
        observer=99999,
    )
    plan = _plan(s, uid=0)
    assert all(a.action == NONE for a in plan.values())


def test_named_running_process_can_be_reaped_and_unknown_pid_is_an_error() -> None:
    s = snapshot([(gpu(0, used=GiB), [proc(10)])])
    assert _plan(s, named=(10,))[10].action == TERMINATE
    with pytest.raises(UsageError, match="holds no GPU memory"):
        _plan(s, named=(12345,))


def test_running_jobs_processes_are_left_unless_named() -> None:
    from gpuwarden.observe.reap import job_processes
    from gpuwarden.procs.model import ProcInfo

    # 30 runs in job 7's tree (the daemon's view); 40's parent 41 carries GPUWARDEN_JOB=7;
    # 50 carries GPUWARDEN_JOB=3, a job that ended: a leftover, a leak like any other.
    procs = {
        40: ProcInfo(pid=40, exists=True, ppid=41, env={}),
        41: ProcInfo(pid=41, exists=True, ppid=1, env={"GPUWARDEN_JOB": "7"}),
        50: ProcInfo(pid=50, exists=True, ppid=1, env={"GPUWARDEN_JOB": "3"}),
        30: ProcInfo(pid=30, exists=True, ppid=1, env={}),
    }
    daemon = {"pids": {"30": 7, "41": 7}}
    assert job_processes([30, 40, 50], procs.__getitem__, daemon) == {30: 7, 40: 7}
    assert job_processes([40, 50], procs.__getitem__, None) == {40: 7, 50: 3}

    s = snapshot([(gpu(0), [])], holders=[holder(30, ("/dev/nvidia0",), (0,), user="alice")])
    leaks = find_leaks([s])
    [kept] = plan_reap(leaks, s, caller_uid=0, managed={30: 7})
    assert kept.action == NONE and "running gpuwarden job 7" in kept.reason
    [named] = plan_reap(leaks, s, caller_uid=0, managed={30: 7}, named=(30,))
    assert named.action == TERMINATE
