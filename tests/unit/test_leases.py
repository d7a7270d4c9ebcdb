"""Leases: the pure accounting, and the file store with real files and real processes."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import gpuwarden
from gpuwarden.gpus.model import GpuFacts, GpuProcessFacts
from gpuwarden.leases import (
    ACTIVE,
    DEAD,
    EXPIRED,
    HELD,
    Lease,
    LeaseStore,
    account,
    lease_dir,
    lease_state,
    new_lease,
    pid_alive,
    pid_family,
)
from gpuwarden.observe.snapshot import RUNNING, GpuView, ProcessView
from gpuwarden.procs.model import ProcInfo

GiB = 1 << 30
SRC = str(Path(gpuwarden.__file__).resolve().parent.parent)


def view(uuid: str, procs: dict[int, int | None]) -> GpuView:
    facts = GpuFacts(
        index=int(uuid[-1]),
        uuid=uuid,
        name="g",
        memory_total=80 * GiB,
        memory_used=0,
        memory_free=80 * GiB,
    )
    return GpuView(
        facts,
        tuple(
            ProcessView(
                GpuProcessFacts(pid=pid, gpu_index=facts.index, memory=mem),
                ProcInfo(pid=pid, exists=True),
                RUNNING,
                0.0,
            )
            for pid, mem in procs.items()
        ),
    )


def lease(
    gpu: str = "GPU-0",
    nbytes: int = 10 * GiB,
    pid: int = 100,
    *,
    now: float = 1000.0,
    timeout: float = 60.0,
) -> Lease:
    return new_lease(gpu, nbytes, pid=pid, start_time=now - 5, now=now, timeout=timeout)


# --- pure accounting ---------------------------------------------------------------------


def test_lease_states() -> None:
    le = lease()
    assert lease_state(le, now=1010, alive=True, shown=0) == ACTIVE
    assert lease_state(le, now=1010, alive=True, shown=4 * GiB) == ACTIVE
    assert lease_state(le, now=1010, alive=True, shown=10 * GiB) == HELD
    assert lease_state(le, now=1060, alive=True, shown=0) == EXPIRED
    assert lease_state(le, now=1010, alive=False, shown=0) == DEAD


def test_outstanding_is_leased_minus_what_the_driver_shows() -> None:
    gpus = [view("GPU-0", {100: 4 * GiB, 999: 30 * GiB}), view("GPU-1", {})]
    leases = [
        lease("GPU-0", 10 * GiB, 100),
        lease("GPU-0", 3 * GiB, 200),
        lease("GPU-1", 5 * GiB, 100),
    ]
    acc = account(
        leases, gpus, now=1010, alive=lambda le: True, family=lambda pid: frozenset([pid])
    )
    assert acc.states == (ACTIVE, ACTIVE, ACTIVE)
    # 10 - 4 shown for pid 100, plus 3 for pid 200; pid 999 is nobody's lease.
    assert acc.outstanding == {"GPU-0": 9 * GiB, "GPU-1": 5 * GiB}


def test_stale_leases_do_not_count() -> None:
    gpus = [view("GPU-0", {100: 12 * GiB})]
    leases = [lease(pid=100), lease(pid=200), lease(pid=300, now=900)]
    acc = account(
        leases, gpus, now=1010, alive=lambda le: le.pid != 200, family=lambda pid: frozenset([pid])
    )
    assert acc.states == (HELD, DEAD, EXPIRED)
    assert acc.outstanding == {}


def test_memory_of_descendants_counts_for_the_lease() -> None:
    # A launcher (pid 100) whose worker (pid 101) holds the memory.
    gpus = [view("GPU-0", {101: 6 * GiB}), view("GPU-1", {102: 20 * GiB})]
    acc = account(
        [lease(pid=100), lease("GPU-1", pid=100)],
        gpus,
        now=1010,
        alive=lambda le: True,
        family=lambda pid: frozenset([pid, 101, 102]),
    )
    assert acc.states == (ACTIVE, HELD)
    assert acc.outstanding == {"GPU-0": 4 * GiB}


def test_withheld_process_memory_counts_as_nothing_shown() -> None:
    acc = account(
        [lease()],
        [view("GPU-0", {100: None})],
        now=1010,
        alive=lambda le: True,
        family=lambda pid: frozenset([pid]),
    )
    assert acc.outstanding == {"GPU-0": 10 * GiB}


def test_json_round_trip_and_validation() -> None:
    le = lease()
    assert Lease.from_json(json.loads(json.dumps(le.to_json()))) == le
    bad: object
    for bad in (
        [],
        {"gpu": "GPU-0"},
        {**le.to_json(), "bytes": -1},
        {**le.to_json(), "pid": "x"},
        {**le.to_json(), "pid": 0},
    ):
        with pytest.raises(ValueError):
            Lease.from_json(bad)


def test_lease_dir_resolution(tmp_path: Path) -> None:
    assert lease_dir(env={"GPUWARDEN_LEASE_DIR": str(tmp_path / "x"), "GPUWARDEN_HOME": "/h"}) == (
        tmp_path / "x",
        False,
    )
    assert lease_dir(tmp_path, env={"GPUWARDEN_HOME": "/h"}) == (Path("/h/leases"), False)
    assert lease_dir(tmp_path, env={}) == (tmp_path / "leases", False)
    root, shared = lease_dir(None, env={})
    assert shared and root.name == "gpuwarden-leases"
    assert str(root.parent) in ("/dev/shm", "/tmp")


# --- liveness ----------------------------------------------------------------------------


def _dead_process() -> tuple[int, float]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = psutil.Process(p.pid).create_time()
    p.kill()
    p.wait()
    return p.pid, start


def test_pid_alive_checks_start_time() -> None:
    me = psutil.Process()
    assert pid_alive(me.pid, me.create_time())
    assert not pid_alive(me.pid, me.create_time() - 100)  # a reused pid
    pid, start = _dead_process()
    assert not pid_alive(pid, start)


def test_pid_family_includes_children() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), p.pid} <= pid_family(os.getpid())
    finally:
        p.kill()
        p.wait()


# --- the file store ----------------------------------------------------------------------


def test_add_read_remove(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path / "leases")
    assert store.read() == {}  # no directory yet: no leases, no error
    with store.locked():
        path = store.add(lease())
    assert path.parent == tmp_path / "leases" and path.suffix == ".json"
    assert list(store.read().values()) == [lease()]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    store.remove(path)
    assert store.read() == {}


def test_garbage_is_removed_newer_schema_kept(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path)
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "partial.json").write_text(json.dumps({"gpu": "GPU-0"}))
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"version": 99, "anything": True}))
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / "link.json").symlink_to(tmp_path / "notes.txt")
    os.mkfifo(tmp_path / "fifo.json")
    assert store.read() == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "newer.json", "notes.txt"]


def test_prune_removes_dead_expired_and_held(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path)
    me = psutil.Process()
    now = time.time()
    dead_pid, dead_start = _dead_process()
    live = new_lease("GPU-0", 10 * GiB, pid=me.pid, start_time=me.create_time(), now=now)
    expired = new_lease("GPU-0", GiB, pid=me.pid, start_time=me.create_time(), now=now - 120)
    dead = new_lease("GPU-0", GiB, pid=dead_pid, start_time=dead_start, now=now)
    held = new_lease("GPU-1", 2 * GiB, pid=me.pid, start_time=me.create_time(), now=now)
    with store.locked():
        for le in (live, expired, dead, held):
            store.add(le)
        gpus = [view("GPU-0", {me.pid: GiB}), view("GPU-1", {me.pid: 2 * GiB})]
        acc = store.prune(gpus, now=now + 1)
    assert acc.outstanding == {"GPU-0": 9 * GiB}
    assert list(store.read().values()) == [live]


def test_shared_directory_is_sticky_and_world_writable(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    with LeaseStore(root, shared=True).locked() as store:
        store.add(lease())
    mode = stat.S_IMODE(os.stat(root).st_mode)
    assert mode == 0o1777
    assert stat.S_IMODE(os.stat(root / "lock").st_mode) & 0o044 == 0o044


def test_a_symlink_instead_of_the_directory_is_refused(tmp_path: Path) -> None:
    from gpuwarden.leases import LeaseError

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "shared").symlink_to(tmp_path / "elsewhere")
    with (
        pytest.raises(LeaseError, match="not a directory"),
        LeaseStore(tmp_path / "shared", shared=True).locked(),
    ):
        pass


def test_the_lock_excludes_another_process(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path)
    script = textwrap.dedent(f"""
        from pathlib import Path
        from gpuwarden.leases import LeaseStore
        with LeaseStore(Path({str(tmp_path)!r})).locked():
            print("got it", flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": SRC}
    with store.locked():
        child = subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
        )
        time.sleep(1.0)
        assert child.poll() is None  # blocked on our lock
    out, _ = child.communicate(timeout=30)
    assert out.strip() == "got it"
    # And the lock really is a flock on <dir>/lock.
    fd = os.open(tmp_path / "lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_concurrent_processes_never_pick_the_same_gpu(tmp_path: Path) -> None:
    # Each process: under the lock, read the leases, take the GPU nobody leased, then
    # linger before writing (to widen any race), the way `exec` reads, decides, writes.
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from gpuwarden.leases import LeaseStore, new_lease
        store = LeaseStore(Path({str(tmp_path)!r}))
        sys.stdin.readline()  # start together
        with store.locked():
            taken = {{le.gpu for le in store.read().values()}}
            gpu = next(g for g in ["GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-5"]
                       if g not in taken)
            time.sleep(0.05)
            store.add(new_lease(gpu, 1, pid=os.getpid(), start_time=0.0, now=time.time()))
        print(gpu)
    """)
    env = {**os.environ, "PYTHONPATH": SRC}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    time.sleep(0.5)  # let them all import
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    picks = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(picks) == [f"GPU-{i}" for i in range(6)]


def test_a_lease_file_nested_too_deeply_is_garbage_not_a_crash(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path)  # the shared directory: any local user writes here
    (tmp_path / "deep.json").write_text("[" * 30_000 + "]" * 30_000)
    with store.locked():
        store.add(lease())
    assert list(store.read().values()) == [lease()]
    assert not (tmp_path / "deep.json").exists()
