from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.observe.leaks import KINDS, MiB, find_leaks
from gpuwarden.observe.snapshot import process_state
from gpuwarden.procs.model import ProcInfo
from tests.helpers.builders import GiB, gpu, holder, info, proc, snapshot


def test_process_states() -> None:
    assert process_state(info(10)) == "running"
    assert process_state(ProcInfo(pid=10, exists=False)) == "dead"
    assert (
        process_state(ProcInfo(pid=10, exists=False, namespace_hint="container x"))
        == "other_namespace"
    )
    assert process_state(ProcInfo(pid=0, exists=False, garbage=True)) == "garbage"
    assert process_state(info(10, status="zombie")) == "zombie"
    # Leaderless group, re-parented to init: orphan.
    assert (
        process_state(info(10, ppid=1, pgid=9, group_leader_alive=False, parent_pgid=1)) == "orphan"
    )
    # Re-parented to a subreaper (a different process group): still an orphan.
    assert (
        process_state(info(10, ppid=77, pgid=9, group_leader_alive=False, parent_pgid=77))
        == "orphan"
    )
    # A daemon that detached on purpose is its own group leader.
    assert process_state(info(10, ppid=1, pgid=10, parent_pgid=1)) == "running"
    # A worker whose parent lives in its group is not an orphan even if the leader died.
    assert (
        process_state(info(10, ppid=9, pgid=8, group_leader_alive=False, parent_pgid=8))
        == "running"
    )


def test_unaccounted_memory_needs_every_sample() -> None:
    def snap(used: int, t: float) -> object:
        return snapshot([(gpu(0, used=used), [proc(10, memory=GiB)])], taken_at=t)

    steady = [snap(GiB + 500 * MiB, t) for t in (0.0, 0.5, 1.0)]
    [leak] = find_leaks(steady)  # type: ignore[arg-type]
    assert leak.kind == "unaccounted" and leak.memory == 500 * MiB and leak.pid is None
    assert "3 of 3 samples" in leak.evidence

    blip = [snap(GiB + 500 * MiB, 0.0), snap(GiB, 0.5), snap(GiB + 500 * MiB, 1.0)]
    assert find_leaks(blip) == []  # type: ignore[arg-type]


def test_threshold_and_driver_baseline() -> None:
    s = snapshot([(gpu(0, used=GiB + 30 * MiB), [proc(10)])])
    assert find_leaks([s]) == []
    s = snapshot([(gpu(0, used=GiB + 200 * MiB, driver_baseline=150 * MiB), [proc(10)])])
    assert find_leaks([s]) == []
    assert find_leaks([s], threshold=10 * MiB)[0].memory == 50 * MiB


def test_unknown_process_memory_means_no_unaccounted_claim() -> None:
    s = snapshot([(gpu(0, used=10 * GiB), [proc(10, memory=None)])])
    assert find_leaks([s]) == []


def test_process_kinds_carry_evidence() -> None:
    s = snapshot(
        [
            (
                gpu(0, used=5 * GiB),
                [
                    proc(11, memory=GiB, exists=False),
                    proc(12, memory=GiB, exists=False, namespace_hint="container docker:abc"),
                    proc(2**32 - 1, memory=GiB, exists=False, garbage=True),
                    proc(14, memory=GiB, status="zombie", ppid=13),
                    proc(15, memory=GiB, ppid=1, pgid=9, group_leader_alive=False, parent_pgid=1),
                ],
            )
        ]
    )
    leaks = {lk.pid: lk for lk in find_leaks([s])}
    assert {p: lk.kind for p, lk in leaks.items()} == {
        11: "dead_pid",
        12: "other_namespace",
        2**32 - 1: "garbage_pid",
        14: "zombie",
        15: "orphan",
    }
    assert "docker:abc" in leaks[12].evidence
    assert "parent pid 13" in leaks[14].evidence
    assert leaks[14].parent == 13


def test_hidden_holders_and_monitors() -> None:
    s = snapshot(
        [(gpu(0), [proc(10)]), (gpu(1), [])],
        holders=[
            holder(10, ("/dev/nvidia0", "/dev/nvidiactl"), (0,)),  # listed: not hidden
            holder(20, ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"), (0, 1)),
            holder(30, ("/dev/nvidiactl",), ()),
        ],
    )
    got = sorted((lk.kind, lk.pid, lk.gpu) for lk in find_leaks([s]))
    assert got == [("hidden_holder", 20, 0), ("hidden_holder", 20, 1), ("monitor", 30, None)]


def test_a_holder_that_appears_once_is_not_reported() -> None:
    h = holder(20, ("/dev/nvidia0",), (0,))
    a = snapshot([(gpu(0), [])], holders=[h])
    b = snapshot([(gpu(0), [])])
    assert find_leaks([a, b]) == []
    assert len(find_leaks([a, a])) == 1


states = st.sampled_from(["running", "dead", "ns", "garbage", "zombie", "orphan"])


@given(
    st.lists(st.tuples(states, st.integers(min_value=0, max_value=8 * 1024)), max_size=12),
    st.integers(min_value=0, max_value=4 * 1024),
)
def test_leak_classification_is_total(procs: list[tuple[str, int]], extra_mib: int) -> None:
    """Every non-running process is exactly one leak; unaccounted is never negative."""
    views = []
    for i, (state, mib) in enumerate(procs):
        kw = {
            "running": {},
            "dead": {"exists": False},
            "ns": {"exists": False, "namespace_hint": "c"},
            "garbage": {"exists": False, "garbage": True},
            "zombie": {"status": "zombie"},
            "orphan": {"ppid": 1, "pgid": 1, "group_leader_alive": False, "parent_pgid": 1},
        }[state]
        views.append(proc(100 + i, memory=mib * MiB, **kw))
    used = sum(m for _, m in procs) * MiB + extra_mib * MiB
    leaks = find_leaks([snapshot([(gpu(0, used=used, total=2**40), views)])])
    per_pid = [lk for lk in leaks if lk.pid is not None]
    assert len(per_pid) == sum(1 for s, _ in procs if s != "running")
    assert all(lk.kind in KINDS for lk in leaks)
    unacc = [lk for lk in leaks if lk.kind == "unaccounted"]
    assert len(unacc) == (1 if extra_mib * MiB >= 64 * MiB else 0)
    assert all((lk.memory or 0) >= 0 for lk in leaks)


def test_nvml_only_holders_of_device_nodes_are_monitors() -> None:
    from dataclasses import replace

    nvml_only = replace(
        holder(40, ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"), (0,)), device_mapped=False
    )
    cuda = replace(
        holder(41, ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"), (0,)), device_mapped=True
    )
    unknown = holder(42, ("/dev/nvidia0",), (0,))
    s = snapshot([(gpu(0), [])], holders=[nvml_only, cuda, unknown])
    got = {lk.pid: lk for lk in find_leaks([s])}
    assert got[40].kind == "monitor" and "NVML only" in got[40].evidence
    assert got[41].kind == "hidden_holder" and "CUDA context" in got[41].evidence
    assert got[42].kind == "hidden_holder"


def test_dead_pid_names_the_hidden_holder_that_keeps_it_alive() -> None:
    from dataclasses import replace

    child = replace(holder(50, ("/dev/nvidia-uvm", "/dev/nvidia0"), (0,)), device_mapped=True)
    s = snapshot(
        [(gpu(0, used=2 * GiB), [proc(49, memory=2 * GiB, exists=False)])], holders=[child]
    )
    dead = next(lk for lk in find_leaks([s]) if lk.kind == "dead_pid")
    assert "pid 50 still holds" in dead.evidence
