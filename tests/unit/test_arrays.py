"""Job arrays: the ``--array`` grammar, job references (``3-7``, ``12_7``), the store's
one transaction for every task and its resolution of references, and the ``%N`` limit
as the scheduling pass applies it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuwarden.daemon.store import Store
from gpuwarden.errors import UsageError
from gpuwarden.jobs.arrays import MAX_TASKS, Array, Member, parse_array, parse_refs
from gpuwarden.jobs.model import QUEUED, RUNNING, Job, JobSpec
from gpuwarden.sched.arrays import throttle


def test_indices_ranges_steps_and_a_limit() -> None:
    assert parse_array("0-3") == Array((0, 1, 2, 3))
    assert parse_array("1,3,5-7%2") == Array((1, 3, 5, 6, 7), 2)
    assert parse_array("0-20:5") == Array((0, 5, 10, 15, 20))
    assert parse_array("7") == Array((7,))
    assert parse_array(f"0-{MAX_TASKS - 1}%8").limit == 8


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("", "give indices such as 0-99"),
        ("5-3", "'5-3' is not a range"),
        ("0-9%0", "%N needs N from 1"),
        ("0-9%x", "%N needs N from 1"),
        ("a-b", "'a' is not an index"),
        ("-1", "'' is not an index"),
        ("1,1", "index 1 is given twice"),
        ("3:2", "is not a range"),
        ("0-9:0", "is not a range"),
        (f"0-{MAX_TASKS}", f"more than {MAX_TASKS} tasks"),
        ("0-99999999", "is not an index"),
        ("٣", "is not an index"),  # a digit to str.isdigit, not to int() of ASCII
    ],
)
def test_a_bad_array_is_one_clear_error(spec: str, said: str) -> None:
    with pytest.raises(UsageError, match=None) as e:
        parse_array(spec)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_references() -> None:
    assert parse_refs(["3", "5,7-9", "12_7"]) == [3, 5, 7, 8, 9, (12, 7)]
    for bad in ("0", "x", "3-", "12_", "_7", "12_x", "9-3", "1-200000", "1_2_3"):
        with pytest.raises(UsageError):
            parse_refs([bad])


def spec(**kw: object) -> JobSpec:
    base = dict(user="alice", uid=1000, gid=1000, command=("true",), cwd="/tmp")
    return JobSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_an_array_is_stored_in_one_go_and_its_references_resolve(tmp_path: Path) -> None:
    with Store(tmp_path / "jobs.db") as store:
        before, _ = store.submit(spec(), 1.0)
        first, created = store.submit(spec(name="sweep"), 2.0, array=Array((0, 5, 9), 2))
        assert created and first.id == before.id + 1
        tasks = store.list(array=first.id)
        assert [(t.spec.array, t.spec.name) for t in tasks] == [
            (Member(first.id, i, 2), "sweep") for i in (0, 5, 9)
        ]
        a, ids = first.id, [t.id for t in tasks]
        # An array's id names each task; a task's own id names it alone.
        assert store.resolve([a]) == (ids, [])
        assert store.resolve([ids[1]]) == ([ids[1]], [])
        assert store.resolve([(a, 9), before.id]) == ([before.id, ids[2]], [])
        assert store.resolve([(a, 1), (before.id, 0), 10**6]) == (
            [],
            [(a, 1), (before.id, 0), 10**6],
        )
        assert store.get(before.id).spec.array is None


def _job(job_id: int, state: str, array: Member | None) -> Job:
    return Job(id=job_id, spec=spec(array=array), state=state, submitted_at=0.0)


def test_the_limit_counts_tasks_holding_gpus_and_those_placed_this_pass() -> None:
    m = Member(10, 0, 3)
    running = [_job(10, RUNNING, m), _job(11, RUNNING, dataclasses.replace(m, index=1))]
    ready = [_job(i, QUEUED, dataclasses.replace(m, index=i - 10)) for i in range(12, 16)]
    other = _job(20, QUEUED, None)
    unlimited = _job(21, QUEUED, Member(21, 0, None))
    allowed, waiting = throttle([*ready, other, unlimited], running)
    assert [j.id for j in allowed] == [12, 20, 21]  # 2 running + 1 more = 3
    assert waiting == {i: "array 10: 3 of at most 3 tasks running" for i in (13, 14, 15)}
    allowed, waiting = throttle(ready, [])
    assert [j.id for j in allowed] == [12, 13, 14] and set(waiting) == {15}
