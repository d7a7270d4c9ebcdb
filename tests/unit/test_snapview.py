"""What the daemon serves each caller of ``GET /v1/snapshot``: no more than that caller's
own ``status`` could read from /proc (daemon/snapview.py)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.snapview import SnapshotKeeper, answer, for_caller, hidepid
from gpuwarden.errors import UsageError
from gpuwarden.render.ink import Ink
from gpuwarden.render.statusview import render_doc
from tests.helpers.builders import gpu, holder, proc, snapshot

ALICE = Caller(pid=1, uid=1000, gid=1000, user="alice", groups=(1000,))
ROOT = Caller(pid=1, uid=0, gid=0, user="root", groups=(0,))


def _snap():  # type: ignore[no-untyped-def]
    mine = proc(10, env={"GPUWARDEN_JOB": "7"})
    theirs = proc(
        20,
        user="bob",
        uid=1001,
        command="python secret.py",
        container="docker:ab",
        env={"GPUWARDEN_JOB": "8"},
    )
    return snapshot(
        [(gpu(0), [mine, theirs])],
        holders=[
            holder(30, ("/dev/nvidia0",), (0,), user="alice"),
            holder(31, ("/dev/nvidia0",), (0,), user="bob"),
        ],
    )


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
    f.write_text(
        "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
        "23 1 0:22 / /proc rw,nosuid,nodev,noexec - proc proc rw,hidepid=2,gid=27\n"
    )
    assert hidepid(f) == (True, 27)
    f.write_text("23 1 0:22 / /proc rw,nosuid - proc proc rw\n")
    assert hidepid(f) == (False, None)
    f.write_text("23 1 0:22 / /proc rw - proc proc rw,hidepid=invisible\n")
    assert hidepid(f) == (True, None)
    assert hidepid(tmp_path / "absent") == (False, None)


def _answer(
    caller: Caller, query: dict[str, str], hidden: tuple[bool, int | None] = (False, None)
) -> tuple[dict[str, Any], Any]:
    """``GET /v1/snapshot``'s body for ``caller``: its metadata, and its document."""
    snap = replace(_snap(), taken_at=time.time())
    keeper = SnapshotKeeper(lambda: None, lambda: None)  # type: ignore[arg-type,return-value]
    keeper.hidden = hidden
    keeper._history = [snap]  # as its thread would have taken it
    body = answer(caller, keeper, query)
    at = body.find(b',"snapshot":')
    return json.loads(body[:at] + b"}"), json.loads(body[at + len(b',"snapshot":') : -1])


@pytest.mark.parametrize("width,colour", [(80, "0"), (200, "1"), (20, "0")])
def test_the_table_view_is_the_screen_drawn_from_the_callers_own_document(
    width: int, colour: str
) -> None:
    """``view=table``: the lines ``render_doc`` draws from the document this caller is
    served (here under hidepid: bob's command never reaches alice's screen), for the
    width and colour the client asked for."""
    hides = (True, None)
    _, doc = _answer(ALICE, {}, hides)
    _, text = _answer(ALICE, {"view": "table", "width": str(width), "colour": colour}, hides)
    assert isinstance(text, str) and "secret" not in text
    assert text == "".join(
        line + "\n" for line in render_doc(doc, width=width, ink=Ink(colour == "1"))
    )
    assert ("\x1b[1m" in text) == (colour == "1")
    _, mine = _answer(ALICE, {"view": "table", "width": "80", "user": "alice"})
    assert "python job10.py" in mine and "bob" not in mine  # a filter: what it matched


def test_the_table_views_width_and_colour_are_checked() -> None:
    for query in (
        {"view": "table"},
        {"view": "table", "width": "19"},
        {"view": "table", "width": "1001"},
        {"view": "table", "width": "８０"},
        {"view": "table", "width": "80", "colour": "yes"},
        {"view": "pictures"},
    ):
        with pytest.raises(UsageError):
            _answer(ROOT, query)
