"""What the daemon serves each caller of ``GET /v1/snapshot``: no more than that caller's
own ``status`` could read from /proc (daemon/snapview.py)."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.snapview import for_caller, hidepid
from tests.unit.builders import gpu, holder, proc, snapshot

ALICE = Caller(pid=1, uid=1000, gid=1000, user="alice", groups=(1000,))
ROOT = Caller(pid=1, uid=0, gid=0, user="root", groups=(0,))


def _snap():  # type: ignore[no-untyped-def]
    mine = proc(10, env={"GPUWARDEN_JOB": "7"})
    theirs = proc(20, user="bob", uid=1001, command="python secret.py", container="docker:ab",
                  env={"GPUWARDEN_JOB": "8"})
    return snapshot([(gpu(0), [mine, theirs])],
                    holders=[holder(30, ("/dev/nvidia0",), (0,), user="alice"),
                             holder(31, ("/dev/nvidia0",), (0,), user="bob")])


def test_a_user_gets_the_holders_of_their_own_processes_only() -> None:
    out = for_caller(_snap(), ALICE, (False, None))
    assert [h.pid for h in out.holders] == [30]
    procs = {p.pid: p for p in out.gpus[0].processes}
    assert procs[20].command == "python secret.py"  # /proc/PID/cmdline: world-readable
    assert procs[20].user == "bob" and procs[20].container == "docker:ab"
    assert procs[20].info.env is None and procs[10].info.env is None  # never served


def test_root_gets_everything() -> None:
    snap = _snap()
    assert for_caller(snap, ROOT, (True, None)) is snap


def test_hidepid_hides_other_users_processes_but_not_ones_own() -> None:
    procs = {p.pid: p for p in for_caller(_snap(), ALICE, (True, None)).gpus[0].processes}
    assert (procs[20].user, procs[20].command, procs[20].container) == (None, None, None)
    assert procs[20].elapsed is None and procs[20].info.start_time is None
    assert procs[10].command == "python job10.py" and procs[10].user == "alice"
    exempt = {p.pid: p for p in for_caller(_snap(), ALICE, (True, 1000)).gpus[0].processes}
    assert exempt[20].command == "python secret.py"  # in hidepid's gid= group


def test_hidepid_read_from_mountinfo(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text("22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
                 "23 1 0:22 / /proc rw,nosuid,nodev,noexec - proc proc rw,hidepid=2,gid=27\n")
    assert hidepid(f) == (True, 27)
    f.write_text("23 1 0:22 / /proc rw,nosuid - proc proc rw\n")
    assert hidepid(f) == (False, None)
    f.write_text("23 1 0:22 / /proc rw - proc proc rw,hidepid=invisible\n")
    assert hidepid(f) == (True, None)
    assert hidepid(tmp_path / "absent") == (False, None)
