"""The pure GPU-selection policy: ranking, qualification, sets, and its reasons."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.cli.select import parse_mem
from gpuwarden.errors import UsageError
from gpuwarden.gpus.model import GpuFacts, GpuProcessFacts
from gpuwarden.observe.snapshot import RUNNING, GpuView, ProcessView
from gpuwarden.procs.model import ProcInfo
from gpuwarden.sched.select import Choice, Rejection, Request, assess, choose_gpus

GiB = 1 << 30


def gpu(
    index: int,
    free: float,
    *,
    total: float = 80,
    util: int | None = 0,
    mode: str | None = "Default",
    numa: int | None = 0,
    users: tuple[str, ...] = (),
    peers: tuple[int, ...] = (),
    mig: bool = False,
) -> GpuView:
    total_b, free_b = int(total * GiB), int(free * GiB)
    facts = GpuFacts(
        index=index,
        uuid=f"GPU-{index:04d}",
        name="Test GPU",
        memory_total=total_b,
        memory_used=total_b - free_b,
        memory_free=free_b,
        utilization=util,
        compute_mode=mode,
        numa_node=numa,
        cpus=str(index),
        nvlink_peers=peers,
        mig_mode=mig,
    )
    procs = tuple(
        ProcessView(
            GpuProcessFacts(pid=1000 + 10 * index + i, gpu_index=index, memory=GiB),
            ProcInfo(pid=1000 + 10 * index + i, exists=True, user=u),
            RUNNING,
            1.0,
        )
        for i, u in enumerate(users)
    )
    return GpuView(facts, procs)


def req(mem: float = 20, **kw: object) -> Request:
    return Request(memory=int(mem * GiB), **kw)  # type: ignore[arg-type]


def chosen(result: Choice | Rejection) -> tuple[int, ...]:
    assert isinstance(result, Choice), result
    return result.indices


# --- ranking -----------------------------------------------------------------------------


def test_most_free_memory_wins() -> None:
    gpus = [gpu(0, 30), gpu(1, 70), gpu(2, 50)]
    assert chosen(choose_gpus(gpus, req())) == (1,)


def test_ties_go_to_fewer_users_then_lower_index() -> None:
    gpus = [gpu(0, 50, users=("a", "b")), gpu(1, 50, users=("c",)), gpu(2, 50, users=("d",))]
    assert chosen(choose_gpus(gpus, req())) == (1,)
    # The same user twice is one distinct user.
    gpus = [gpu(0, 50, users=("a", "b")), gpu(1, 50, users=("a", "a"))]
    assert chosen(choose_gpus(gpus, req())) == (1,)


def test_leases_reduce_effective_free() -> None:
    gpus = [gpu(0, 70), gpu(1, 50)]
    assert chosen(choose_gpus(gpus, req(), {"GPU-0000": 30 * GiB})) == (1,)
    # Leased down below the request: GPU 0 does not qualify at all.
    result = choose_gpus([gpu(0, 70)], req(), {"GPU-0000": 60 * GiB})
    assert isinstance(result, Rejection) and not result.impossible
    assert "leased" in result.reason


def test_utilization_limit_and_unknown_utilization() -> None:
    gpus = [gpu(0, 70, util=80), gpu(1, 30, util=10), gpu(2, 20, util=None)]
    assert chosen(choose_gpus(gpus, req(max_util=30))) == (1,)
    assert chosen(choose_gpus(gpus, req(max_util=30, count=2))) == (1, 2)


@pytest.mark.parametrize(
    ("mode", "users", "ok"),
    [
        ("Default", ("a",), True),
        ("Prohibited", (), False),
        ("Exclusive_Process", (), True),
        ("Exclusive_Process", ("a",), False),
        ("Exclusive_Thread", (), True),
        (None, (), True),
    ],
)
def test_compute_modes(mode: str | None, users: tuple[str, ...], ok: bool) -> None:
    assert assess(gpu(0, 70, mode=mode, users=users), req()).qualifies is ok


def test_exclusive_gpu_with_a_lease_is_taken() -> None:
    c = assess(gpu(0, 70, mode="Exclusive_Process"), req(), leased=GiB)
    assert not c.qualifies and "Exclusive" in (c.reason or "")


def test_mig_enabled_gpu_is_skipped() -> None:
    assert not assess(gpu(0, 70, mig=True), req()).qualifies


def test_fraction_of_each_gpus_total() -> None:
    gpus = [gpu(0, 30, total=40), gpu(1, 45, total=80)]
    result = choose_gpus(gpus, Request(fraction=0.5))
    assert chosen(result) == (1,)
    assert isinstance(result, Choice) and result.gpus[0].need == 40 * GiB
    # GPU 0 needs only 20 of its 40 GiB: it qualifies too.
    assert chosen(choose_gpus(gpus, Request(fraction=0.5, count=2))) == (0, 1)


# --- impossible vs. not now --------------------------------------------------------------


def test_more_than_any_gpu_has_is_impossible() -> None:
    result = choose_gpus([gpu(0, 24, total=24), gpu(1, 24, total=24)], req(30))
    assert isinstance(result, Rejection) and result.impossible
    assert "more than any GPU" in result.reason


def test_more_gpus_than_exist_is_impossible() -> None:
    result = choose_gpus([gpu(0, 24), gpu(1, 24)], req(count=3))
    assert isinstance(result, Rejection) and result.impossible and "--count 3" in result.reason


def test_too_few_big_enough_gpus_is_impossible() -> None:
    gpus = [gpu(0, 24, total=24), gpu(1, 80, total=80)]
    result = choose_gpus(gpus, req(40, count=2))
    assert isinstance(result, Rejection) and result.impossible


def test_same_numa_impossible_when_no_node_has_enough_gpus() -> None:
    gpus = [gpu(0, 70, numa=0), gpu(1, 70, numa=1)]
    result = choose_gpus(gpus, req(count=2, same_numa=True))
    assert isinstance(result, Rejection) and result.impossible


def test_nothing_fits_now_names_every_gpu_and_why() -> None:
    gpus = [gpu(0, 10), gpu(1, 70, util=90), gpu(2, 70, mode="Prohibited")]
    result = choose_gpus(gpus, req(max_util=50))
    assert isinstance(result, Rejection) and not result.impossible
    assert result.reason.startswith("no GPU with 20.0GiB free at util ≤ 50%"), result.reason
    assert "GPU 0: 10.0GiB free < 20.0GiB" in result.reason
    assert "GPU 1: util 90% > 50%" in result.reason
    assert "GPU 2: compute mode Prohibited" in result.reason
    assert "\n" not in result.reason


def test_count_two_with_one_fitting_says_which() -> None:
    result = choose_gpus([gpu(0, 70), gpu(1, 10)], req(count=2))
    assert isinstance(result, Rejection) and not result.impossible
    assert "only GPU 0 fits" in result.reason and "GPU 1:" in result.reason


# --- sets --------------------------------------------------------------------------------


def test_sets_prefer_one_numa_node_over_more_free_memory() -> None:
    gpus = [gpu(0, 79, numa=0), gpu(1, 40, numa=0), gpu(2, 30, numa=0), gpu(3, 78, numa=1)]
    assert chosen(choose_gpus(gpus, req(count=2))) == (0, 1)


def test_sets_prefer_nvlink_peers_within_a_node() -> None:
    gpus = [gpu(0, 79, peers=(2,)), gpu(1, 79, peers=()), gpu(2, 60, peers=(0,))]
    assert chosen(choose_gpus(gpus, req(count=2))) == (0, 2)


def test_then_the_roomiest_set() -> None:
    gpus = [gpu(0, 79), gpu(1, 21), gpu(2, 60), gpu(3, 60)]
    assert chosen(choose_gpus(gpus, req(count=2))) == (0, 2)
    assert chosen(choose_gpus(gpus, req(count=3))) == (0, 2, 3)


def test_cross_node_set_only_without_same_numa() -> None:
    gpus = [gpu(0, 70, numa=0), gpu(1, 10, numa=0), gpu(2, 70, numa=1), gpu(3, 10, numa=1)]
    assert chosen(choose_gpus(gpus, req(count=2))) == (0, 2)
    result = choose_gpus(gpus, req(count=2, same_numa=True))
    assert isinstance(result, Rejection) and not result.impossible
    assert "one NUMA node" in result.reason


def test_many_gpus_take_the_greedy_path_and_stay_valid() -> None:
    gpus = [gpu(i, 20 + i, numa=i % 2) for i in range(32)]
    assert math.comb(16, 8) < 20_000 < math.comb(32, 8)
    result = choose_gpus(gpus, req(count=8))
    assert chosen(result) == (17, 19, 21, 23, 25, 27, 29, 31)


def test_cuda_visible_devices_rendering() -> None:
    result = choose_gpus([gpu(0, 70), gpu(1, 70)], req(count=2))
    assert isinstance(result, Choice)
    assert result.cuda_visible_devices() == "0,1"
    assert result.cuda_visible_devices(uuid=True) == "GPU-0000,GPU-0001"


def test_request_validation() -> None:
    with pytest.raises(ValueError):
        Request()
    with pytest.raises(ValueError):
        Request(memory=1, fraction=0.5)
    with pytest.raises(ValueError):
        Request(memory=1, count=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20G", (20 * GiB, None)),
        ("512MiB", (512 << 20, None)),
        ("0.5", (None, 0.5)),
        ("1.0", (None, 1.0)),
        ("4096B", (4096, None)),
    ],
)
def test_parse_mem(text: str, expected: tuple[int | None, float | None]) -> None:
    assert parse_mem(text) == expected


@pytest.mark.parametrize("text", ["12X", "-1G", "0", "20", "0.0", "1.5", "", "G", "nan"])
def test_parse_mem_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--mem"):
        parse_mem(text)


# --- properties --------------------------------------------------------------------------


@st.composite
def machines(draw: st.DrawFn) -> tuple[list[GpuView], dict[str, int]]:
    n = draw(st.integers(1, 8))
    gpus = []
    leased: dict[str, int] = {}
    for i in range(n):
        total = draw(st.sampled_from([16, 24, 40, 80]))
        free = draw(st.integers(0, total))
        gpus.append(
            gpu(
                i,
                free,
                total=total,
                util=draw(st.one_of(st.none(), st.integers(0, 100))),
                mode=draw(
                    st.sampled_from(["Default", "Default", "Exclusive_Process", "Prohibited"])
                ),
                numa=draw(st.one_of(st.none(), st.integers(0, 2))),
                users=tuple(draw(st.lists(st.sampled_from("abc"), max_size=2))),
                peers=tuple(draw(st.sets(st.integers(0, n - 1)))),
            )
        )
        if draw(st.booleans()):
            leased[f"GPU-{i:04d}"] = draw(st.integers(0, 40)) * GiB
    return gpus, leased


requests = st.builds(
    lambda mem, frac, use_frac, count, util, same: Request(
        memory=None if use_frac else mem * GiB,
        fraction=frac if use_frac else None,
        count=count,
        max_util=util,
        same_numa=same,
    ),
    st.integers(1, 90),
    st.sampled_from([0.1, 0.25, 0.5, 1.0]),
    st.booleans(),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(0, 100)),
    st.booleans(),
)


def _qualifies(g: GpuView, r: Request, leased: int) -> bool:
    f = g.facts
    need = r.need(f.memory_total)
    return (
        max(f.memory_free - leased, 0) >= need
        and need <= f.memory_total
        and f.compute_mode != "Prohibited"
        and not (f.compute_mode == "Exclusive_Process" and (g.processes or leased))
        and (r.max_util is None or f.utilization is None or f.utilization <= r.max_util)
    )


@settings(max_examples=400, deadline=None)
@given(machines(), requests)
def test_choice_properties(machine: tuple[list[GpuView], dict[str, int]], r: Request) -> None:
    gpus, leased = machine
    result = choose_gpus(gpus, r, leased)
    by_index = {g.index: g for g in gpus}
    ok = [g for g in gpus if _qualifies(g, r, leased.get(g.facts.uuid, 0))]
    if isinstance(result, Choice):
        assert len(result.gpus) == r.count == len(set(result.indices))
        for c in result.gpus:
            g = by_index[c.index]
            assert _qualifies(g, r, leased.get(g.facts.uuid, 0))
            assert g.facts.memory_free - leased.get(g.facts.uuid, 0) >= c.need
        if r.same_numa:
            assert len({c.numa_node for c in result.gpus}) == 1
        # Never a set worse on NUMA spread than a qualifying one-node set.
        nodes: dict[int | None, list[GpuView]] = {}
        for g in ok:
            nodes.setdefault(g.facts.numa_node, []).append(g)
        if any(len(v) >= r.count for v in nodes.values()):
            assert len({c.numa_node for c in result.gpus}) == 1
    else:
        assert result.reason and "\n" not in result.reason
        if not result.impossible:
            # Nothing fits really means it: too few qualify (on one node, if required).
            if r.same_numa:
                groups: dict[int | None, int] = {}
                for g in ok:
                    groups[g.facts.numa_node] = groups.get(g.facts.numa_node, 0) + 1
                assert max(groups.values(), default=0) < r.count
            else:
                assert len(ok) < r.count
        else:
            big = [g for g in gpus if r.need(g.facts.memory_total) <= g.facts.memory_total]
            assert len(big) < r.count or r.same_numa


@settings(max_examples=200, deadline=None)
@given(machines(), st.integers(1, 90))
def test_single_gpu_choice_is_the_best_ranked(
    machine: tuple[list[GpuView], dict[str, int]], mem: int
) -> None:
    gpus, leased = machine
    r = Request(memory=mem * GiB)
    result = choose_gpus(gpus, r, leased)
    ok = [g for g in gpus if _qualifies(g, r, leased.get(g.facts.uuid, 0))]
    if not ok:
        assert isinstance(result, Rejection)
        return
    # No other user's processes first (then the fewest: with no user given, every user is
    # another), then the most free memory, then the lower index.
    best = min(
        ok,
        key=lambda g: (
            len(g.users),
            -max(g.facts.memory_free - leased.get(g.facts.uuid, 0), 0),
            g.index,
        ),
    )
    assert chosen(result) == (best.index,)
