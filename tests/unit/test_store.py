"""The job store: real SQLite files, real threads and processes, no mocks."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from gpuwarden.client.paths import Paths, resolve_paths
from gpuwarden.daemon.jobjson import job_json
from gpuwarden.daemon.schema import KEY_RELEASED, MIGRATIONS, SCHEMA_VERSION
from gpuwarden.daemon.sql.job_changes import TRANSITION_FIELDS
from gpuwarden.daemon.store import Store
from gpuwarden.daemon.store_errors import (
    Conflict,
    DependencyNotFound,
    JobNotFound,
    SchemaTooNew,
    StoreError,
)
from gpuwarden.errors import GpuwardenError, UsageError
from gpuwarden.jobs import model
from gpuwarden.jobs.arrays import Array, Member
from gpuwarden.jobs.lifecycle import TRANSITIONS, IllegalTransition
from gpuwarden.jobs.model import (
    CANCELLED,
    FAILED,
    HELD,
    INFEASIBLE,
    QUEUED,
    RESERVED,
    RUNNING,
    STATES,
    SUCCEEDED,
    TERMINAL,
    JobSpec,
)
from gpuwarden.jobs.request import OPTION_FIELDS
from gpuwarden.jobs.services import Service
from gpuwarden.procs.identity import boot_id
from tests.helpers.builders import move, non_default

GiB = 1 << 30


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(command=("python", "train.py"), user="alice", uid=1000, gid=1000)
    base.update(kw)
    return JobSpec(**base)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def version(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT version FROM schema_version").fetchone()[0])


# --------------------------------------------------------------------------- round trip


def test_every_spec_field_round_trips(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with Store(db) as s:
        dep1, _ = s.submit(spec(), 1.0)
        dep2, _ = s.submit(spec(), 2.0)
        full = JobSpec(
            command=("python", "-c", "print('ü ✓')", "--flag=a b", ""),
            user="bob",
            uid=1234,
            gid=2345,
            groups=(2345, 27, 100),
            cwd="/home/bob/proj dir",
            env={"PATH": "/usr/bin", "X": "multi\nline=ü", "E": ""},
            name="train-ü",
            group="sweep-7",
            key="run-42",
            mem=14 * GiB,
            gpus=3,
            gpu_ids=(0, 2, 5),
            after=(dep1.id, dep2.id),
            timeout=3600.5,
            exclusive=True,
            after_any=(dep2.id,),
            after_fail=(dep1.id,),
            priority=-7,
            requeue_on_reboot=True,
            qos="guaranteed",
            mem_limit=20 * GiB,
            grace=2.5,
            no_requeue=True,
            retries=3,
            checkpoint=True,
            mps=True,
            sm_percent=50,
            mem_auto=True,
            cpus=4,
            no_numa=True,
            mig="3g.40gb",
            attach="ray job raysubmit_ü",
            service=Service(
                restart="always",
                limit=3,
                window=120.5,
                health_cmd="curl -f ü",
                health_url=None,
                health_interval=5.5,
                health_grace=0.0,
            ),
            notify="notify-send 'job ü' \"$(jq -r .state)\"",
            array=Member(0, 4, 2),
            # the options document's fields, whatever they are
            **{
                f.name: tuple(v) if isinstance(v := non_default(f), list) else v
                for f in OPTION_FIELDS
            },
        )  # the array's id is the store's: set below
        # Every field differs from its default, so none can silently fall back to it.
        default = JobSpec(command=(), user="", uid=0, gid=0)
        for f in dataclasses.fields(JobSpec):
            assert getattr(full, f.name) != getattr(default, f.name), f.name
        job, created = s.submit(
            dataclasses.replace(full, array=None), 1700000000.25, array=Array((4,), 2)
        )
        full = dataclasses.replace(full, array=Member(job.id, 4, 2))
        assert created
        assert job.spec == full
        assert job.state == QUEUED
        assert job.submitted_at == 1700000000.25
    with Store(db) as s:  # and from a fresh connection, off the disk
        again = s.get(job.id)
    assert again.spec == full
    assert again == job
    assert again.spec.gpu_ids == (0, 2, 5) and isinstance(again.spec.groups, tuple)


def test_unrestricted_gpu_ids_stay_none(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    assert store.get(job.id).spec.gpu_ids is None
    assert store.get(job.id).spec.mem is None


def test_every_transition_field_round_trips(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    values: dict[str, Any] = dict(
        started_at=10.5,
        ended_at=20.25,
        gpus=(1, 3),
        gpu_uuids=("GPU-a", "GPU-b"),
        budget=14 * GiB,
        exit_code=137,
        reason="killed: out of memory",
        supervisor_pid=4242,
        supervisor_start=123456.78,
        boot_id="b00t",
        attempts=2,
        peak_memory=13 * GiB,
        preempting_at=15.5,
        preemptions=1,
        oom_retries=2,
        retry_mem=17 * GiB,
        retry_ceiling=34 * GiB,
        ceiling_until=99.5,
        not_before=30.5,
        kill_reason="over its limit",
        cpu_set=(2, 3),
        oom_tried=6 * GiB,
        oom_need=10 * GiB,
        context=676 << 20,
        restarts=4,
        health_failures=2,
    )
    assert set(values) == TRANSITION_FIELDS
    with Store(db) as s:
        job, _ = s.submit(spec(), 1.0)
        move(s, job.id, RUNNING, 2.0)
        moved = s.transition(
            job.id, RUNNING, FAILED, now=21.0, kind="failed", detail="exit 137", **values
        )
    with Store(db) as s:
        got = s.get(job.id)
    assert got == moved
    for name, value in values.items():
        assert getattr(got, name) == value, name
    assert got.state == FAILED
    assert [(e.kind, e.detail) for e in got.events] == [
        ("submitted", None),
        ("placed", None),
        ("started", None),
        ("failed", "exit 137"),
    ]


def test_to_json_shape(store: Store) -> None:
    job, _ = store.submit(spec(name="t", mem=2 * GiB), 1700000000.0)
    job = store.transition(
        job.id,
        QUEUED,
        RESERVED,
        now=1700000001.0,
        kind="placed",
        detail="GPU 1",
        gpus=(1,),
        budget=2 * GiB,
    )
    job = store.transition(
        job.id, RESERVED, RUNNING, now=1700000002.0, kind="started", started_at=1700000002.0
    )
    store.set_peak(job.id, GiB)
    job = store.transition(
        job.id,
        RUNNING,
        SUCCEEDED,
        now=1700000003.5,
        kind="succeeded",
        exit_code=0,
        ended_at=1700000003.5,
    )
    out = job_json(store.get(job.id))
    required = {
        "id",
        "user",
        "name",
        "state",
        "command",
        "gpus",
        "mem",
        "peak_memory",
        "exit_code",
        "submitted_at",
        "started_at",
        "ended_at",
        "reason",
        "events",
    }
    assert required <= set(out)
    assert out["id"] == job.id and out["user"] == "alice" and out["name"] == "t"
    assert out["state"] == "succeeded"
    assert out["command"] == ["python", "train.py"]
    assert out["gpus"] == [1]
    assert out["mem"] == 2 * GiB and out["peak_memory"] == GiB
    assert out["exit_code"] == 0 and out["reason"] is None
    for key in ("submitted_at", "started_at", "ended_at"):
        assert datetime.fromisoformat(out[key]).timestamp() > 0, key
    assert out["ended_at"].startswith("2023-11-14T22:13:23.500")
    assert [set(e) for e in out["events"]] == [{"at", "kind", "detail"}] * 4
    assert [e["kind"] for e in out["events"]] == ["submitted", "placed", "started", "succeeded"]
    assert out["events"][1]["detail"] == "GPU 1"
    assert "env" not in out


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize("state", [QUEUED, HELD, RESERVED, RUNNING, SUCCEEDED])
def test_key_returns_the_existing_job(store: Store, state: str) -> None:
    job, created = store.submit(spec(key="k"), 1.0)
    assert created
    if state != QUEUED:
        job = move(store, job.id, state, 2.0)
    events_before = len(store.get(job.id).events)
    again, created = store.submit(spec(key="k", command=("other",)), 3.0)
    assert not created
    assert again.id == job.id and again.state == state
    assert again.spec.command == ("python", "train.py")
    assert len(store.get(job.id).events) == events_before  # nothing written
    assert len(store.list()) == 1


@pytest.mark.parametrize("state", sorted(KEY_RELEASED))
def test_finished_without_success_releases_the_key(store: Store, state: str) -> None:
    assert {FAILED, CANCELLED, INFEASIBLE} == KEY_RELEASED
    old, _ = store.submit(spec(key="k"), 1.0)
    move(store, old.id, state, 2.0)
    new, created = store.submit(spec(key="k"), 3.0)
    assert created and new.id != old.id
    assert store.submit(spec(key="k"), 4.0) == (new, False)
    # The old one cannot come back while the new one holds the key ...
    with pytest.raises(Conflict, match="key"):
        store.transition(old.id, state, QUEUED, now=5.0, kind="retried")
    assert store.get(old.id).state == state
    # ... but can once the new one released it.
    store.transition(new.id, QUEUED, CANCELLED, now=6.0, kind="cancelled")
    assert store.transition(old.id, state, QUEUED, now=7.0, kind="retried").state == QUEUED
    assert store.audit() == []


def test_keys_are_per_user(store: Store) -> None:
    a, _ = store.submit(spec(key="k"), 1.0)
    b, created = store.submit(spec(key="k", user="bob", uid=1001), 2.0)
    assert created and a.id != b.id
    c, created = store.submit(spec(key=None), 3.0)
    d, created2 = store.submit(spec(key=None), 4.0)
    assert created and created2 and c.id != d.id


# --------------------------------------------------------------------------- transitions


def test_compare_and_set(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    moved = store.transition(
        job.id, QUEUED, RESERVED, now=2.0, kind="placed", gpus=(0,), budget=GiB
    )
    assert moved.state == RESERVED and moved.gpus == (0,) and moved.budget == GiB
    with pytest.raises(Conflict) as err:
        store.transition(job.id, QUEUED, RESERVED, now=3.0, kind="placed", gpus=(1,))
    assert err.value.state == RESERVED and err.value.job_id == job.id
    assert "is reserved, not queued" in str(err.value)
    assert isinstance(err.value, GpuwardenError)
    after = store.get(job.id)
    assert after == moved  # nothing changed, no event appended
    assert len(after.events) == 2


def test_transition_errors(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    with pytest.raises(JobNotFound) as err:
        store.transition(job.id + 1, QUEUED, RESERVED, now=2.0, kind="placed")
    assert err.value.exit_code == 2 and isinstance(err.value, UsageError)
    with pytest.raises(TypeError, match="state"):
        store.transition(job.id, QUEUED, RESERVED, now=2.0, kind="placed", state="running")
    with pytest.raises(TypeError, match="user"):
        store.transition(job.id, QUEUED, RESERVED, now=2.0, kind="placed", user="root")
    with pytest.raises(ValueError, match="bogus"):
        store.transition(job.id, QUEUED, "bogus", now=2.0, kind="placed")
    with pytest.raises(ValueError, match="bogus"):
        store.transition(job.id, ("bogus",), RESERVED, now=2.0, kind="placed")
    with pytest.raises(TypeError, match="gpus"):
        store.transition(job.id, QUEUED, RESERVED, now=2.0, kind="placed", gpus=3)
    assert store.get(job.id).state == QUEUED and store.audit() == []
    # Fields not given keep their value; None clears.
    store.transition(job.id, QUEUED, HELD, now=3.0, kind="held", reason="held by alice")
    store.add_event(job.id, "edited", "a note", 3.5)
    assert store.get(job.id).reason == "held by alice"
    assert (
        store.transition(job.id, HELD, QUEUED, now=4.0, kind="released", reason=None).reason is None
    )
    assert store.transitions(job.id) == [(None, QUEUED), (QUEUED, HELD), (HELD, QUEUED)]


def test_get_and_unknown_ids(store: Store) -> None:
    with pytest.raises(JobNotFound, match="no job 7"):
        store.get(7)
    with pytest.raises(JobNotFound):
        store.get(1 << 70)  # out of SQLite's range: still just "no such job"
    with pytest.raises(JobNotFound):
        store.add_event(3, "edited", None, 1.0)
    with pytest.raises(JobNotFound):
        store.set_peak(3, 5)
    assert store.set_reason(3, "x", 1.0) is False


def test_dependencies_must_exist(store: Store) -> None:
    dep, _ = store.submit(spec(), 1.0)
    with pytest.raises(DependencyNotFound, match="job 99") as err:
        store.submit(spec(after=(dep.id, 99)), 2.0)
    assert err.value.missing == (99,) and err.value.exit_code == 2
    assert [j.id for j in store.list()] == [dep.id]  # nothing stored
    job, created = store.submit(spec(after=(dep.id,)), 3.0)
    assert created and job.spec.after == (dep.id,)


def test_bad_specs_are_usage_errors(store: Store) -> None:
    with pytest.raises(UsageError, match="command"):
        store.submit(spec(command=()), 1.0)
    with pytest.raises(UsageError, match="range"):
        store.submit(spec(mem=1 << 80), 1.0)
    with pytest.raises(UsageError, match="UTF-8"):
        store.submit(spec(cwd="/bad\udcff"), 1.0)
    # The environment is JSON: even undecodable bytes (as surrogates) round-trip.
    job, _ = store.submit(spec(env={"WEIRD": "a\udcffb"}), 1.0)
    assert store.get(job.id).spec.env == {"WEIRD": "a\udcffb"}
    with pytest.raises(ValueError):
        store.submit(spec(), 1.0, state=RUNNING)


def test_submit_as_infeasible_or_held(store: Store) -> None:
    job, _ = store.submit(
        spec(), 1.0, state=INFEASIBLE, reason="needs 200 GiB; largest GPU has 141 GiB"
    )
    assert job.state == INFEASIBLE and job.reason.startswith("needs 200")  # type: ignore[union-attr]
    assert job.events[0].kind == "submitted" and job.events[0].detail == job.reason
    held, _ = store.submit(spec(), 2.0, state=HELD)
    assert held.state == HELD and store.audit() == []


def test_list_filters_and_order(store: Store) -> None:
    ids = []
    for i in range(6):
        job, _ = store.submit(
            spec(user="alice" if i % 2 else "bob", uid=1000 + i % 2, group="g" if i < 3 else None),
            float(i),
        )
        ids.append(job.id)
    move(store, ids[0], RESERVED, 9.0)
    move(store, ids[5], RUNNING, 9.0)
    assert [j.id for j in store.list()] == ids
    assert [j.id for j in store.list(states=[RESERVED, RUNNING])] == [ids[0], ids[5]]
    assert [j.id for j in store.active()] == [ids[0], ids[5]]
    assert [j.id for j in store.list(user="alice")] == [ids[1], ids[3], ids[5]]
    assert [j.id for j in store.list(group="g")] == ids[:3]
    assert [j.id for j in store.list(ids=[ids[4], ids[2], 999])] == [ids[2], ids[4]]
    assert [j.id for j in store.list(limit=2)] == ids[:2]
    assert [j.id for j in store.list(states=[QUEUED], user="bob", group="g")] == [ids[2]]
    assert store.list(ids=[]) == []
    assert all(j.events == () for j in store.list(with_events=False))
    assert all(len(j.events) >= 1 for j in store.list())
    with pytest.raises(ValueError):
        store.list(states=["nope"])
    counts = store.counts()
    assert counts[QUEUED] == 4 and counts[RESERVED] == 1 and counts[RUNNING] == 1
    assert set(counts) == set(STATES)


def test_the_history_takes_only_the_events_the_lifecycle_names(store: Store) -> None:
    """Every event goes through one writer, which refuses a kind jobs/lifecycle.py does
    not name; nothing is written then."""
    from gpuwarden.daemon.sql import events

    job, _ = store.submit(spec(), 1.0)
    with store._tx(write=True) as conn:
        with pytest.raises(ValueError, match="not an event"):
            events.append(conn, job.id, 2.0, "memory_retuned", None)
        events.append(conn, job.id, 2.0, "memory_returned", "back")
    assert [e.kind for e in store.get(job.id).events] == ["submitted", "memory_returned"]


def test_a_listing_decodes_its_rows_after_letting_go_of_the_store(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of 1,000 jobs took 30 ms to decode; under the store's lock that delayed
    every submit behind each listing (a listing loop of one user held another's submit
    past 1 s)."""
    from gpuwarden.daemon.sql import job_queries

    for i in range(3):
        store.submit(spec(), float(i))
    decode, held = job_queries.row_to_job, []

    def watched(*args: Any) -> model.Job:
        held.append(store._lock.locked())
        return decode(*args)

    monkeypatch.setattr(job_queries, "row_to_job", watched)
    assert len(store.list()) == 3 and held == [False] * 3


