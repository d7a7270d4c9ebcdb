"""Restart safety (invariant 3), proved the hard way: a batch of jobs runs while the daemon
is killed with SIGKILL again and again — at random moments, some of them in the middle of
its start-up recovery — and restarted each time. In the end every job ran exactly once
(a ledger the jobs append to says so), has the exit code it exited with, and the state
database is sound and agrees with its events.

The randomness is seeded; the seed is printed (shown when the test fails) and can be
fixed with GPUWARDEN_RESTART_SEED to replay a run."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpuwarden.client.api import Client
from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.config import Config
from gpuwarden.daemon.loop import Scheduler
from gpuwarden.daemon.service import JobService
from gpuwarden.daemon.store import Store
from gpuwarden.gpus.backend import Backend, open_backend
from gpuwarden.jobs import model
from gpuwarden.jobs.jobdir import SupervisorHandle, SupervisorSpec, read_status, write_spec
from gpuwarden.jobs.model import Job, JobSpec
from gpuwarden.procs.identity import boot_id
from gpuwarden.supervisor.control import alive, cancel
from gpuwarden.supervisor.spawn import spawn_supervisor
from tests.helpers.paths import SRC
from tests.helpers.procs import end_process
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon, is_daemon, start_daemon

JOBS = 30
KILLS = 15
FIRST_WAVE, WAVE = 12, 2  # jobs submitted before the first kill, and after each restart
EARLY_KILL = 0.35  # share of restarts that are killed again during start-up recovery
MEM = "30G"  # per job: two fit on each simulated 80 GiB GPU

# The job: one line "<job id> <pid>" appended to the ledger (O_APPEND: one write, whole),
# a seeded random sleep, then an exit code that follows from the job id.
JOB_PROGRAM = """\
import os, random, sys, time
job = int(os.environ["GPUWARDEN_JOB"])
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, ("%d %d\\n" % (job, os.getpid())).encode())
os.close(fd)
time.sleep(random.Random("%s:%d" % (sys.argv[2], job)).uniform(0, 1.5))
sys.exit(job % 4)
"""


def scenario(path: Path) -> Path:
    """4 x 80 GiB, two per NUMA node: with MEM per job, eight jobs run at once."""
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-00000000-0000-4000-8000-00000000000{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total": "80GiB",
            "numa_node": i // 2,
            "cpus": str(i // 2),
            "compute_mode": "Default",
            "persistence_mode": True,
        }
        for i in range(4)
    ]
    path.write_text(json.dumps({"description": "restart test: 4 x 80 GiB", "gpus": gpus}))
    return path


@pytest.fixture
def busy_daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from start_daemon(tmp_path, scenario(tmp_path / "4x80.json"))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill9(d: Daemon, pid: int | None = None) -> int:
    """SIGKILL the daemon (its pid from the lock file) and wait until it is gone."""
    pid = pid if pid is not None else d.pid()
    assert pid is not None and is_daemon(pid), f"no daemon to kill (lock says {pid})"
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _gone(pid), 10, 0.01, what=lambda _: f"daemon {pid} survived SIGKILL")
    return pid


def start_and_kill_early(d: Daemon, rng: random.Random) -> None:
    """Start a daemon as `daemon start` does, and SIGKILL it within its first half second:
    while it recovers (adopts, settles, requeues) and runs its first scheduling pass."""
    old = d.pid()
    with open(d.home / "daemon.log", "ab") as log:
        proc = subprocess.Popen(
            [PY, "-m", "gpuwarden.daemon.main"],
            env=d.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd="/",
        )
    try:

        def took_lock() -> bool:  # the lock file names it once it holds the lock
            assert proc.poll() is None, "the daemon exited while starting"
            return d.pid() not in (None, old)

        wait_for(took_lock, 15, 0.005, what=lambda _: "the daemon did not take its lock")
        time.sleep(rng.uniform(0.0, 0.5))
        kill9(d, proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def submit(client: Client, d: Daemon, command: list[str], after: list[int]) -> int:
    body = {"command": command, "cwd": "/", "env": d.env, "mem": MEM, "after": after}
    return int(client.request("POST", "/v1/jobs", body=body)["id"])


def live_job_processes(home: Path, ledger: Path) -> list[str]:
    """Supervisors of this daemon's jobs, and job commands, still running (zombies left
    to an init that does not reap count as gone)."""
    from gpuwarden.supervisor.control import live_supervisors

    found = [f"{p.pid}: supervisor" for p in live_supervisors(home / "jobs")]
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if str(ledger) in cmd:
            found.append(f"{p.pid}: {' '.join(cmd)[:120]}")
    return found


def test_kill_9_at_random_moments_loses_and_duplicates_no_job(
    busy_daemon: Daemon, tmp_path: Path
) -> None:
    d = busy_daemon
    seed = int(os.environ.get("GPUWARDEN_RESTART_SEED") or random.SystemRandom().getrandbits(32))
    print(f"restart test seed: {seed} (replay with GPUWARDEN_RESTART_SEED={seed})")
    rng = random.Random(seed)
    ledger = tmp_path / "ledger"
    ledger.touch()
    command = [PY, "-I", "-c", JOB_PROGRAM, str(ledger), str(seed)]
    client = Client(str(d.home / "gpuwarden.sock"))
    started = time.monotonic()

    # The batch, submitted in waves so that jobs are placed, started and finished all
    # through the kills: a first wave, then a few more after each of the first restarts.
    # About half wait for earlier jobs, mostly ones that will succeed (exit code
    # id % 4 == 0), sometimes one that fails (then the dependent is cancelled).
    deps: dict[int, list[int]] = {}

    def submit_some(count: int) -> None:
        for _ in range(min(count, JOBS - len(deps))):
            after: list[int] = []
            recent = sorted(deps)[-10:]
            ok = [j for j in recent if j % 4 == 0]
            bad = [j for j in recent if j % 4 != 0]
            if len(deps) >= 4 and rng.random() < 0.5:
                pool = bad if bad and rng.random() < 0.15 else ok
                if pool:
                    after = sorted(rng.sample(pool, min(len(pool), rng.choice((1, 2)))))
            deps[submit(client, d, command, after)] = after

    submit_some(FIRST_WAVE)
    # Kill it, again and again, while jobs are placed, launched, started and finished.
    kills = 0
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.1, 1.0))
        kill9(d)
        kills += 1
        if rng.random() < EARLY_KILL:
            start_and_kill_early(d, rng)
            kills += 1
        d.start()
        submit_some(WAVE)
    assert len(deps) == JOBS
    chaos = time.monotonic() - started

    # What each job must come to: run and exit with id % 4, or be cancelled because a
    # dependency did not succeed (then it never ran).
    expected: dict[int, str] = {}
    for jid in sorted(deps):
        will_run = all(expected[dep] == "succeeded" for dep in deps[jid])
        expected[jid] = "cancelled" if not will_run else "succeeded" if jid % 4 == 0 else "failed"

    def pending(jobs: dict[int, dict[str, object]]) -> dict[int, object]:
        return {
            i: j["state"]
            for i, j in jobs.items()
            if j["state"] not in ("succeeded", "failed", "cancelled", "infeasible")
        }

    jobs = wait_for(
        lambda: {j["id"]: j for j in client.request("GET", "/v1/jobs", query={"all": "1"})["jobs"]},
        60,
        0.2,
        until=lambda jobs: not pending(jobs),
        what=lambda jobs: f"jobs never finished: {pending(jobs)}",
    )
    d.stop()
    seen = collections.Counter(e["kind"] for j in jobs.values() for e in j["events"])
    print(f"events: {dict(sorted(seen.items()))}")
    print(
        f"{kills} kills in {chaos:.1f}s; all {JOBS} jobs done after "
        f"{time.monotonic() - started:.1f}s"
    )

    # Every job that was to run ran exactly once; no other ever started.
    lines = [line.split() for line in ledger.read_text().splitlines()]
    runs = collections.Counter(int(job) for job, _ in lines)
    ran_as = {int(job): int(pid) for job, pid in lines}
    assert set(runs) <= set(deps), f"unknown jobs ran: {set(runs) - set(deps)}"
    wrong = {
        jid: runs[jid] for jid in deps if runs[jid] != (0 if expected[jid] == "cancelled" else 1)
    }
    assert not wrong, f"jobs that ran a wrong number of times ({{id: runs}}): {wrong}"

    # ... and ended as it exited, the exit code recorded.
    assert set(jobs) == set(deps)
    for jid, job in jobs.items():
        kinds = [e["kind"] for e in job["events"]]
        assert job["state"] == expected[jid], (jid, job["reason"], kinds)
        if expected[jid] == "cancelled":
            assert job["exit_code"] is None and "dependency" in (job["reason"] or "")
        else:
            assert job["exit_code"] == jid % 4, (jid, job["reason"], kinds)
            assert job["started_at"] and job["ended_at"], (jid, kinds)
            # The recorded end is that of the one run: its supervisor started that pid.
            attempt = d.home / "jobs" / str(jid) / f"attempt-{job['attempts']}"
            child = read_status(attempt).child
            assert child is not None and child.pid == ran_as[jid], (jid, kinds)

    # The database is sound and its states agree with their events.
    store = Store(d.home / "state.db")
    assert store.integrity() == "ok"
    assert store.audit() == []
    assert {j.id: j.state for j in store.list()} == expected

    # Nothing of the jobs is left running.
    wait_for(
        lambda: live_job_processes(d.home, ledger), 10, 0.1, until=lambda live: not live, what=str
    )
    assert all(_gone(int(pid)) for _, pid in lines)


# ----------------------------------------------------------------------------------------
# The crash windows of a launch, one at a time and deterministically: the daemon records
# "placed", writes spec.json, starts the supervisor (which claims the job directory), and
# records "launched". A daemon killed between any two of these steps must, on restart,
# either requeue the job with no way left for the old attempt to run, or adopt the
# supervisor that did start and collect its exit code.

# A supervisor the killed daemon started: it read spec.json (as `python -m
# gpuwarden.supervisor` does first) and is slow to claim the directory, so the
# next daemon's recovery runs in between; a line on stdin lets it go on.
LATE_SUPERVISOR = """\
import sys
from pathlib import Path
from gpuwarden.jobs.jobdir import load_spec
from gpuwarden.supervisor.detach import daemonize, refuse_if_started
d = Path(sys.argv[1])
spec = load_spec(d)
refuse_if_started(d)
print("loaded", flush=True)
sys.stdin.readline()
sys.exit(daemonize(d, spec, None))
"""


def _ledger_lines(ledger: Path, want: int, settle: float) -> list[str]:
    """The ledger's lines once it has ``want`` of them, or after ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        lines = ledger.read_text().splitlines()
        if len(lines) >= want or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _no_backend() -> Backend:
    raise AssertionError("recovery needs no GPU backend")


