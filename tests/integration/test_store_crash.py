"""Kill -9 a process in the middle of store writes, many times, and check what is left.

The worker (this file run as a script) submits jobs, moves them through their life,
notes events, records peaks and removes finished jobs, as fast as it can, with the
daemon's settings (WAL, synchronous=FULL). After each commit it appends one line to a
report file (a plain ``write``, which survives SIGKILL). The test kills it at random
moments and then checks that:

* the database opens cleanly and ``PRAGMA integrity_check`` says ``ok``;
* every job is in exactly one valid state, and its events form a chain from its
  submission to that state (no state change without its event, no event without its
  state change);
* every commit the worker reported is there, and at most one commit more (the one the
  kill fell between committing and reporting);
* no idempotency key is held by two live jobs (re-submitting after a crash duplicates
  nothing).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from gpuwarden.daemon.schema import KEY_RELEASED
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import STATES

SRC = Path(__file__).resolve().parents[2] / "src"

ROUNDS = 20


def _worker(db: str, report_path: str, seed: int) -> None:  # pragma: no cover - subprocess
    from gpuwarden.daemon.store import Store
    from gpuwarden.daemon.store_errors import Conflict
    from gpuwarden.jobs.lifecycle import TRANSITIONS
    from gpuwarden.jobs.model import (
        CANCELLED,
        FAILED,
        HELD,
        INFEASIBLE,
        QUEUED,
        RESERVED,
        RUNNING,
        SUCCEEDED,
        TERMINAL,
        JobSpec,
    )

    nxt = {
        QUEUED: (RESERVED, RESERVED, HELD, CANCELLED, INFEASIBLE),
        HELD: (QUEUED, CANCELLED),
        RESERVED: (RUNNING, RUNNING, QUEUED, FAILED, CANCELLED),
        RUNNING: (SUCCEEDED, FAILED, CANCELLED),
        SUCCEEDED: (),
        FAILED: (QUEUED,),
        CANCELLED: (QUEUED,),
        INFEASIBLE: (QUEUED,),
    }
    rng = random.Random(seed)
    report = os.open(report_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def say(line: str) -> None:
        os.write(report, (line + "\n").encode())

    store = Store(db)
    # The only writer: keep our own view instead of re-reading every job each step, so
    # that nearly all the time goes to writes and the kills land in them.
    view = {j.id: j for j in store.list(with_events=False)}
    say("ready")
    while True:
        now = time.time()
        r = rng.random()
        if (r < 0.2 and len(view) < 150) or not view:
            key = f"k{rng.randrange(30)}" if rng.random() < 0.7 else None
            after = (rng.choice(list(view)),) if view and rng.random() < 0.2 else ()
            job, created = store.submit(
                JobSpec(
                    command=("sleep", "1"),
                    user="u",
                    uid=1000,
                    gid=1000,
                    key=key,
                    after=after,
                    env={"SEED": str(seed)},
                ),
                now,
            )
            if created:
                say(f"S {job.id}")
                view[job.id] = job
            continue
        job = view[rng.choice(list(view))]
        if r < 0.8:
            choices = nxt[job.state]
            if not choices:
                r = 0.82  # a succeeded job: remove it instead
            else:
                to = rng.choice(choices)
                fields: dict[str, object] = {}
                if to == RESERVED:
                    fields = dict(gpus=(rng.randrange(8),), gpu_uuids=("GPU-x",), budget=1 << 30)
                elif to == RUNNING:
                    fields = dict(
                        started_at=now,
                        supervisor_pid=rng.randrange(1, 1 << 22),
                        supervisor_start=now,
                        boot_id="b",
                        attempts=job.attempts + 1,
                    )
                elif to in TERMINAL:
                    fields = dict(ended_at=now, exit_code=rng.randrange(3), reason=to)
                elif to == QUEUED:
                    fields = dict(reason=None, ended_at=None, exit_code=None, gpus=())
                event = next(
                    e
                    for e, c in sorted(TRANSITIONS.items())  # the table's word
                    if job.state in c.sources and c.target == to
                )
                try:
                    view[job.id] = store.transition(
                        job.id, job.state, to, now=now, kind=event, detail=str(seed), **fields
                    )
                except Conflict:  # retry while a newer job holds the key
                    continue
                say(f"T {job.id} {job.state} {to}")
                continue
        if r < 0.85:
            if job.terminal:
                try:
                    store.delete(job.id)
                except Conflict:  # a job still waits for it
                    continue
                del view[job.id]
                say(f"D {job.id}")
        elif r < 0.9:
            store.add_event(job.id, "edited", "n", now)
        elif r < 0.95:
            store.set_peak(job.id, rng.randrange(1 << 34))
        else:
            store.set_reason(job.id, rng.choice(["full", "deps", None]), now)


def _reports(path: Path) -> list[list[str]]:
    """Complete report lines (a kill can cut the last one short)."""
    text = path.read_text() if path.exists() else ""
    lines = text.split("\n")[:-1]  # whatever follows the last newline is incomplete
    return [line.split() for line in lines if line != "ready"]


def _wait_ready(report: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until the worker says it is ready; its error output if it ends first."""
    # Imported here: the worker runs this file as a script, where tests is not a package.
    from tests.helpers.wait import wait_for

    def ready() -> bool:
        if report.exists() and report.read_text().startswith("ready"):
            return True
        assert proc.poll() is None, proc.communicate()[1].decode()
        return False

    wait_for(ready, 30, 0.005, what="the worker to become ready")


def _chains(store: Store) -> dict[int, list[str]]:
    return {j.id: [to for _, to in store.transitions(j.id)] for j in store.list(with_events=False)}


def test_sigkill_mid_write_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rng = random.Random(1234)
    with Store(db) as s:
        expected = _chains(s)
    total_reported = 0
    for round_ in range(ROUNDS):
        report = tmp_path / f"report-{round_}"
        proc = subprocess.Popen(
            [sys.executable, __file__, str(db), str(report), str(round_)],
            env=env,
            stderr=subprocess.PIPE,
        )
        _wait_ready(report, proc)
        time.sleep(rng.uniform(0.02, 0.4))
        assert proc.poll() is None, proc.communicate()[1].decode()
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err.decode()

        # What the worker saw committed, replayed onto what was there before.
        deleted: set[int] = set()
        for parts in _reports(report):
            total_reported += 1
            job_id = int(parts[1])
            if parts[0] == "S":
                expected[job_id] = ["queued"]
            elif parts[0] == "T":
                assert expected[job_id][-1] == parts[2]
                expected[job_id].append(parts[3])
            else:
                deleted.add(job_id)
                del expected[job_id]

        with Store(db) as s:
            assert s.integrity() == "ok"
            assert s.audit() == []
            jobs = s.list()
            for job in jobs:
                assert job.state in STATES
            actual = _chains(s)
            assert not deleted & set(actual)
            unreported = 0
            for job_id, chain in actual.items():
                want = expected.get(job_id)
                if want is None:  # submitted, killed before the report
                    assert chain == ["queued"]
                    unreported += 1
                    continue
                assert chain[: len(want)] == want, (job_id, chain, want)
                unreported += len(chain) - len(want)
            unreported += len(set(expected) - set(actual))  # removed before the report
            assert unreported <= 1, (round_, unreported)
            live = Counter(
                j.spec.key for j in jobs if j.spec.key is not None and j.state not in KEY_RELEASED
            )
            assert all(n == 1 for n in live.values()), live
            expected = actual
    # The kills fell on a busy worker, not an idle one.
    assert total_reported > ROUNDS * 10


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