def test_a_listing_without_environments_reads_them_from_no_row(store: Store) -> None:
    """The pass lists queued jobs without their environments (kilobytes each); a job so
    listed refuses to be read for one, and every other field is the full listing's."""
    env = {f"VAR{i}": "x" * 100 for i in range(30)}
    job, _ = store.submit(spec(env=env, name="n", mem=3 << 30), 1.0)
    light, full = store.list(with_env=False)[0], store.list()[0]
    assert full.spec.env == env and store.get(job.id).spec.env == env
    with pytest.raises(RuntimeError, match="without its environment"):
        dict(light.spec.env)
    with pytest.raises(RuntimeError):
        light.spec.env.get("VAR1")
    assert dataclasses.replace(light.spec, env=env) == full.spec
    assert light.events == full.events and job_json(light) == job_json(full)
    # a transition reads the whole job again: what a launch starts from
    moved = store.transition(light.id, QUEUED, RESERVED, now=2.0, kind="placed")
    assert moved.spec.env == env


def test_a_second_store_in_the_process_keeps_the_first_ones_locks(tmp_path: Path) -> None:
    """The daemon opens the database twice (its pass and its web threads). Opening the
    file outside SQLite and closing it would drop every POSIX lock the process holds on
    it; the next process to close a connection would then think itself the last one,
    checkpoint and delete the WAL under the daemon, whose later commits nobody else
    would see, and that a crash would lose."""
    path = tmp_path / "state.db"
    first = Store(path)
    first.submit(spec(name="one"), 1.0)
    second = Store(path)
    reader = [
        sys.executable,
        "-c",
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM jobs').fetchone()[0]); c.close()",
        str(path),
    ]
    try:
        assert (
            subprocess.run(reader, capture_output=True, text=True, check=True).stdout.strip() == "1"
        )
        first.submit(spec(name="two"), 2.0)
        assert (
            subprocess.run(reader, capture_output=True, text=True, check=True).stdout.strip() == "2"
        )
        assert [j.spec.name for j in second.list()] == ["one", "two"]
    finally:
        second.close()
        first.close()