def _reserved_job(store: Store, argv: tuple[str, ...]) -> Job:
    """A job as the killed daemon left it right after its "placed" transaction."""
    job, _ = store.submit(
        JobSpec(command=argv, user="me", uid=os.getuid(), gid=os.getgid()), now=time.time()
    )
    return store.transition(
        job.id,
        model.QUEUED,
        model.RESERVED,
        now=time.time(),
        kind="placed",
        gpus=(0,),
        gpu_uuids=("GPU-0",),
        budget=1 << 30,
    )


def _supervisor_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}


@pytest.mark.parametrize(
    "crash", ["after_placed", "after_spec", "supervisor_starting", "supervisor_claimed"]
)
def test_a_crash_inside_a_launch_neither_loses_nor_repeats_the_job(
    tmp_path: Path, crash: str
) -> None:
    store = Store(tmp_path / "state.db")
    sched = Scheduler(store, tmp_path / "jobs", Config(grace=1.0), _no_backend, boot_id())
    ledger = tmp_path / "ledger"
    ledger.touch()
    argv = (PY, "-I", "-c", JOB_PROGRAM, str(ledger), "0")
    job = _reserved_job(store, argv)
    jobdir = sched.jobdir(job)
    late: subprocess.Popen[str] | None = None
    if crash != "after_placed":
        env = {"PATH": os.environ.get("PATH", os.defpath), "GPUWARDEN_JOB": str(job.id)}
        write_spec(
            jobdir,
            SupervisorSpec(
                job=job.id, argv=argv, env=env, cwd="/", uid=os.getuid(), gid=os.getgid(), grace=1.0
            ),
        )
    if crash in ("supervisor_starting", "supervisor_claimed"):
        late = subprocess.Popen(
            [PY, "-c", LATE_SUPERVISOR, str(jobdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_supervisor_env(),
        )
        assert late.stdout is not None and late.stdin is not None
        assert late.stdout.readline().strip() == "loaded"
        if crash == "supervisor_claimed":
            late.stdin.write("go\n")
            late.stdin.flush()
            assert late.wait(30) == 0, late.communicate()
            assert read_status(jobdir).supervisor is not None

    sched.recover()  # the restarted daemon

    if late is not None and late.poll() is None:  # the slow supervisor goes on only now
        _, err = late.communicate("go\n", timeout=30)
        assert late.returncode != 0 and "another supervisor" in err, err
    if late is not None:
        end_process(late)  # the claimed one exited with its pipes still open
    after = store.get(job.id)
    if crash == "supervisor_claimed":
        # Its supervisor runs it: adopted, and its exit code collected when it ends.
        assert after.state == model.RESERVED and after.supervisor_pid is not None
        assert after.events[-1].kind == "adopted"
        wait_for(
            lambda: read_status(jobdir),
            30,
            0.05,
            until=lambda st: st.exit is not None,
            what=lambda _: "the adopted job never ended",
        )
        sched.recover()
        after = store.get(job.id)
        assert after.state == (model.SUCCEEDED if job.id % 4 == 0 else model.FAILED)
        assert after.exit_code == job.id % 4
        assert len(_ledger_lines(ledger, 1, 5)) == 1
    else:
        # Never launched: queued again for a fresh attempt, and the old attempt can
        # never run, not even by a supervisor started for it later.
        assert after.state == model.QUEUED and after.attempts == job.attempts + 1
        r = subprocess.run(
            [PY, "-m", "gpuwarden.supervisor", str(jobdir)],
            env=_supervisor_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode != 0, r.stderr
        assert _ledger_lines(ledger, 1, 1.0) == []
    assert store.audit() == [] and store.integrity() == "ok"


def test_a_job_cancelled_while_it_is_launched_does_not_run_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API cancels a reserved job that has no supervisor yet in the store alone; if
    that happens while the scheduler starts its supervisor, the scheduler must stop it."""
    monkeypatch.setenv("GPUWARDEN_SIM", str(scenario(tmp_path / "4x80.json")))
    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(tmp_path / "sim"))
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    store = Store(tmp_path / "state.db")
    config = Config(grace=1.0)
    sched = Scheduler(store, tmp_path / "jobs", config, open_backend, boot_id())
    service = JobService(
        store,
        tmp_path / "jobs",
        config,
        wake=lambda: None,
        gpus=lambda: sched.last_states,
        cancel_running=sched.cancel_running,
    )
    me = Caller(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), user="me", groups=())
    job, _ = store.submit(
        JobSpec(
            command=(PY, "-c", "import time; time.sleep(60)"),
            user="me",
            uid=os.getuid(),
            gid=os.getgid(),
            mem=1 << 30,
        ),
        now=time.time(),
    )
    spawn = spawn_supervisor

    def spawn_and_cancel(jobdir: str | os.PathLike[str]) -> SupervisorHandle:
        handle = spawn(jobdir)
        assert service.actions.cancel(me, job.id)["state"] == "cancelled"  # in the store alone
        return handle

    monkeypatch.setattr("gpuwarden.supervisor.spawn.spawn_supervisor", spawn_and_cancel)
    jobdir = sched.jobdir(store.get(job.id))
    try:
        sched.tick()
        after = store.get(job.id)
        assert after.state == model.CANCELLED
        assert "launched" not in [e.kind for e in after.events]
        st = wait_for(
            lambda: read_status(jobdir),
            20,
            0.05,
            until=lambda st: st.exit is not None,
            what=lambda _: "the cancelled job runs on",
        )
        assert st.exit.reason == "cancelled"
        assert st.supervisor is not None
        # exit.json is the supervisor's last write: it may still be exiting just after.
        handle = st.supervisor
        wait_for(
            lambda: not alive(handle), 10, 0.05, what="the supervisor of the cancelled job runs on"
        )
    finally:
        cancel(jobdir)  # whatever happened, leave nothing running
