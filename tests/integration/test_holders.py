"""The /proc/*/fd scan against real processes holding real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.procs.holders import FdTables, keep_fd_tables, scan_holders, shared_fd_tables
from gpuwarden.procs.live import LiveProcesses
from tests.helpers.procs import end_process

HOLD = (
    "import sys,time; fs=[open(p) for p in sys.argv[1:]]; print('ok', flush=True); time.sleep(60)"
)


def _hold(*paths: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, *map(str, paths)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline() == "ok\n"
    return p


def test_scan_finds_holders_and_their_devices(tmp_path: Path) -> None:
    dev = {name: tmp_path / name for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")}
    for p in dev.values():
        p.touch()
    files = {
        str(dev["nvidia0"]): 0,
        str(dev["nvidia1"]): 1,
        str(dev["nvidiactl"]): None,
        str(dev["nvidia-uvm"]): None,
    }
    cuda = _hold(dev["nvidiactl"], dev["nvidia-uvm"], dev["nvidia1"])
    monitor = _hold(dev["nvidiactl"])
    mine = open(dev["nvidia0"])  # noqa: SIM115 — this process holds one too, then is excluded
    try:
        raw = {h.pid: h.devices for h in scan_holders(files)}
        assert raw[cuda.pid] == tuple(
            sorted([str(dev["nvidia-uvm"]), str(dev["nvidia1"]), str(dev["nvidiactl"])])
        )
        assert raw[monitor.pid] == (str(dev["nvidiactl"]),)
        assert os.getpid() in raw
        assert os.getpid() not in {h.pid for h in scan_holders(files, exclude=[os.getpid()])}

        holders = {h.pid: h for h in LiveProcesses().holders(files, exclude=[os.getpid()])}
        assert holders[cuda.pid].gpu_indices == (1,) and holders[cuda.pid].uses_uvm
        assert not holders[cuda.pid].is_monitor
        assert holders[monitor.pid].is_monitor
        assert holders[cuda.pid].user and holders[cuda.pid].command
        # A re-check looks at the pids named alone: one that exited is simply not there.
        again = LiveProcesses().holders(files, only=[monitor.pid, 2**22 + 1])
        assert [h.pid for h in again] == [monitor.pid] and again[0].is_monitor
        assert {h.pid for h in scan_holders(files, only=[cuda.pid, os.getpid()])} == {
            cuda.pid,
            os.getpid(),
        }
    finally:
        mine.close()
        for p in (cuda, monitor):
            end_process(p)


def test_scan_of_nothing_is_empty() -> None:
    assert scan_holders({}) == []


SWAP = (
    "import sys\n"
    "fs = [open(p) for p in sys.argv[1:]]\n"
    "print('ok', flush=True)\n"
    "for line in sys.stdin:\n"
    "    path = line.strip()\n"
    "    if path.startswith('+'):\n"
    "        fs.append(open(path[1:]))\n"
    "    else:\n"
    "        fs.pop(0).close(); fs.append(open(path))  # the same count, another file\n"
    "    print('ok', flush=True)\n"
)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _swapper(*paths: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", SWAP, *map(str, paths)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "ok\n"
    return p


def _tell(p: subprocess.Popen[str], line: str) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(line + "\n")
    p.stdin.flush()
    assert p.stdout.readline() == "ok\n"


def test_kept_fd_tables_reread_what_changed_and_recheck_the_rest(tmp_path: Path) -> None:
    clock = _Clock()
    tables = FdTables(recheck=10.0, clock=clock)
    if not tables.enabled:
        pytest.skip("this kernel does not report /proc/PID/fd's descriptor count")
    nv0, ctl, other = tmp_path / "nvidia0", tmp_path / "nvidiactl", tmp_path / "data"
    for f in (nv0, ctl, other):
        f.touch()
    files = {str(nv0): 0, str(ctl): None}
    p = _swapper(nv0)
    try:
        held = {h.pid: h.devices for h in scan_holders(files, tables=tables)}
        assert held[p.pid] == (str(nv0),)
        read = tables.table(p.pid)
        assert read is not None and read.devices == (str(nv0),) and tables.reads >= 1

        # Nothing changed: its fd table is not read again (other processes on this busy
        # machine may open and close files meanwhile: theirs are).
        again = {h.pid: h.devices for h in scan_holders(files, tables=tables)}
        assert again[p.pid] == (str(nv0),) and tables.table(p.pid) is read

        # A descriptor more: that process's table is read at once.
        _tell(p, f"+{ctl}")
        held = {h.pid: h.devices for h in scan_holders(files, tables=tables)}
        assert held[p.pid] == tuple(sorted([str(nv0), str(ctl)]))
        grown = tables.table(p.pid)
        assert grown is not read and grown is not None and grown.fds == read.fds + 1

        # The same count, another file (nvidia0 closed, data opened): kept until the
        # recheck is due, which bounds how long it stays stale...
        _tell(p, str(other))
        held = {h.pid: h.devices for h in scan_holders(files, tables=tables)}
        assert held[p.pid] == tuple(sorted([str(nv0), str(ctl)]))
        assert tables.table(p.pid) is grown
        # ...a re-check of that pid reads its table itself, whatever is kept...
        only = {h.pid: h.devices for h in scan_holders(files, tables=tables, only=[p.pid])}
        assert only[p.pid] == (str(ctl),)
        _tell(p, str(other))  # (ctl closed, so the whole scan must find it gone too)
        clock.now += 10.0  # ...and after the recheck interval every table is read again
        held = {h.pid: h.devices for h in scan_holders(files, tables=tables)}
        assert p.pid not in held
    finally:
        end_process(p)
    # A process gone leaves the tables with the next whole scan.
    scan_holders(files, tables=tables)
    assert tables.table(p.pid) is None


def test_fd_tables_are_kept_only_where_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuwarden.procs.holders as holders

    monkeypatch.setattr(holders, "_shared", None)  # this process's, as it started
    assert shared_fd_tables() is None  # a one-shot command reads every table once
    tables = keep_fd_tables()
    assert keep_fd_tables() is tables and shared_fd_tables() is tables


def test_fd_tables_saved_for_the_next_run_and_refused_when_not_ours(tmp_path: Path) -> None:
    import json

    from gpuwarden.procs.holders import fd_tables_from
    from gpuwarden.procs.identity import boot_id

    dev = tmp_path / "nvidia0"
    dev.touch()
    files = {str(dev): 0}
    saved = tmp_path / "fd-tables.json"
    p = _hold(dev)
    try:
        with fd_tables_from(saved):  # a one-shot command: scans, then leaves its tables
            first = {h.pid for h in LiveProcesses().holders(files)}
        assert p.pid in first
        assert saved.stat().st_mode & 0o777 == 0o600
        doc = json.loads(saved.read_text())
        assert doc["boot"] == boot_id() and any(row[0] == p.pid for row in doc["tables"])

        loaded = FdTables()
        loaded.load(saved)
        kept = loaded.table(p.pid)
        assert kept is not None and kept.devices == (str(dev),)
        with fd_tables_from(saved):  # the next run finds it without reading its table
            assert {h.pid for h in LiveProcesses().holders(files)} == first
            tables = shared_fd_tables()
            assert tables is not None and tables.table(p.pid) == kept
        assert shared_fd_tables() is None  # nothing kept past the command

        for bad in (
            json.dumps({**doc, "boot": "another boot"}),  # pids and inodes start again
            "{not json",
            json.dumps({"boot": boot_id(), "tables": [[p.pid, 1, 2, "not a list", 3.0]]}),
            json.dumps({"boot": boot_id(), "tables": [[-1, 1, 2, [], 3.0]]}),
            json.dumps({"boot": boot_id(), "tables": 7}),
            "[" * 100_000 + "]" * 100_000,  # deeper than the JSON parser goes
        ):
            saved.write_text(bad)
            refused = FdTables()
            refused.load(saved)
            assert len(refused) == 0, bad
        link = tmp_path / "link.json"
        saved.write_text(json.dumps(doc))
        link.symlink_to(saved)
        refused = FdTables()
        refused.load(link)  # a link where the file should be: not followed
        assert len(refused) == 0
    finally:
        end_process(p)


def test_the_user_cache_dir_is_this_users_alone(tmp_path: Path) -> None:
    from gpuwarden.client.paths import user_cache_dir

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    me = os.geteuid()
    d = user_cache_dir({"XDG_RUNTIME_DIR": str(runtime)}, me)
    assert d == runtime / "gpuwarden" and d.stat().st_mode & 0o777 == 0o700
    # Another user's runtime dir (after su) and HOME (after sudo): nothing written there.
    (tmp_path / ".cache").mkdir()
    assert user_cache_dir({"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path)}, me + 1) is None
    cache = tmp_path / "cache"  # missing: made, in a directory of this user's
    assert user_cache_dir({"XDG_CACHE_HOME": str(cache)}, me) == cache / "gpuwarden"
    assert cache.stat().st_mode & 0o777 == 0o700
    (cache / "gpuwarden").chmod(0o755)  # opened up by someone: not trusted
    assert user_cache_dir({"XDG_CACHE_HOME": str(cache)}, me) is None
