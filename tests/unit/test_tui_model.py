"""The pure model of ``gpuwarden top``: memory bar segments, GPU lines and table rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.observe.leaks import Leak, find_leaks
from gpuwarden.tui import model, table
from gpuwarden.tui.model import FOREIGN, FREE, JOB, LEAKED, Segment
from tests.helpers.builders import gpu, proc, snapshot

GiB = 1024**3
MiB = 1024**2
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def job_env(job: int) -> dict[str, str]:
    return {"GPUWARDEN_JOB": str(job)}


def daemon_job(jid: int, **kw: Any) -> dict[str, Any]:
    j: dict[str, Any] = {
        "id": jid,
        "user": "alice",
        "state": "running",
        "qos": "burstable",
        "gpus": [0],
        "command": ["python", "train.py"],
        "mem": 4 * GiB,
        "budget": 4 * GiB,
        "request": 4 * GiB,
        "mem_limit": None,
        "reason": None,
        "enforcement": {"limit": 4 * GiB},
        "events": [],
    }
    j.update(kw)
    return j


def unaccounted(gpu_index: int, memory: int) -> Leak:
    return Leak(
        gpu=gpu_index, kind="unaccounted", memory=memory, pid=None, user=None, evidence="test"
    )


# -- memory segments -------------------------------------------------------------------------


def test_segments_split_jobs_foreign_leaked_and_free() -> None:
    g_used = 2 * GiB + GiB + 3 * GiB + 300 * MiB + 500 * MiB
    snap = snapshot(
        [
            (
                gpu(0, used=g_used, total=40 * GiB),
                [
                    proc(10, memory=GiB, env=job_env(12)),
                    proc(11, memory=GiB, env=job_env(12)),
                    proc(20, memory=GiB, env=job_env(13)),
                    proc(30, memory=3 * GiB, user="bob"),
                    proc(40, memory=500 * MiB, exists=False),  # dead pid
                ],
            )
        ]
    )
    leaks = find_leaks([snap])
    assert {lk.kind for lk in leaks} >= {"dead_pid", "unaccounted"}
    segs = model.memory_segments(snap.gpus[0], leaks)
    assert segs == [
        Segment(JOB, 2 * GiB, 12),
        Segment(JOB, GiB, 13),
        Segment(FOREIGN, 3 * GiB),
        Segment(LEAKED, 800 * MiB),
        Segment(FREE, 40 * GiB - g_used),
    ]
    assert sum(s.bytes for s in segs) == 40 * GiB
    assert segs[0].style == "job:12" and segs[2].style == FOREIGN


def test_a_container_process_is_foreign_not_leaked() -> None:
    snap = snapshot(
        [
            (
                gpu(0, used=2 * GiB),
                [proc(88, memory=2 * GiB, exists=False, namespace_hint="container docker:abc")],
            )
        ]
    )
    leaks = find_leaks([snap])
    assert [lk.kind for lk in leaks] == ["other_namespace"]
    kinds = {s.kind: s.bytes for s in model.memory_segments(snap.gpus[0], leaks)}
    assert kinds[FOREIGN] == 2 * GiB and kinds[LEAKED] == 0


def test_segments_never_negative_when_processes_exceed_used() -> None:
    snap = snapshot([(gpu(0, used=GiB, total=4 * GiB), [proc(10, memory=3 * GiB, env=job_env(1))])])
    segs = model.memory_segments(snap.gpus[0], [])
    assert all(s.bytes >= 0 for s in segs)
    assert {s.kind: s.bytes for s in segs} == {JOB: 3 * GiB, FOREIGN: 0, LEAKED: 0, FREE: GiB}


def test_leaky_scenario_gpu1_leaks_unaccounted_plus_garbage_pid(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.observe.snapshot import take_snapshot

    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(tmp_path / "sim"))
    b = open_backend(str(EXAMPLES / "leaky-4gpu.json"))
    try:
        snap = take_snapshot(b, holders=False)
    finally:
        b.close()
    lines = model.gpu_lines(snap, find_leaks([snap]))
    by_index = {ln.index: ln for ln in lines}
    assert by_index[1].leaked == 300 * MiB + 512 * MiB  # residual + pid 4294967295
    assert by_index[0].leaked == 892 * MiB  # the dead pid
    assert by_index[3].leaked == 0
    assert by_index[3].name == "A100-SXM4-40GB" and by_index[3].numa_node == 1
    text = "".join(t for t, _ in model.render_gpu_lines(lines, 80)[1])
    assert "leak 812M" in text and "2.8G/40.0G" in text and "10%" in text and "N0" in text


# -- bar widths ------------------------------------------------------------------------------


def test_bar_widths_proportional_and_exact() -> None:
    assert model.bar_widths([50, 25, 25], 8) == [4, 2, 2]
    assert model.bar_widths([0, 0, 0], 10) == [0, 0, 10]
    assert model.bar_widths([], 10) == []
    # A tiny leak still shows, taken from the widest segment.
    assert model.bar_widths([1, 10_000], 20) == [1, 19]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=-10 * GiB, max_value=200 * GiB), min_size=1, max_size=12),
    st.integers(min_value=0, max_value=300),
)
def test_bar_widths_always_sum_to_the_width(values: list[int], width: int) -> None:
    cells = model.bar_widths(values, width)
    assert len(cells) == len(values)
    assert sum(cells) == width
    assert all(c >= 0 for c in cells)
    assert (
        all(c == 0 for v, c in zip(values, cells, strict=True) if v <= 0)
        or sum(max(v, 0) for v in values) == 0
    )
    nonzero = sum(1 for v in values if v > 0)
    if 0 < nonzero <= width // 2:
        assert all(c >= 1 for v, c in zip(values, cells, strict=True) if v > 0)


procs_strategy = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=80 * GiB),
        st.sampled_from([None, 1, 2, 3]),
        st.booleans(),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(min_value=0, max_value=160 * GiB),
    used=st.integers(min_value=0, max_value=200 * GiB),
    procs=procs_strategy,
    leak=st.integers(min_value=0, max_value=10 * GiB),
    width=st.integers(min_value=0, max_value=250),
)
def test_segments_and_lines_hold_for_any_figures(
    total: int, used: int, procs: list[tuple[int, int | None, bool]], leak: int, width: int
) -> None:
    views = [
        proc(100 + i, memory=mem, exists=alive, env=job_env(job) if job is not None else {})
        for i, (mem, job, alive) in enumerate(procs)
    ]
    snap = snapshot([(gpu(0, used=used, total=total), views)])
    leaks = [*find_leaks([snap]), unaccounted(0, leak)]
    segs = model.memory_segments(snap.gpus[0], leaks)
    assert all(s.bytes >= 0 for s in segs)
    assert [s.kind for s in segs][-3:] == [FOREIGN, LEAKED, FREE]
    assert sum(s.bytes for s in segs) >= total or sum(s.bytes for s in segs) >= used
    cells = model.bar_widths([s.bytes for s in segs], width)
    assert sum(cells) == width and all(c >= 0 for c in cells)
    for line in model.render_gpu_lines(model.gpu_lines(snap, leaks), width):
        assert sum(len(t) for t, _ in line) <= width
        if width >= 40:
            bar = [t for t, key in line if key.startswith("job:") or key in (FOREIGN, LEAKED, FREE)]
            assert len("".join(bar)) >= 4


def test_eight_gpus_fit_80_columns_one_line_each() -> None:
    gpus = [
        (
            replace(
                gpu(i, used=(i + 1) * 9 * GiB, utilization=i * 12, numa_node=i // 4),
                name="NVIDIA A100-SXM4-80GB",
            ),
            [proc(1000 + i, gpu_index=i, memory=9 * GiB, env=job_env(i))],
        )
        for i in range(8)
    ]
    snap = snapshot(gpus)
    lines = model.render_gpu_lines(model.gpu_lines(snap, [unaccounted(3, GiB)]), 80, selected=3)
    assert len(lines) == 8
    for line in lines:
        text = "".join(t for t, _ in line)
        assert len(text) <= 80 and "\n" not in text
        assert "A100-SXM4-80GB" in text
    assert lines[3][0] == ("▶", "mark")
    assert "leak 1.0G" in "".join(t for t, _ in lines[3])
    # The job's segment is styled by its id, so each job keeps its colour.
    assert any(key == "job:5" for _, key in lines[5])
    # Narrow: the name goes, the bar stays.
    narrow = model.render_gpu_lines(model.gpu_lines(snap), 50)
    assert all(len("".join(t for t, _ in ln)) <= 50 for ln in narrow)
    assert "A100" not in "".join(t for t, _ in narrow[0])


# -- rows ------------------------------------------------------------------------------------


def _machine() -> Any:
    return snapshot(
        [
            (
                gpu(0, used=10 * GiB),
                [proc(10, memory=5 * GiB, env=job_env(7)), proc(11, memory=GiB, user="bob")],
            ),
            (gpu(1, used=3 * GiB), [proc(20, gpu_index=1, memory=3 * GiB, user="carol")]),
        ]
    )


def test_rows_join_processes_to_jobs_and_list_queued_jobs() -> None:
    jobs = [
        daemon_job(7, qos="guaranteed"),
        daemon_job(
            8,
            state="queued",
            gpus=[],
            budget=None,
            mem=20 * GiB,
            request=20 * GiB,
            enforcement={"limit": None},
            reason="waiting for job 7",
            user="bob",
        ),
        daemon_job(
            9,
            state="queued",
            gpus=[],
            budget=None,
            mem=None,
            request=None,
            enforcement={},
            command=["python", "big.py"],
        ),
    ]
    rows = {r.key: r for r in model.build_rows(_machine(), jobs)}
    assert set(rows) == {"p:0:10", "p:0:11", "p:1:20", "j:8", "j:9"}
    r = rows["p:0:10"]
    assert (r.job, r.qos, r.budget, r.memory, r.state) == (
        7,
        "guaranteed",
        4 * GiB,
        5 * GiB,
        "running",
    )
    assert r.over_budget  # 5G used against a 4G limit
    q = rows["j:8"]
    assert (q.kind, q.pid, q.state, q.budget, q.gpus) == (
        model.QUEUED_JOB,
        None,
        "queued",
        20 * GiB,
        (),
    )
    assert "waiting for job 7" in q.command
    assert rows["j:9"].budget is None  # a whole GPU
    assert rows["p:0:11"].job is None and rows["p:0:11"].qos is None
    layout = table.table_layout(list(rows.values()), 80)
    cells = table.row_cells(q, layout)
    assert cells[3].strip() == "8" and cells[5].strip() == "-/20.0G"
    assert table.row_cells(rows["j:9"], layout)[5].strip() == "-/whole"
    assert table.row_cells(r, layout)[5].strip() == "5.0G/4.0G"


def test_a_pid_listed_several_times_on_a_gpu_gets_a_row_each() -> None:
    # NVML lists a garbage pid once per leaked context (seen on real leaky machines; the
    # benchmark's scenario has them): the table's row keys must stay unique.
    garbage = 2**31 - 1
    snap = snapshot(
        [
            (
                gpu(0, used=6 * GiB),
                [
                    proc(garbage, memory=GiB),
                    proc(garbage, memory=2 * GiB),
                    proc(garbage, memory=3 * GiB),
                    proc(5),
                ],
            )
        ]
    )
    rows = model.build_rows(snap, None)
    assert len({r.key for r in rows}) == len(rows) == 4
    assert sorted(r.memory or 0 for r in rows if r.pid == garbage) == [GiB, 2 * GiB, 3 * GiB]


def test_without_a_daemon_a_job_process_still_shows_its_job_id() -> None:
    rows = model.build_rows(_machine(), None)
    assert len(rows) == 3
    r = next(r for r in rows if r.pid == 10)
    assert r.job == 7 and r.budget is None and not r.over_budget and r.state == "running"


def test_sort_and_filter() -> None:
    rows = model.build_rows(_machine(), [daemon_job(8, state="queued", gpus=[], user="bob")])
    assert [r.pid for r in model.sort_rows(rows, "memory")] == [10, 20, 11, None]
    assert [r.pid for r in model.sort_rows(rows, "pid")] == [10, 11, 20, None]
    assert [r.user for r in model.sort_rows(rows, "user")] == ["alice", "bob", "bob", "carol"]
    assert [r.pid for r in model.sort_rows(rows, "gpu")] == [10, 11, 20, None]
    with pytest.raises(ValueError):
        model.sort_rows(rows, "colour")
    assert [r.key for r in model.filter_rows(rows, user="bob")] == ["p:0:11", "j:8"]
    assert [r.pid for r in model.filter_rows(rows, gpu=1)] == [20]
    assert model.filter_rows(rows, user="bob", gpu=1) == []
    assert model.filter_rows(rows) == rows


def test_table_layout_fills_the_width_and_truncates_the_command() -> None:
    long = proc(10, memory=GiB, command="python " + "x" * 200)
    rows = model.build_rows(snapshot([(gpu(0, used=GiB), [long])]), None)
    for width in (60, 80, 132):
        layout = table.table_layout(rows, width)
        cells = table.row_cells(rows[0], layout)
        assert [len(c) for c in cells] == [c.width for c in layout]
        assert sum(len(c) for c in cells) == width
        assert cells[-1].endswith("…")
        assert [len(h) for h in table.header_cells(layout)] == [c.width for c in layout]
    # A garbage pid is shown whole, not cut.
    rows = model.build_rows(snapshot([(gpu(0), [proc(4294967295, memory=GiB)])]), None)
    assert "4294967295" in table.row_cells(rows[0], table.table_layout(rows, 80))[1]


def test_details_of_a_process_and_of_a_job() -> None:
    snap = snapshot(
        [(gpu(0, used=GiB), [proc(10, memory=GiB, env=job_env(7), container="docker:abc")])]
    )
    facts = dict(model.process_details(snap, 0, 10))
    assert facts["pid"] == "10" and facts["gpuwarden job"] == "7"
    assert facts["container"] == "docker:abc" and facts["memory"] == "1024MiB"
    assert model.process_details(snap, 0, 99)[0][0] == "gone"
    j = daemon_job(
        7,
        events=[
            {"at": "2024-01-01T00:00:00", "kind": "placed", "detail": "GPU 0"},
            {"at": "2024-01-01T00:00:01", "kind": "started", "detail": None},
        ],
        priority=0,
        gpu_count=1,
        cwd="/tmp",
        submitted_at="2024-01-01T00:00:00",
    )
    lines = model.job_details(j)
    text = "\n".join(f"{k} {v}" for k, v in lines)
    assert "7  running  user alice" in text and "reserved 4096MiB" in text
    assert "placed  GPU 0" in text and "started" in text and "python train.py" in text
    assert "burstable, priority 0" in text
