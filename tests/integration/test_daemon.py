"""The daemon end to end: a real daemon process, real SQLite, the real unix socket and
real supervised subprocesses (simulated GPU jobs) on a simulated 2 x 24 GiB machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon

GiB = 1 << 30
MiB = 1 << 20


def sim_job(mem: str, seconds: float, *extra: str) -> list[str]:
    return [PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds), *extra]


def test_submit_run_and_wait(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem",
        "2G",
        "--name",
        "hello",
        cmd=[PY, "-c", "import os; print('hi from', os.environ['GPUWARDEN_JOB'])"],
    )
    r = daemon.cli("wait", str(jid))
    assert r.returncode == 0, r.stderr
    job = daemon.job(jid)
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["name"] == "hello"
    assert job["mem"] == 2 * GiB and len(job["gpus"]) == 1
    assert job["started_at"] and job["ended_at"]
    kinds = [e["kind"] for e in job["events"]]
    assert kinds[:4] == ["submitted", "placed", "launched", "started"] or kinds[:3] == [
        "submitted",
        "placed",
        "launched",
    ]
    assert "succeeded" in kinds[-2:]
    # Its memory is released only once verified back (invariant 5), and says how fast.
    job = daemon.wait_for_release(jid)
    assert kinds[-1] in ("succeeded", "memory_returned")
    release = job["memory_release"]
    assert release["how"] == "verified" and release["budget"] == 2 * GiB
    assert 0 <= release["seconds"] < 5 and release["leak"] is None
    assert daemon.cli("logs", str(jid), check=True).stdout == f"hi from {jid}\n"
    # `show --json` prints the API's document, which the fixture's polls read directly.
    assert daemon.json("show", str(jid)) == daemon.job(jid)
    # The same job for people: one line each, then its events indented under them.
    text = daemon.cli("show", str(jid), check=True).stdout.splitlines()
    assert text[0] == f"job {jid}  succeeded  user {job['user']}  name hello"
    assert text[1].startswith(f"  command   {PY} -c ")
    # Both figures: the budget its allocations may hold, the context booked beside it.
    assert (
        f"  memory    declared 2048MiB, reserved 2048MiB + {job['context'] >> 20}MiB "
        "CUDA context, peak "
    ) in "\n".join(text)
    assert f"  release   memory back {release['seconds']:.2f} s after the end (verified)" in text
    events = text[text.index("  events:") + 1 :]
    assert len(events) == len(job["events"]) and events[0].startswith("    ")
    assert events[0].endswith("  submitted")


def test_jobs_pack_by_memory_and_wait_when_full(daemon: Daemon) -> None:
    ids = [daemon.submit("--mem", "10G", cmd=sim_job("9G", 5)) for _ in range(4)]
    late = daemon.submit("--mem", "10G", cmd=sim_job("9G", 0.5))
    for jid in ids:
        daemon.wait_state(jid, "running", timeout=30)
    gpus = sorted(daemon.job(j)["gpus"][0] for j in ids)
    assert gpus == [0, 0, 1, 1]  # two 10 GiB jobs per 24 GiB GPU
    daemon.wait_reason(late, "waiting for")
    # Peaks come from the driver's view of each job's process tree: its allocations and
    # the CUDA context the (simulated) driver charges beside them.
    time.sleep(0.5)
    assert all(daemon.job(j)["peak_memory"] == 9 * GiB + 512 * MiB for j in ids)
    assert daemon.cli("wait", str(late), timeout=60).returncode == 0
    # It started once one of the four had ended; the others may still run when it ends.
    ends = [e for j in ids if (e := daemon.job(j)["ended_at"]) is not None]
    assert ends and daemon.job(late)["started_at"] >= min(ends)


def test_exit_codes_and_wait(daemon: Daemon) -> None:
    ok = daemon.submit(cmd=sim_job("1G", 0))
    bad = daemon.submit(cmd=sim_job("1G", 0, "--exit-code", "3"))
    assert daemon.cli("wait", str(ok)).returncode == 0
    r = daemon.cli("wait", str(bad))
    assert r.returncode == 3
    assert daemon.job(bad)["state"] == "failed" and daemon.job(bad)["exit_code"] == 3


def test_infeasible_at_once_and_bad_input(daemon: Daemon) -> None:
    r = daemon.cli("submit", "--mem", "100G", "--json", "--", PY, "-c", "pass")
    assert r.returncode == 2 and r.stdout == ""  # refused: it could never run here
    assert "can never run here" in r.stderr and "24.0GiB" in r.stderr
    for args, needle in (
        (["submit", "--mem", "12X", "--", "true"], "invalid size"),
        (["submit", "--gpu-ids", "5", "--", "true"], "no GPU with index 5"),
        (["submit", "--after", "999", "--", "true"], "999"),
        (["show", "12345"], "12345"),
        (["cancel", "abc"], "invalid job id"),
    ):
        r = daemon.cli(*args)
        assert r.returncode != 0, args
        assert needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_dependency_order_and_failed_dependency(daemon: Daemon) -> None:
    first = daemon.submit(cmd=sim_job("1G", 1))
    second = daemon.submit("--after", str(first), cmd=sim_job("1G", 0))
    assert daemon.job(second)["state"] == "queued"
    assert daemon.cli("wait", str(second), timeout=60).returncode == 0
    assert daemon.job(second)["started_at"] >= daemon.job(first)["ended_at"]

    failing = daemon.submit(cmd=sim_job("1G", 0, "--exit-code", "1"))
    after_fail = daemon.submit("--after", str(failing), cmd=sim_job("1G", 0))
    j = daemon.wait_state(after_fail, "cancelled")
    assert f"dependency {failing}" in j["reason"]


def test_cancel_kills_the_whole_tree_with_a_grandchild(daemon: Daemon, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', "
        f"'gpuwarden.sim.job', '--mem', '3G', '--seconds', '300'], "
        f"start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid)); "
        f"time.sleep(300)"
    )
    jid = daemon.submit("--mem", "4G", cmd=[PY, "-c", script])
    daemon.wait_state(jid, "running")
    grandchild = int(
        wait_for(
            lambda: pidfile.exists() and pidfile.read_text(),
            20,
            0.1,
            what="the grandchild's pid file",
        )
    )
    assert psutil.pid_exists(grandchild)
    daemon.cli("cancel", str(jid), check=True)
    job = daemon.wait_state(jid, "cancelled", timeout=30)
    assert job["reason"] == "cancelled"
    wait_for(
        lambda: (
            not psutil.pid_exists(grandchild)
            or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        ),
        5,
        0.1,
        what=lambda _: "grandchild survived the cancel",
    )

    def freed() -> bool:  # the driver frees a dead process's memory after a short lag
        status = json.loads(daemon.cli("status", "--json", check=True).stdout)
        return all(g["memory_used"] == 0 for g in status["gpus"])

    assert wait_for(freed, 5)


def test_hold_release_retry_key_rm_and_clean(daemon: Daemon) -> None:
    blocker = daemon.submit("--mem", "20G", "--gpu-ids", "0", cmd=sim_job("1G", 3))
    blocker2 = daemon.submit("--mem", "20G", "--gpu-ids", "1", cmd=sim_job("1G", 3))
    held = daemon.submit("--mem", "20G", cmd=sim_job("1G", 0))
    assert daemon.json("hold", str(held))["jobs"][0]["state"] == "held"
    daemon.cli("wait", str(blocker), str(blocker2), timeout=60)
    time.sleep(0.5)
    assert daemon.job(held)["state"] == "held"
    daemon.cli("release", str(held), check=True)
    assert daemon.cli("wait", str(held), timeout=60).returncode == 0

    a = daemon.cli("submit", "--key", "nightly", "--json", "--", PY, "-c", "pass", check=True)
    b = daemon.cli("submit", "--key", "nightly", "--json", "--", PY, "-c", "pass", check=True)
    assert json.loads(a.stdout)["id"] == json.loads(b.stdout)["id"]
    assert json.loads(b.stdout)["created"] is False
    daemon.cli("wait", str(json.loads(a.stdout)["id"]))  # ended before clean looks

    failing = daemon.submit(cmd=sim_job("1G", 0, "--exit-code", "2"))
    daemon.cli("wait", str(failing))
    daemon.cli("retry", str(failing), check=True)
    j = daemon.job(failing)
    assert j["attempts"] == 1 and "retried" in [e["kind"] for e in j["events"]]
    daemon.cli("wait", str(failing))
    daemon.wait_for_release(failing)  # clean keeps a job until its memory is back

    daemon.cli("rm", str(held), check=True)
    assert daemon.cli("show", str(held)).returncode != 0
    assert daemon.cli("rm", str(blocker)).returncode == 0
    removed = daemon.json("clean", "--older-than", "0s")["removed"]
    assert removed >= 1
    assert daemon.json("ps", "--all")["jobs"] == [] or all(
        j["state"] not in ("succeeded", "failed") for j in daemon.json("ps", "--all")["jobs"]
    )


def test_directives_in_a_script_and_command_line_wins(daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "#!/usr/bin/env python3\n#gpuwarden --mem=3G --name=from-script\n"
        "#gpuwarden --priority 5\nprint('ok')\n"
    )
    script.chmod(0o755)
    r = daemon.cli("submit", "--name", "from-cli", "--json", "--", PY, str(script))
    # The script is argv[1] here: directives are read from argv[0] only when it is a file.
    assert json.loads(r.stdout)["mem"] is None
    r = daemon.cli("submit", "--name", "from-cli", "--json", "--", str(script), check=True)
    job = json.loads(r.stdout)
    assert job["mem"] == 3 * GiB and job["name"] == "from-cli" and job["priority"] == 5


def test_credentials_are_dropped_unless_kept(daemon: Daemon) -> None:
    env = {**daemon.env, "MY_API_TOKEN": "s3cret", "HF_TOKEN": "hf", "PLAIN": "fine"}
    r = daemon.cli(
        "submit",
        "--env-keep",
        "HF_TOKEN",
        "--json",
        "--",
        PY,
        "-c",
        "import os; print(os.environ.get('MY_API_TOKEN'), os.environ['HF_TOKEN'], "
        "os.environ['PLAIN'])",
        env=env,
        check=True,
    )
    job = json.loads(r.stdout)
    assert "MY_API_TOKEN" in job["dropped_env"] and "HF_TOKEN" not in job["dropped_env"]
    assert "MY_API_TOKEN" in r.stderr
    daemon.cli("wait", str(job["id"]))
    assert daemon.cli("logs", str(job["id"])).stdout == "None hf fine\n"


def test_credentials_are_matched_by_word_not_substring(daemon: Daemon) -> None:
    """TIKTOKEN_CACHE_DIR has TOKEN inside a word: it is no credential and reaches the job;
    AWS_SECRET_ACCESS_KEY and OPENAI_API_KEY are dropped."""
    env = {
        **daemon.env,
        "TIKTOKEN_CACHE_DIR": "/cache/tt",
        "TOKENIZERS_PARALLELISM": "0",
        "AWS_SECRET_ACCESS_KEY": "s3cret",
        "OPENAI_API_KEY": "sk",
    }
    r = daemon.cli(
        "submit",
        "--json",
        "--",
        PY,
        "-c",
        "import os; print(os.environ.get('TIKTOKEN_CACHE_DIR'), "
        "os.environ.get('TOKENIZERS_PARALLELISM'), "
        "os.environ.get('AWS_SECRET_ACCESS_KEY'), os.environ.get('OPENAI_API_KEY'))",
        env=env,
        check=True,
    )
    job = json.loads(r.stdout)
    assert {"AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY"} <= set(job["dropped_env"])
    assert "TIKTOKEN_CACHE_DIR" not in r.stderr and "TOKENIZERS_PARALLELISM" not in r.stderr
    daemon.cli("wait", str(job["id"]))
    assert daemon.cli("logs", str(job["id"])).stdout == "/cache/tt 0 None None\n"


def test_a_missing_command_fails_the_job_not_the_daemon(daemon: Daemon) -> None:
    from gpuwarden.client.api import Client

    # submit refuses it at once (test_submit_checks.py); a request that skips that check
    # (another client, or the program removed since) fails at launch.
    jid = Client(str(daemon.home / "gpuwarden.sock")).request(
        "POST",
        "/v1/jobs",
        body={"command": ["/no/such/program", "x"], "cwd": "/", "env": {"PATH": "/usr/bin:/bin"}},
    )["id"]
    job = daemon.wait_state(jid, "failed")
    assert job["exit_code"] == 127 and "not found" in job["reason"]
    assert daemon.cli("daemon", "status").returncode == 0


def test_openapi_document_is_served(daemon: Daemon) -> None:
    from gpuwarden.client.api import Client

    doc = Client(str(daemon.home / "gpuwarden.sock")).request("GET", "/openapi.json")
    assert doc["openapi"].startswith("3.") and "/v1/jobs" in doc["paths"]


def _simulate_reboot(daemon: Daemon, job_ids: list[int]) -> None:
    """What a reboot leaves behind: no supervisor, no exit record, another boot id."""
    import contextlib
    import os
    import signal
    import sqlite3

    from gpuwarden.client.paths import DB_NAME

    states = {j: daemon.job(j)["state"] for j in job_ids}
    daemon.stop()
    from gpuwarden.supervisor.control import live_supervisors

    for p in live_supervisors(daemon.home / "jobs"):
        # The supervisor first: one that saw its job killed could write the job's end
        # (exit.json) before its own turn came, which no reboot leaves.
        children = p.children(recursive=True)
        os.kill(p.pid, signal.SIGKILL)
        for c in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid, signal.SIGKILL)
    # Pretend the machine rebooted: the jobs' attempts belong to an earlier boot. No event
    # of the lifecycle says that (a reboot is found, never recorded), so the row is
    # edited directly, with the daemon stopped.
    with contextlib.closing(sqlite3.connect(daemon.home / DB_NAME)) as conn, conn:
        conn.executemany(
            "UPDATE jobs SET boot_id = 'an-earlier-boot' WHERE id = ?", [(j,) for j in states]
        )
    daemon.start()


def test_a_reboot_marks_running_jobs_lost_or_requeues_them(daemon: Daemon) -> None:
    lost = daemon.submit("--mem", "1G", cmd=sim_job("1G", 120))
    again = daemon.submit("--mem", "1G", "--requeue-on-reboot", cmd=sim_job("1G", 10))
    daemon.wait_state(lost, "running")
    daemon.wait_state(again, "running")
    _simulate_reboot(daemon, [lost, again])
    job = daemon.wait_state(lost, "failed")
    assert job["reason"] == "lost on reboot"
    j2 = daemon.wait_state(again, "succeeded", timeout=60)
    assert j2["attempts"] == 1 and "requeued" in [e["kind"] for e in j2["events"]]


def test_clean_keeps_an_ended_job_that_a_waiting_job_depends_on(daemon: Daemon) -> None:
    done = daemon.submit(cmd=sim_job("1G", 0))
    daemon.cli("wait", str(done), check=True)
    long = daemon.submit(cmd=sim_job("1G", 60))
    daemon.submit("--after", str(done), "--after", str(long), cmd=sim_job("1G", 0))
    other = daemon.submit(cmd=sim_job("1G", 0))
    daemon.cli("wait", str(other), check=True)
    daemon.wait_for_release(other)  # (the driver frees its memory a moment after the end)
    out = daemon.json("clean", "--older-than", "0s")
    assert out["removed"] == 1  # `other`; `done` stays for its dependent
    assert daemon.job(done)["state"] == "succeeded"
    assert daemon.cli("show", str(other)).returncode != 0
