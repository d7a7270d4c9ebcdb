"""The one table of job state changes: well formed, and enforced by the store, which
writes nothing for a change the table does not allow."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.service import JobService
from gpuwarden.daemon.store import Store
from gpuwarden.jobs import lifecycle as lc
from gpuwarden.jobs.lifecycle import IllegalTransition
from tests.unit.test_store import spec

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuwarden"


ALICE = Caller(pid=1, uid=1000, gid=1000, user="alice", groups=(1000,))


def _service(
    store: Store, tmp_path: Path, cancel_running: Callable[[Any, bool], None] = lambda j, k: None
) -> JobService:
    """The daemon's job service over ``store``, with no GPUs and a clock at 6.0."""
    return JobService(
        store,
        tmp_path / "jobs",
        Config(),
        wake=lambda: None,
        gpus=lambda: (),
        cancel_running=cancel_running,
        clock=lambda: 6.0,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_the_table_names_states_and_events_once() -> None:
    assert not set(lc.TRANSITIONS) & lc.NOTES and lc.SUBMITTED not in lc.TRANSITIONS
    for event, change in lc.TRANSITIONS.items():
        assert change.sources and change.sources <= set(lc.STATES), event
        assert change.target is None or change.target in lc.STATES, event
        assert not change.sources & lc.TERMINAL or change.target == lc.QUEUED, (
            f"{event}: only a retry brings an ended job back"
        )
    assert set(lc.STATES) >= lc.SUBMITTED_AS
    # Every state but the submitted ones is reached by some event; every active or
    # waiting state can be left.
    reached = {c.target for c in lc.TRANSITIONS.values()} | lc.SUBMITTED_AS
    assert reached >= set(lc.STATES)
    for state in set(lc.STATES) - lc.TERMINAL:
        assert any(
            state in c.sources and c.target not in (None, state) for c in lc.TRANSITIONS.values()
        ), state


def test_the_store_refuses_what_the_table_does_not_allow(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    events = len(store.get(job.id).events)
    for kind, froms, to in (
        ("placed", ("queued",), "running"),  # placed reserves
        ("started", ("queued",), "running"),  # only a reserved job
        ("bogus", ("queued",), "held"),
        ("oom", ("queued",), None),
    ):  # a note moves nothing
        with pytest.raises(IllegalTransition):
            store.transition(job.id, froms, to, now=2.0, kind=kind)
    with pytest.raises(IllegalTransition):
        store.add_event(job.id, "placed", "a state change is no note", 2.0)
    with pytest.raises(IllegalTransition):
        store.add_event(job.id, "whatever", None, 2.0)
    after = store.get(job.id)
    assert after.state == "queued" and len(after.events) == events  # nothing written
    store.transition(job.id, ("queued",), "reserved", now=3.0, kind="placed")
    store.add_event(job.id, "oom", "noted", 3.0)
    assert [e.kind for e in store.get(job.id).events][-2:] == ["placed", "oom"]


def _literal_kinds() -> set[str]:
    """The event kinds written as string literals in calls that record events."""
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "add_event" and len(node.args) > 1:
                arg: ast.expr | None = node.args[1]
            elif node.func.attr in ("transition", "close_hold"):
                arg = next((k.value for k in node.keywords if k.arg == "kind"), None)
            else:
                continue
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.IfExp):
                found |= {
                    a.value
                    for a in (arg.body, arg.orelse)
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                }
    return found


def test_every_event_the_code_writes_is_in_the_table() -> None:
    kinds = _literal_kinds()
    assert len(kinds) > 15  # the scan sees the daemon's calls
    assert kinds <= lc.EVENTS, kinds - lc.EVENTS


def test_a_retried_job_keeps_nothing_of_its_last_attempt(store: Store, tmp_path: Path) -> None:
    """``retry`` clears what ``model.FRESH_ATTEMPT`` names, as every requeue does: a
    watchdog's kill reason left behind would turn the next attempt's cancel into a
    failure for the old reason."""
    job, _ = store.submit(spec(uid=1000), 1.0)
    store.transition(
        job.id,
        ("queued",),
        "reserved",
        now=2.0,
        kind="placed",
        gpus=(0,),
        gpu_uuids=("GPU-0",),
        budget=1 << 30,
        cpu_set=(0, 1),
    )
    store.transition(job.id, ("reserved",), "running", now=3.0, kind="started", started_at=3.0)
    store.transition(
        job.id,
        ("running",),
        None,
        now=4.0,
        kind="killed_over_limit",
        kill_reason="killed: over its limit",
        preempting_at=4.0,
    )
    store.transition(
        job.id,
        ("running",),
        "failed",
        now=5.0,
        kind="failed",
        exit_code=-9,
        ended_at=5.0,
        reason="killed: over its limit",
    )
    service = _service(store, tmp_path)
    service.actions.retry(ALICE, job.id)
    again = store.get(job.id)
    assert again.state == "queued" and again.attempts == job.attempts + 1
    assert again.kill_reason is None and again.preempting_at is None
    assert again.gpus == () and again.cpu_set == () and again.budget is None
    assert again.exit_code is None and again.ended_at is None and again.reason is None


def test_a_cancel_that_loses_the_race_with_a_pass_still_cancels(
    store: Store, tmp_path: Path
) -> None:
    """A pass places the job between the cancel's read and its write: the job is read
    again and cancelled as the placed job it now is, not left to run with a 409."""
    asked: list[int] = []
    service = _service(store, tmp_path, cancel_running=lambda job, kill: asked.append(job.id))
    job, _ = store.submit(spec(uid=1000), 1.0)
    stale = store.get(job.id)  # what the cancel read: queued
    store.transition(
        job.id,
        ("queued",),
        "reserved",
        now=2.0,
        kind="placed",
        gpus=(0,),
        gpu_uuids=("GPU-0",),
        budget=1 << 30,
        supervisor_pid=4242,
    )
    service.actions._cancel(ALICE, stale, False)  # the write after the pass's
    assert stale.state == "queued" and asked == [job.id]  # its supervisor was asked
    assert "cancel_requested" in [e.kind for e in store.get(job.id).events]