def test_events_are_ordered_and_notes_change_no_state(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    store.add_event(job.id, "edited", "first", 5.0)
    store.add_event(job.id, "edited", "second", 4.0)  # order of writing, not of clock
    store.transition(job.id, QUEUED, RESERVED, now=6.0, kind="placed")
    got = store.get(job.id)
    assert [e.detail for e in got.events] == [None, "first", "second", None]
    assert got.state == RESERVED and store.audit() == []


def test_peak_only_grows(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    assert store.set_peak(job.id, 5 * GiB) is True
    assert store.set_peak(job.id, 3 * GiB) is False
    assert store.set_peak(job.id, 5 * GiB) is False
    assert store.set_peak(job.id, 6 * GiB) is True
    got = store.get(job.id)
    assert got.peak_memory == 6 * GiB and len(got.events) == 1


def test_reason_written_only_when_changed(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    assert store.set_reason(job.id, "no GPU has 14 GiB free", 2.0) is True
    assert store.set_reason(job.id, "no GPU has 14 GiB free", 3.0) is False
    assert store.set_reason(job.id, "waiting for job 3", 4.0) is True
    assert store.set_reason(job.id, "waiting for job 3") is False
    assert store.set_reason(job.id, "silent") is True  # without a clock: no event
    got = store.get(job.id)
    assert got.reason == "silent"
    assert [(e.kind, e.detail) for e in got.events] == [
        ("submitted", None),
        ("waiting", "no GPU has 14 GiB free"),
        ("waiting", "waiting for job 3"),
    ]
    move(store, job.id, RUNNING, 5.0, reason=None)
    assert store.set_reason(job.id, "late scheduler pass", 6.0) is False
    assert store.get(job.id).reason is None


def test_delete_only_finished(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    with pytest.raises(Conflict, match="only finished"):
        store.delete(job.id)
    move(store, job.id, SUCCEEDED, 2.0, ended_at=2.0)
    child, _ = store.submit(spec(after=(job.id,)), 3.0)
    with pytest.raises(Conflict, match="dependency"):
        store.delete(job.id)
    store.transition(child.id, QUEUED, CANCELLED, now=4.0, kind="cancelled")
    gone = store.delete(job.id)
    assert gone.id == job.id and gone.state == SUCCEEDED
    with pytest.raises(JobNotFound):
        store.get(job.id)
    with pytest.raises(JobNotFound):
        store.delete(job.id)
    with closing(sqlite3.connect(store.path)) as conn:  # events went with it
        assert (
            conn.execute("SELECT count(*) FROM events WHERE job_id = ?", (job.id,)).fetchone()[0]
            == 0
        )
    # Ids are never reused, even for the highest one.
    store.delete(child.id)
    new, _ = store.submit(spec(), 5.0)
    assert new.id > child.id


def test_clean(store: Store) -> None:
    def finished(user: str, ended: float, state: str = SUCCEEDED) -> int:
        job, _ = store.submit(spec(user=user), 0.0)
        move(store, job.id, state, ended, ended_at=ended)
        return job.id

    old_a = finished("alice", 100.0)
    old_b = finished("bob", 100.0, FAILED)
    new_a = finished("alice", 950.0)
    needed = finished("alice", 100.0)
    waiting, _ = store.submit(spec(after=(needed,)), 1.0)
    live, _ = store.submit(spec(), 0.0)
    assert store.clean(300, 1000.0, user="alice") == 1
    assert {j.id for j in store.list()} == {old_b, new_a, needed, waiting.id, live.id}
    assert store.clean(300, 1000.0) == 1
    assert {j.id for j in store.list()} == {new_a, needed, waiting.id, live.id}
    assert old_a not in {j.id for j in store.list()}
    assert store.clean(0, 10_000.0) == 1  # new_a; `needed` is still needed
    assert store.audit() == []


# --------------------------------------------------------------------------- concurrency


def test_threads_race_and_exactly_one_wins(tmp_path: Path) -> None:
    """Threads sharing one Store and threads with their own connection race to move the
    same jobs: every job is won exactly once."""
    shared = Store(tmp_path / "state.db")
    jobs = [shared.submit(spec(), 1.0)[0].id for _ in range(25)]
    n = 12
    barrier = threading.Barrier(n)
    wins: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def race(me: int) -> None:
        s = shared if me % 2 else Store(tmp_path / "state.db")
        try:
            barrier.wait()
            for job_id in jobs:
                try:
                    s.transition(
                        job_id,
                        QUEUED,
                        RESERVED,
                        now=2.0,
                        kind="placed",
                        detail=f"thread {me}",
                        supervisor_pid=me,
                    )
                except Conflict:
                    continue
                with lock:
                    wins.append((job_id, me))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            if s is not shared:
                s.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(j for j, _ in wins) == jobs
    for job_id, me in wins:
        job = shared.get(job_id)
        assert job.state == RESERVED and job.supervisor_pid == me
        assert [e.detail for e in job.events if e.kind == "placed"] == [f"thread {me}"]
    assert shared.audit() == []
    shared.close()


def _claim_in_process(db: str, me: int, jobs: list[int], go: Any, results: Any) -> None:
    won: list[int] = []
    try:
        store = Store(db)
        for job_id in jobs:
            go.wait(timeout=30)  # a barrier: every process goes for this job at once
            try:
                store.transition(
                    job_id,
                    QUEUED,
                    RESERVED,
                    now=2.0,
                    kind="placed",
                    detail=f"process {me}",
                    supervisor_pid=os.getpid(),
                )
            except Conflict:
                continue
            won.append(job_id)
            store.transition(job_id, RESERVED, RUNNING, now=3.0, kind="started")
        store.close()
    except BaseException as e:
        go.abort()  # release the others instead of leaving them at the barrier
        results.put((me, f"{type(e).__name__}: {e}"))
        raise
    results.put((me, won))


def test_processes_race_and_exactly_one_wins(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with Store(db) as s:
        jobs = [s.submit(spec(), 1.0)[0].id for _ in range(40)]
    ctx = multiprocessing.get_context("spawn")
    n = 6
    go = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_claim_in_process, args=(str(db), i, jobs, go, results))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    try:
        won = dict(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    failures = {me: r for me, r in won.items() if isinstance(r, str)}
    assert failures == {}
    assert [p.exitcode for p in procs] == [0] * n
    claimed = Counter(j for ids in won.values() for j in ids)
    assert sorted(claimed) == jobs and set(claimed.values()) == {1}
    assert sum(1 for ids in won.values() if ids) > 1  # they did race
    with Store(db) as s:
        for me, ids in won.items():
            for job_id in ids:
                job = s.get(job_id)
                assert job.state == RUNNING
                assert [e.detail for e in job.events if e.kind == "placed"] == [f"process {me}"]
        assert s.audit() == [] and s.integrity() == "ok"


def test_forked_child_gets_its_own_connection(store: Store) -> None:
    job, _ = store.submit(spec(), 1.0)
    with store._lock:  # as if another thread were inside the store at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                signal.alarm(10)  # a deadlock ends the child, not the test run
                store.transition(job.id, QUEUED, RESERVED, now=2.0, kind="placed")
                store.close()
                code = 0
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get(job.id).state == RESERVED  # the parent's connection still works
    store.transition(job.id, RESERVED, RUNNING, now=3.0, kind="started")
    assert store.audit() == []


# --------------------------------------------------------------------------- database


def test_pragmas_and_file_mode(store: Store) -> None:
    conn = store._connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600  # holds job environments
    assert version(store.path) == SCHEMA_VERSION
    assert store.integrity() == "ok"


def _insert_v1_job(db: Path, submitted_event: bool = False) -> None:
    """A queued job written as the version-1 code wrote it (the columns every later
    version still has), with its submitted event if asked."""
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "INSERT INTO jobs (user, uid, gid, groups, cwd, env, command, job_key, "
            "gpu_count, after_ids, exclusive, priority, requeue_on_reboot, state, "
            "submitted_at) VALUES ('alice', 1000, 1000, '[]', '/', '{}', '[\"true\"]', "
            "'k', 1, '[]', 0, 0, 0, 'queued', 1.0)"
        )
        if submitted_event:
            conn.execute(
                "INSERT INTO events (job_id, at, kind, to_state) "
                "VALUES (1, 1.0, 'submitted', 'queued')"
            )


def test_older_database_is_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db, migrations=MIGRATIONS[:1]).close()
    _insert_v1_job(db)
    assert version(db) == 1
    with closing(sqlite3.connect(db)) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name = 'jobs_live_key'"
            ).fetchone()[0]
            == 0
        )
    with Store(db) as s:
        assert version(db) == SCHEMA_VERSION
        job = s.get(1)
        assert job.spec == JobSpec(
            command=("true",), user="alice", uid=1000, gid=1000, key="k"
        )  # new fields at their defaults
        assert (job.preemptions, job.oom_retries, job.retry_mem) == (0, 0, None)
        assert s.submit(spec(key="k", uid=1000), 2.0) == (s.get(job.id), False)
        conn = sqlite3.connect(db)
        with closing(conn), pytest.raises(sqlite3.IntegrityError):  # a constraint now
            columns = [r[1] for r in conn.execute("PRAGMA table_info(jobs)") if r[1] != "id"]
            conn.execute(
                f"INSERT INTO jobs ({', '.join(columns)}) "  # the same job again
                f"SELECT {', '.join(columns)} FROM jobs"
            )


@pytest.mark.parametrize("was", range(1, SCHEMA_VERSION))
def test_a_database_of_each_earlier_version_is_upgraded(tmp_path: Path, was: int) -> None:
    """A database as the code of schema version ``was`` left it, holding a queued job:
    the current code upgrades it, reads the job, runs it to its end and finds the store
    consistent."""
    db = tmp_path / "state.db"
    Store(db, migrations=MIGRATIONS[:was]).close()
    _insert_v1_job(db, submitted_event=True)
    assert version(db) == was
    with Store(db) as s:
        assert version(db) == SCHEMA_VERSION
        job = s.get(1)
        assert (job.state, job.spec.command, job.spec.key) == (QUEUED, ("true",), "k")
        move(s, job.id, SUCCEEDED, now=3.0)
        assert s.get(job.id).state == SUCCEEDED
        assert s.submit(spec(), 2.0)[0].id == 2
        assert s.audit() == [] and s.integrity() == "ok"


def test_migrations_run_in_order_inside_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).close()
    order: list[int] = []

    def add_column(conn: sqlite3.Connection) -> None:
        order.append(1)
        conn.execute("ALTER TABLE jobs ADD COLUMN extra TEXT")

    def broken(conn: sqlite3.Connection) -> None:
        order.append(2)
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("the second new migration failed")

    with pytest.raises(RuntimeError, match="second new migration"):
        Store(db, migrations=[*MIGRATIONS, add_column, broken])
    assert order == [1, 2]
    assert version(db) == SCHEMA_VERSION  # nothing of either was kept
    with closing(sqlite3.connect(db)) as conn:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
        assert "extra" not in cols
        assert (
            conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[
                0
            ]
            == 0
        )
    with Store(db, migrations=[*MIGRATIONS, add_column]) as s:
        assert version(db) == SCHEMA_VERSION + 1
        s.submit(spec(), 1.0)
    assert order == [1, 2, 1]


