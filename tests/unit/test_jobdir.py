"""The job directory's files written and read back: each record once, a claim that names
no process is a tombstone, and a tombstone keeps every later supervisor out."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.jobs import jobdir
from gpuwarden.jobs.jobdir import ChildInfo, ExitInfo, SupervisorHandle, read_status


def test_claim_child_and_exit_read_back_as_written_and_once(tmp_path: Path) -> None:
    me = SupervisorHandle(pid=4242, start_time=1700000000.25, boot_id="b00t", start_ticks=99)
    child = ChildInfo(
        pid=4243,
        start_time=1700000001.5,
        start_ticks=120,
        warnings=("no numactl",),
        started_at=1700000001.75,
    )
    ended = ExitInfo(
        exit_code=137,
        signal=9,
        reason="cancelled",
        ended_at=1700000009.0,
        tree_clean=False,
        survivors=(4250,),
        started=True,
        warnings=("late",),
    )
    empty = read_status(tmp_path)
    assert (empty.supervisor, empty.child, empty.exit) == (None, None, None)
    jobdir.write_claim(tmp_path, 7, me, "n0nce")
    jobdir.write_child(tmp_path, child)
    jobdir.write_exit(tmp_path, 7, ended)
    st = read_status(tmp_path)
    assert (st.supervisor, st.child, st.exit) == (me, child, ended) and st.finished
    for again in (
        lambda: jobdir.write_claim(tmp_path, 7, me, "other"),
        lambda: jobdir.write_child(tmp_path, child),
        lambda: jobdir.write_exit(tmp_path, 7, ended),
    ):
        with pytest.raises(FileExistsError):
            again()
    assert read_status(tmp_path) == st
    assert jobdir.read_json(tmp_path / jobdir.SUPERVISOR)["nonce"] == "n0nce"
    assert not jobdir.void_start(tmp_path, "test")  # a supervisor claimed it first


def test_a_tombstone_keeps_supervisors_out(tmp_path: Path) -> None:
    d = tmp_path / "job-1"
    assert jobdir.void_start(d, "test", job=1)  # the directory need not exist yet
    assert jobdir.void_start(d, "test again", job=1)  # voided: still void
    assert read_status(d).supervisor is None
    with pytest.raises(FileExistsError):
        jobdir.write_claim(d, 1, SupervisorHandle(pid=1, start_time=0.0), "late")
