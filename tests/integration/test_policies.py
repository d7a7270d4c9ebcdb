"""The queue's policies carried out by a real daemon with real supervised subprocesses on a
simulated 2 x 24 GiB machine: preemption and requeue (with the checkpoint notice), opting
out of requeue, CUDA-OOM retry with a bigger budget, and per-user limits."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, contexts_measured, start_daemon

GiB = 1 << 30
MiB = 1 << 20

# Runs until SIGTERM (then says whether the preemption notice was there) on its first
# attempt; the attempt after a requeue finds its marker and succeeds at once.
CHECKPOINTING = """\
import os, pathlib, signal, sys, time
notice = os.environ.get("GPUWARDEN_PREEMPT_FILE")
marker = pathlib.Path(sys.argv[1])
def stop(*_):
    seen = notice is not None and os.path.exists(notice)
    print("notice" if seen else "no notice", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
if marker.exists():
    print("second attempt", flush=True)
    sys.exit(0)
marker.touch()
print("first attempt", flush=True)
time.sleep(120)
"""


def sim_job(mem: str, seconds: float, *extra: str) -> list[str]:
    return [PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds), *extra]


@pytest.fixture
def fast_daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", 'retry_backoff = "200ms"\n')


@pytest.fixture
def measured_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """512, 512 and 768 MiB of CUDA context measured on this GPU model already."""
    yield from start_daemon(
        tmp_path, EXAMPLES / "idle-2gpu.json", "", contexts_measured(512, 512, 768)
    )


def kinds(job: dict[str, object]) -> list[str]:
    return [e["kind"] for e in job["events"]]  # type: ignore[index,union-attr]


def test_a_guaranteed_job_preempts_a_besteffort_one_which_is_requeued(
    fast_daemon: Daemon, tmp_path: Path
) -> None:
    d = fast_daemon
    marker = tmp_path / "marker"
    victim = d.submit(
        "--qos",
        "besteffort",
        "--gpus",
        "2",
        "--mem",
        "20G",
        "--checkpoint",
        "--grace",
        "5s",
        cmd=[PY, "-c", CHECKPOINTING, str(marker)],
    )
    d.wait_state(victim, "running")
    wait_for(marker.exists, timeout=20, what="the job to write its marker")
    boss = d.submit("--qos", "guaranteed", "--mem", "20G", cmd=sim_job("18G", 1))
    assert d.cli("wait", str(boss), timeout=60).returncode == 0
    assert d.cli("wait", str(victim), timeout=60).returncode == 0
    v = d.job(victim)
    assert v["state"] == "succeeded" and v["preemptions"] == 1 and v["attempts"] == 1
    seq = kinds(v)
    assert seq.index("preempted") < seq.index("requeued") < seq.index("succeeded")
    preempted = next(e for e in v["events"] if e["kind"] == "preempted")
    assert f"for job {boss}" in preempted["detail"]
    first = (d.home / "jobs" / str(victim) / "attempt-0" / "stdout").read_text()
    assert first.splitlines() == ["first attempt", "notice"]
    assert d.cli("logs", str(victim), check=True).stdout == "second attempt\n"
    b = d.job(boss)
    assert b["state"] == "succeeded" and b["qos"] == "guaranteed"
    # The guaranteed job started only once the victim was gone.
    assert b["started_at"] >= next(e["at"] for e in v["events"] if e["kind"] == "requeued")


def test_a_preempted_job_does_not_take_its_room_back_while_its_memory_returns(
    fast_daemon: Daemon,
) -> None:
    # The victim's memory comes back a moment after it stops (the simulated driver's lag,
    # as the real one's). Meanwhile the job that preempted it cannot start yet, and the
    # victim, queued again, must not be placed back in that room: it would be preempted
    # again at once, and again (it was, dozens of times a minute).
    d = fast_daemon
    victim = d.submit("--mem", "4G", "--gpu-ids", "0", cmd=sim_job("4G", 600))
    d.wait_state(victim, "running")
    boss = d.submit("--mem", "20G", "--gpu-ids", "0", "--priority", "100", cmd=sim_job("20G", 1))
    assert d.cli("wait", str(boss), timeout=60).returncode == 0
    v = d.wait_state(victim, "running", timeout=30)
    assert v["preemptions"] == 1, kinds(v)
    d.cli("cancel", str(victim), check=True)


def test_no_requeue_ends_a_preempted_job_cancelled(fast_daemon: Daemon) -> None:
    d = fast_daemon
    victim = d.submit(
        "--qos", "besteffort", "--gpus", "2", "--mem", "20G", "--no-requeue", cmd=sim_job("1G", 120)
    )
    d.wait_state(victim, "running")
    boss = d.submit("--priority", "5", "--mem", "20G", cmd=sim_job("1G", 0.5))
    assert d.cli("wait", str(boss), timeout=60).returncode == 0
    v = d.wait_state(victim, "cancelled")
    assert v["reason"] == "preempted (--no-requeue)" and v["preemptions"] == 1


def test_guaranteed_jobs_are_not_preempted(fast_daemon: Daemon) -> None:
    d = fast_daemon
    held = d.submit("--qos", "guaranteed", "--gpus", "2", "--mem", "20G", cmd=sim_job("1G", 3))
    d.wait_state(held, "running")
    other = d.submit(
        "--qos", "guaranteed", "--priority", "100", "--mem", "20G", cmd=sim_job("1G", 0)
    )
    job = d.wait_state(other, "queued")
    assert "preempted" not in kinds(d.job(held))
    assert d.cli("wait", str(other), timeout=60).returncode == 0
    assert d.job(held)["state"] == "succeeded" and d.job(held)["preemptions"] == 0
    assert job["state"] == "queued"


def test_cuda_oom_is_retried_with_a_bigger_budget(fast_daemon: Daemon) -> None:
    d = fast_daemon
    jid = d.submit(
        "--mem", "3G", "--retries", "2", cmd=sim_job("1G", 1, "--grow-to", "3.5G", "--steps", "2")
    )
    r = d.cli("wait", str(jid), timeout=60)
    job = d.job(jid)
    assert r.returncode == 0, job
    assert job["state"] == "succeeded" and job["oom_retries"] == 1 and job["attempts"] == 1
    seq = kinds(job)
    assert seq.index("oom") < seq.index("retried") < seq.index("succeeded")
    oom = next(e for e in job["events"] if e["kind"] == "oom")
    assert oom["detail"].startswith("torch.OutOfMemoryError")
    assert job["request"] >= int(1.25 * 3 * GiB) and job["budget"] == job["request"]
    first = (d.home / "jobs" / str(jid) / "attempt-0" / "stderr").read_text()
    assert "CUDA out of memory" in first


def test_other_failures_do_not_consume_retries(fast_daemon: Daemon) -> None:
    d = fast_daemon
    jid = d.submit("--mem", "2G", "--retries", "3", cmd=sim_job("1G", 0, "--exit-code", "3"))
    assert d.cli("wait", str(jid), timeout=60).returncode == 3
    job = d.job(jid)
    assert job["state"] == "failed" and job["oom_retries"] == 0 and job["attempts"] == 0
    assert "oom" not in kinds(job)


def test_an_oom_without_retries_fails_and_says_so(fast_daemon: Daemon) -> None:
    d = fast_daemon  # --retries 0: the one retry a job with --mem gets by default is off
    jid = d.submit(
        "--mem", "2G", "--retries", "0", cmd=sim_job("1G", 0, "--grow-to", "3G", "--steps", "1")
    )
    assert d.cli("wait", str(jid), timeout=60).returncode != 0
    job = d.job(jid)
    assert job["state"] == "failed"
    seq = kinds(job)
    assert seq.index("oom") < seq.index("not_retried") < seq.index("failed")


def test_per_user_limits_hold_jobs_back(tmp_path: Path) -> None:
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", "[limits]\nmax_running = 1\n"):
        first = d.submit("--mem", "1G", cmd=sim_job("1G", 2))
        second = d.submit("--mem", "1G", cmd=sim_job("1G", 0))
        d.wait_state(first, "running")
        d.wait_reason(second, "may run 1 job(s) at once")
        assert d.cli("wait", str(second), timeout=60).returncode == 0
        assert d.job(second)["started_at"] >= d.job(first)["ended_at"]


def test_bad_policy_input_is_a_clear_error(fast_daemon: Daemon) -> None:
    d = fast_daemon
    for args, needle in (
        (["--qos", "gold"], "Invalid value for '--qos'"),
        (["--mem-limit", "8G"], "mem_limit needs mem"),
        (["--mem", "8G", "--mem-limit", "4G"], "at least mem"),
        (["--qos", "guaranteed", "--mem", "4G", "--mem-limit", "8G"], "capped at its request"),
        (["--retries", "-1"], "-1"),
        (["--grace", "soon"], "soon"),
    ):
        r = d.cli("submit", *args, "--", "true")
        assert r.returncode != 0, args
        assert needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def uncapped(cmd: list[str]) -> list[str]:
    """The job allocates where the cooperative cap cannot see (as non-PyTorch code does)."""
    return ["env", "-u", "GPUWARDEN_MEM_LIMIT", *cmd]


def test_watchdog_kills_a_besteffort_job_over_its_limit(fast_daemon: Daemon) -> None:
    d = fast_daemon
    jid = d.submit(
        "--qos",
        "besteffort",
        "--mem",
        "2G",
        cmd=uncapped(sim_job("1G", 30, "--grow-to", "4G", "--steps", "1")),
    )
    job = d.wait_state(jid, "failed", timeout=30)
    # As the driver counts: its allocations and CUDA context (512 MiB simulated) against
    # its budget and the context allowance booked beside it.
    limit = (2 * GiB + job["context"]) >> 20
    assert job["reason"].startswith(f"killed: uses 4608MiB on GPU 0, over its limit {limit}MiB")
    assert "killed_over_limit" in kinds(job)
    assert job["enforcement"]["watchdog"] == "kill over the limit"


def test_watchdog_allows_the_contexts_measured_on_the_gpu_model(measured_daemon: Daemon) -> None:
    """Contexts differ by the kernels a job loads: with 512, 512 and 768 MiB measured on
    this model, a job is booked the median (512 MiB) but killed only past its budget and
    the upper quartile (768 MiB). Its simulated context is 512 MiB, so 200 MiB allocated
    past its cap is what a bigger context looks like to the driver."""

    d = measured_daemon
    jid = d.submit(
        "--qos",
        "besteffort",
        "--mem",
        "2G",
        cmd=uncapped(sim_job("1G", 3, "--grow-to", "2248M", "--steps", "1")),
    )
    job = d.wait_state(jid, "succeeded", "failed", timeout=30)
    assert job["context"] == 512 << 20  # booked: the median
    assert job["state"] == "succeeded", job["reason"]
    assert not [k for k in kinds(job) if k in ("killed_over_limit", "over_budget")]


def test_watchdog_only_warns_about_a_guaranteed_job(fast_daemon: Daemon) -> None:
    d = fast_daemon
    jid = d.submit(
        "--qos",
        "guaranteed",
        "--mem",
        "2G",
        cmd=uncapped(sim_job("1G", 2, "--grow-to", "3G", "--steps", "1")),
    )
    assert d.cli("wait", str(jid), timeout=60).returncode == 0
    job = d.job(jid)
    warned = [e for e in job["events"] if e["kind"] == "over_budget"]
    assert len(warned) == 1 and "guaranteed: warn" in warned[0]["detail"]
    assert "killed_over_limit" not in kinds(job)


def test_a_burstable_job_may_grow_to_its_limit(fast_daemon: Daemon) -> None:
    d = fast_daemon
    jid = d.submit(
        "--mem", "2G", "--mem-limit", "6G", cmd=sim_job("1G", 2, "--grow-to", "5G", "--steps", "1")
    )
    assert d.cli("wait", str(jid), timeout=60).returncode == 0  # capped at 6G, not 2G
    job = d.job(jid)
    assert job["enforcement"]["limit"] == 6 * GiB
    assert job["peak_memory"] == 5 * GiB + 512 * MiB  # the driver's figure: + its context
    noted = [e for e in job["events"] if e["kind"] == "over_budget"]
    assert len(noted) == 1 and noted[0]["detail"].startswith("bursting")


def test_memory_comes_back_after_an_orphaned_grandchild_is_killed(
    fast_daemon: Daemon, tmp_path: Path
) -> None:
    d = fast_daemon
    pidfile = tmp_path / "grandchild"
    # The job starts a grandchild in its own session that holds 3 GiB, and exits at once.
    script = (
        f"import subprocess, sys; p = subprocess.Popen({sim_job('3G', 300)!r}, "
        f"start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid))"
    )
    jid = d.submit("--mem", "4G", cmd=[PY, "-c", script])
    job = d.wait_for_release(jid)
    rel = job["memory_release"]
    assert job["state"] == "succeeded" and rel["how"] == "verified" and rel["leak"] is None
    grandchild = int(pidfile.read_text())
    import psutil

    assert (
        not psutil.pid_exists(grandchild)
        or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    )
    assert "memory_returned" in kinds(job)


def test_a_leak_keeps_the_memory_reserved_until_an_admin_clears_it(tmp_path: Path) -> None:
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", 'release_timeout = "500ms"\n'):
        # A context the driver fails to free: the simulated job's memory outlives it.
        leaky = d.submit("--gpu-ids", "0", "--mem", "20G", cmd=sim_job("18G", 0, "--leak"))
        d.wait_state(leaky, "succeeded")
        job = wait_for(
            lambda d=d, leaky=leaky: d.job(leaky),
            20,
            0.2,
            until=lambda j: "leak" in kinds(j),
            what=lambda j: f"job {j['id']}'s leak was not recorded: {j}",
        )
        leak = next(e for e in job["events"] if e["kind"] == "leak")
        assert "holds 18.5GiB on GPU 0" in leak["detail"]  # 18 GiB and its context
        assert job["memory_release"]["released_at"] is None
        # The 20 GiB stay reserved: a job that needs them on GPU 0 waits.
        nxt = d.submit("--gpu-ids", "0", "--mem", "4G", cmd=sim_job("1G", 0))
        time.sleep(1)
        assert d.job(nxt)["state"] == "queued"
        r = d.cli("rm", str(leaky))
        assert r.returncode != 0 and "still holds GPU memory" in r.stderr
        # An admin clears the reservation; the leaked memory itself stays the driver's and
        # now counts as foreign, still in the way of the 4 GiB job.
        assert d.cli("unreserve", str(leaky)).returncode == 0
        cleared = d.job(leaky)
        assert cleared["memory_release"]["how"].startswith("cleared by")
        assert "memory_cleared" in kinds(cleared)
        r = d.cli("unreserve", str(leaky))
        assert r.returncode != 0 and "holds no memory" in r.stderr
        assert d.job(nxt)["state"] == "queued"


def test_mps_needs_a_budget(fast_daemon: Daemon) -> None:
    # The MPS path itself (simulated control daemon, limits, OOM): test_mps_jobs.py.
    d = fast_daemon
    for args, needle in (
        (["--mps"], "mps needs mem"),
        (["--mem", "2G", "--sm-percent", "50"], "sm_percent needs mps"),
        (["--mem", "2G", "--mps", "--sm-percent", "0"], "0"),
    ):
        r = d.cli("submit", *args, "--", "true")
        assert r.returncode != 0 and needle in r.stderr, (args, r.stderr)


def test_mem_auto_learns_from_earlier_successful_runs(fast_daemon: Daemon) -> None:
    d = fast_daemon
    first = d.submit("--mem", "auto", "--name", "nightly", cmd=sim_job("3G", 1))
    assert d.cli("wait", str(first), timeout=60).returncode == 0
    j = d.job(first)
    assert j["mem"] is None and j["mem_auto"]  # no history yet: a whole GPU
    learned = next(e for e in j["events"] if e["kind"] == "budget_learned")
    assert "no earlier successful run" in learned["detail"]
    assert j["peak_memory"] == 3.5 * GiB and j["allocated_peak"] == 3 * GiB  # + its context
    second = d.submit("--mem", "auto", "--name", "nightly", cmd=sim_job("3G", 1))
    r = d.cli("wait", str(second), timeout=60)
    assert r.returncode == 0
    j2 = d.job(second)
    assert j2["mem"] == int(3.75 * GiB) and j2["budget"] == int(3.75 * GiB)
    assert "3840MiB = 1.2 × the highest peak 3072MiB of 1 earlier run(s)" in next(
        e["detail"] for e in j2["events"] if e["kind"] == "budget_learned"
    )
    assert "over-declared by 768MiB (20%)" in j2["declared_vs_peak"]
    assert "over-declared by 768MiB" in r.stderr  # the completion line says it too
    r = d.cli("submit", "--mem", "auto", "--", "true")
    assert r.returncode != 0 and "same key or name" in r.stderr


def test_a_group_failing_the_same_way_three_times_is_held(fast_daemon: Daemon) -> None:
    d = fast_daemon
    blocker = d.submit("--mem", "1G", cmd=sim_job("1G", 30))
    later = [
        d.submit("--group", "sweep", "--mem", "1G", "--after", str(blocker), cmd=sim_job("1G", 0))
        for _ in range(2)
    ]
    failing = [
        d.submit("--group", "sweep", "--mem", "1G", cmd=sim_job("1G", 0, "--exit-code", "3"))
        for _ in range(3)
    ]
    for jid in failing:
        assert d.cli("wait", str(jid), timeout=60).returncode == 3
    for jid in later:
        job = d.wait_state(jid, "held", timeout=20)
        assert "its last 3 jobs failed the same way (exit code 3)" in job["reason"]
        assert "group_held" in kinds(job)
    assert d.job(blocker)["state"] == "running"  # not in the group: untouched
    assert d.cli("cancel", str(blocker)).returncode == 0


AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the scenario puts GPU 1 near CPU 1")
def test_cpus_are_held_alone_near_the_gpu(fast_daemon: Daemon) -> None:
    d = fast_daemon
    first = d.submit(
        "--gpu-ids",
        "1",
        "--mem",
        "1G",
        "--cpus",
        "1",
        cmd=[PY, "-c", AFFINITY + "; import time; time.sleep(2)"],
    )
    second = d.submit("--gpu-ids", "1", "--mem", "1G", "--cpus", "1", cmd=[PY, "-c", AFFINITY])
    d.wait_state(first, "running")
    d.wait_reason(second, "0 free CPU core(s) near it")
    for jid in (first, second):
        assert d.cli("wait", str(jid), timeout=60).returncode == 0
        assert d.job(jid)["cpu_set"] == [1]
        assert d.cli("logs", str(jid), check=True).stdout.strip() == "[1]"
    launched = next(e for e in d.job(first)["events"] if e["kind"] == "launched")
    assert "CPUs 1" in launched["detail"]
    r = d.cli("submit", "--cpus", "2", "--mem", "1G", "--json", "--", "true")
    assert r.returncode == 2 and "can never run here" in r.stderr  # refused at submit
    assert "at most 1 are near each GPU" in r.stderr


def test_no_numa_leaves_affinity_alone(fast_daemon: Daemon) -> None:
    d = fast_daemon
    jid = d.submit("--gpu-ids", "1", "--mem", "1G", "--no-numa", cmd=[PY, "-c", AFFINITY])
    assert d.cli("wait", str(jid), timeout=60).returncode == 0
    assert d.cli("logs", str(jid), check=True).stdout.strip() == str(
        sorted(os.sched_getaffinity(0))
    )
    launched = next(e for e in d.job(jid)["events"] if e["kind"] == "launched")
    assert "CPUs" not in launched["detail"]
    r = d.cli("submit", "--cpus", "1", "--no-numa", "--", "true")
    assert r.returncode != 0 and "choose one" in r.stderr