def test_newer_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with Store(db) as s:
        s.submit(spec(), 1.0)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
        conn.commit()
    with pytest.raises(SchemaTooNew, match=r"version 99.*upgrade gpuwarden") as err:
        Store(db)
    assert isinstance(err.value, StoreError) and err.value.exit_code == 3
    assert version(db) == 99  # untouched


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE stuff (x)")
    with pytest.raises(StoreError, match="not a gpuwarden state database"):
        Store(other)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="unusable"):
        Store(garbage)
    with pytest.raises(StoreError):
        Store(tmp_path)  # a directory


def test_closed_store_says_so(tmp_path: Path) -> None:
    s = Store(tmp_path / "state.db")
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.list()


# --------------------------------------------------------------------------- property

EVENTS = sorted(TRANSITIONS)


class StoreMachine(RuleBasedStateMachine):
    """Random submits, transitions (allowed by the lifecycle table or not, from the
    job's state or not), deletes and notes against a model: each job is always in
    exactly the one state the model says, and the event history agrees with it."""

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="gpuwarden-store-")
        self.store = Store(Path(self.dir) / "state.db", synchronous="NORMAL")
        self.state: dict[int, str] = {}
        self.keys: dict[int, tuple[int, str | None]] = {}
        self.now = 0.0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def holder(self, uid: int, key: str | None, but: int | None = None) -> int | None:
        if key is None:
            return None
        for job_id, state in self.state.items():
            if job_id != but and self.keys[job_id] == (uid, key) and state not in KEY_RELEASED:
                return job_id
        return None

    @rule(target=jobs, uid=st.sampled_from([1, 2]), key=st.sampled_from([None, "a", "b"]))
    def submit(self, uid: int, key: str | None) -> int:
        existing = self.holder(uid, key)
        job, created = self.store.submit(spec(uid=uid, user=f"u{uid}", key=key), self.tick())
        if existing is not None:
            assert not created and job.id == existing
        else:
            assert created and job.id not in self.state
            self.state[job.id] = QUEUED
            self.keys[job.id] = (uid, key)
        return job.id

    @rule(
        job=jobs,
        froms=st.sets(st.sampled_from(STATES), min_size=1, max_size=3),
        event=st.sampled_from(EVENTS),
        to=st.sampled_from((*STATES, None)),
    )
    def transition(self, job: int, froms: set[str], event: str, to: str | None) -> None:
        self._transition(job, froms, event, to)

    @rule(job=jobs, data=st.data())
    def lifecycle_step(self, job: int, data: st.DataObject) -> None:
        """An event the table allows from the model's own state (most rules would be
        refused or conflict)."""
        state = self.state.get(job)
        events = [e for e in EVENTS if state in TRANSITIONS[e].sources]
        if not events:
            return
        event = data.draw(st.sampled_from(events))
        self._transition(job, {state}, event, TRANSITIONS[event].target)

    def _transition(self, job: int, froms: set[str], event: str, to: str | None) -> None:
        change = TRANSITIONS[event]
        if not (froms <= change.sources and to == change.target):
            with pytest.raises(IllegalTransition):  # whatever the job's state
                self.store.transition(job, froms, to, now=self.tick(), kind=event)
            return
        if job not in self.state:
            with pytest.raises(JobNotFound):
                self.store.transition(job, froms, to, now=self.tick(), kind=event)
            return
        current = self.state[job]
        target = current if to is None else to
        uid, key = self.keys[job]
        blocked = target not in KEY_RELEASED and self.holder(uid, key, but=job) is not None
        if current in froms and not blocked:
            moved = self.store.transition(job, froms, to, now=self.tick(), kind=event)
            assert moved.state == target
            self.state[job] = target
        else:
            with pytest.raises(Conflict):
                self.store.transition(job, froms, to, now=self.tick(), kind=event)

    @rule(job=jobs)
    def delete(self, job: int) -> None:
        if job not in self.state:
            with pytest.raises(JobNotFound):
                self.store.delete(job)
        elif self.state[job] in TERMINAL:
            assert self.store.delete(job).id == job
            del self.state[job]
        else:
            with pytest.raises(Conflict):
                self.store.delete(job)

    @rule(job=jobs, reason=st.sampled_from(["full", "deps", None]))
    def reason(self, job: int, reason: str | None) -> None:
        self.store.set_reason(job, reason, self.tick())

    @invariant()
    def one_state_each(self) -> None:
        got = {j.id: j.state for j in self.store.list(with_events=False)}
        assert got == self.state
        assert self.store.audit() == []
        live = Counter(
            self.keys[j]
            for j, s in self.state.items()
            if s not in KEY_RELEASED and self.keys[j][1] is not None
        )
        assert all(n == 1 for n in live.values())


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --------------------------------------------------------------------------- paths


def test_paths_under_gpuwarden_home(tmp_path: Path) -> None:
    p = resolve_paths(
        {"GPUWARDEN_HOME": str(tmp_path / "h"), "XDG_RUNTIME_DIR": "/run/x"},
        euid=0,
        system_config=tmp_path / "none.toml",
    )
    home = tmp_path / "h"
    assert p == Paths(
        home=home,
        socket=home / "gpuwarden.sock",
        db=home / "state.db",
        jobs_dir=home / "jobs",
        config=home / "config.toml",
        lock=home / "daemon.lock",
        configured=True,
        mode="home",
    )
    assert p.job_dir(12) == home / "jobs" / "12"


def test_paths_for_root(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    p = resolve_paths({"HOME": "/root"}, euid=0, system_config=missing)
    assert p.home == Path("/var/lib/gpuwarden") and p.socket == Path("/run/gpuwarden.sock")
    assert p.db.parent == p.home and p.jobs_dir.parent == p.home
    assert p.mode == "system" and p.configured is False
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    assert resolve_paths({}, euid=0, system_config=cfg).configured is True


def test_paths_for_a_user(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {
        "HOME": str(tmp_path / "u"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
    }
    euid = os.geteuid()
    if euid == 0:  # root resolves to the system daemon: look as a user owning the dir
        euid = 4321
        os.chown(runtime, euid, -1)
    none = tmp_path / "none.toml"
    p = resolve_paths(env, euid=euid, system_config=none)
    assert p.home == tmp_path / "state" / "gpuwarden"
    assert p.socket == runtime / "gpuwarden.sock"
    assert p.db == p.home / "state.db" and p.jobs_dir == p.home / "jobs"
    assert p.config == tmp_path / "cfg" / "gpuwarden" / "config.toml"
    assert p.mode == "user" and p.configured is False
    # Defaults: ~/.local/state; without a usable runtime dir the socket lives in home.
    d = resolve_paths(
        {
            "HOME": "/home/u",
            "XDG_RUNTIME_DIR": str(tmp_path / "gone"),
            "XDG_STATE_HOME": "relative/ignored",
        },
        euid=4321,
        system_config=none,
    )
    assert d.home == Path("/home/u/.local/state/gpuwarden")
    assert d.socket == d.home / "gpuwarden.sock"
    assert d.config == Path("/home/u/.config/gpuwarden/config.toml")
    # A runtime dir owned by someone else (after `su`) is not used either.
    other = resolve_paths(
        {"HOME": "/home/u", "XDG_RUNTIME_DIR": str(runtime)},
        euid=os.stat(runtime).st_uid + 1,
        system_config=none,
    )
    assert other.socket == other.home / "gpuwarden.sock"


def test_configured_machine_sends_users_to_the_system_daemon(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    p = resolve_paths({"HOME": "/home/u"}, euid=4321, system_config=cfg)
    assert p.configured and p.mode == "system"
    assert p.socket == Path("/run/gpuwarden.sock") and p.config == cfg


def test_paths_ensure(tmp_path: Path) -> None:
    p = resolve_paths({"GPUWARDEN_HOME": str(tmp_path / "h")})
    p.ensure()
    p.ensure()  # idempotent
    assert p.jobs_dir.is_dir()
    assert stat.S_IMODE(p.home.stat().st_mode) == 0o700


def test_boot_id(tmp_path: Path) -> None:
    real = boot_id()
    assert real and real == boot_id()
    f = tmp_path / "boot_id"
    f.write_text("abc-123\n")
    assert boot_id(f) == "abc-123"
    stat_file = tmp_path / "stat"
    stat_file.write_text("cpu 1 2 3\nbtime 1700000000\n")
    assert boot_id(tmp_path / "missing", stat_file) == "btime:1700000000"
    assert boot_id(tmp_path / "missing", tmp_path / "missing") == "unknown"


def test_model_states_are_covered() -> None:
    assert {s for e in EVENTS for s in TRANSITIONS[e].sources} == set(model.STATES) - {
        SUCCEEDED
    }  # the one state no event leaves


def test_memory_holds_live_with_their_job(store: Store) -> None:
    from gpuwarden.jobs.model import NewHold

    job, _ = store.submit(spec(), 1.0)
    store.transition(
        job.id,
        QUEUED,
        RESERVED,
        now=2.0,
        kind="placed",
        gpus=(0,),
        gpu_uuids=("GPU-a",),
        budget=4 * GiB,
    )
    ended = store.transition(
        job.id,
        RESERVED,
        FAILED,
        now=5.0,
        kind="failed",
        hold=NewHold(
            gpu_uuids=("GPU-a",),
            budget=4 * GiB,
            pids=(42, 7),
            baseline={"GPU-a": 1024},
            exited_at=4.5,
            starts={42: 1.25},
        ),
    )
    [h] = store.open_holds()
    assert (h.job_id, h.attempt, h.pids, h.baseline, h.budget) == (
        job.id,
        0,
        (7, 42),
        {"GPU-a": 1024},
        4 * GiB,
    )
    assert h.starts == {42: 1.25}  # pid 7's start was not known
    assert ended.release == h and job_json(ended)["memory_release"]["released_at"] is None
    with pytest.raises(Conflict, match="still holds GPU memory"):
        store.delete(job.id)
    assert store.clean(0, 100.0) == 0
    assert store.report_leak(h.id, "pid 42 holds 1GiB", 6.0)
    assert not store.report_leak(h.id, "again", 7.0)  # reported once
    assert store.close_hold(h.id, 8.0, "verified", kind="memory_returned", detail="3.50 s")
    assert not store.close_hold(h.id, 9.0, "verified", kind="memory_returned", detail="x")
    assert store.open_holds() == []
    got = store.get(job.id)
    assert got.release is not None and got.release.to_json()["seconds"] == 3.5
    assert [e.kind for e in got.events][-2:] == ["leak", "memory_returned"]
    assert store.clean(0, 100.0) == 1


def test_an_edited_mem_replaces_the_budget_an_oom_retry_raised(store: Store) -> None:
    job, _ = store.submit(spec(mem=4 * GiB), 1.0)
    move(store, job.id, RUNNING, 2.0)
    store.transition(
        job.id,
        RUNNING,
        QUEUED,
        now=2.0,
        kind="retried",
        retry_mem=10 * GiB,
        retry_ceiling=16 * GiB,
        ceiling_until=99.0,
    )
    kept = store.edit(job.id, [QUEUED], {"priority": 5}, now=3.0, detail="priority")
    assert kept.request == 10 * GiB and kept.retry_ceiling == 16 * GiB
    edited = store.edit(job.id, [QUEUED], {"mem": 6 * GiB}, now=4.0, detail="mem")
    assert edited.request == 6 * GiB
    assert (edited.retry_mem, edited.retry_ceiling, edited.ceiling_until) == (None, None, None)
