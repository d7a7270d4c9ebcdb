"""Leaks on the simulated backend with real processes: a hidden holder, a dead pid with
charged memory, an orphan and a zombie — found, classified, reaped, memory verified."""

from __future__ import annotations

import getpass
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.sim import SimMachine
from tests.helpers.wait import wait_for

GiB = 1024**3
CONTEXT = 512 << 20  # what the simulated driver charges a process's CUDA context


def _leaks(sim: SimMachine, *extra: str) -> list[dict[str, object]]:
    return list(sim.json("leaks", "--samples", "2", "--interval", "0.1", *extra)["leaks"])


def test_running_job_is_listed_with_user_and_memory(sim: SimMachine) -> None:
    job = sim.job("--mem", "3G", "--seconds", "30", gpus="1")
    status = sim.json("status")
    gpu1 = status["gpus"][1]
    [proc] = [p for p in gpu1["processes"] if p["pid"] == job.pid]
    assert proc["memory"] == 3 * GiB + CONTEXT
    assert proc["user"] == getpass.getuser()
    assert proc["state"] == "running"
    assert "gpuwarden.sim.job" in proc["command"]
    assert gpu1["memory_used"] == 3 * GiB + CONTEXT
    assert status["gpus"][0]["memory_used"] == 0
    assert _leaks(sim) == []


def test_job_memory_is_freed_when_it_exits(sim: SimMachine) -> None:
    job = sim.job("--mem", "2G", "--seconds", "30", gpus="0")
    job.send_signal(signal.SIGKILL)  # no clean-up: the "driver" must still free it
    job.wait()
    # After the driver's short lag (free_lag), not at once.
    wait_for(lambda: sim.json("status")["gpus"][0]["memory_used"] == 0, timeout=5)


def test_hidden_holder_is_found_and_reaped(sim: SimMachine) -> None:
    holder = sim.job("--hold-only", "--seconds", "60", gpus="1")
    found = [lk for lk in _leaks(sim) if lk["pid"] == holder.pid]
    assert [(lk["kind"], lk["gpu"]) for lk in found] == [("hidden_holder", 1)]
    assert "nvidia1" in str(found[0]["evidence"])

    dry = sim.json("reap", "--samples", "1")
    assert dry["dry_run"] is True
    assert holder.poll() is None, "a dry run must not kill anything"

    out = sim.json("reap", "--yes", "--samples", "1", "--grace", "2")
    [action] = [a for a in out["actions"] if a["pid"] == holder.pid]
    assert action["action"] == "terminate"
    assert action["result"] in ("terminated", "killed")
    assert holder.wait(timeout=5) != 0
    assert _leaks(sim) == []


def test_dead_pid_with_charged_memory(sim: SimMachine) -> None:
    job = sim.job("--mem", "2G", "--seconds", "60", "--leak", gpus="0")
    job.kill()
    job.wait()
    [leak] = _leaks(sim)
    assert leak["kind"] == "dead_pid"
    assert leak["pid"] == job.pid and leak["gpu"] == 0 and leak["memory"] == 2 * GiB + CONTEXT
    out = sim.json("reap", "--yes", "--samples", "1")
    [action] = out["actions"]
    assert action["action"] == "none"
    assert any("-pm 0" in step for step in out["next_steps"])


def _orphan(sim: SimMachine, mem: str) -> int:
    """A leader starts a worker on GPU 0 and dies: the worker is re-parented and its
    process group is left without a leader."""
    env = sim.env
    env["CUDA_VISIBLE_DEVICES"] = "0"
    leader = subprocess.run(
        [
            "sh",
            "-c",
            f"{sys.executable} -m gpuwarden.sim.job --mem {mem} --seconds 120 "
            ">/dev/null 2>&1 & echo $!",
        ],
        env=env,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
    )
    worker = int(leader.stdout.strip())
    wait_for(lambda: any(p["pid"] == worker for p in sim.json("status")["gpus"][0]["processes"]))
    return worker


def test_orphaned_worker_is_found_and_reaped_with_memory_back(sim: SimMachine) -> None:
    worker = _orphan(sim, "5G")
    try:
        wait_for(lambda: sim.json("status")["gpus"][0]["memory_used"] == 5 * GiB + CONTEXT)
        [leak] = _leaks(sim)
        assert (leak["kind"], leak["pid"], leak["memory"]) == ("orphan", worker, 5 * GiB + CONTEXT)

        out = sim.json("reap", "--yes", "--samples", "1", "--grace", "2")
        [action] = out["actions"]
        assert action["action"] == "terminate" and action["result"] == "terminated"
        [back] = out["reclaimed"]
        assert back["gpu"] == 0 and back["bytes"] == 5 * GiB + CONTEXT
        assert back["seconds"] is not None
        assert out["still_held"] == []
        assert sim.json("status")["gpus"][0]["memory_used"] == 0
    finally:
        if psutil.pid_exists(worker):
            os.kill(worker, signal.SIGKILL)


def test_zombie_holding_memory_is_reported_and_parent_named(sim: SimMachine) -> None:
    job = sim.job("--mem", "1G", "--seconds", "0", "--leak", gpus="1")
    # This test process is the parent and does not wait(): the job stays defunct.
    wait_for(lambda: psutil.Process(job.pid).status() == psutil.STATUS_ZOMBIE)
    [leak] = _leaks(sim)
    assert (leak["kind"], leak["pid"], leak["gpu"]) == ("zombie", job.pid, 1)
    assert leak["parent"] == os.getpid()

    # A process of its own: in this one, reap would signal the zombie's parent, itself.
    r = sim.cli("reap", "--yes", "--samples", "1", "--timeout", "1", "--json", process=True)
    assert r.returncode == 1, "memory still held must be a non-zero exit"
    import json

    out = json.loads(r.stdout)
    [action] = out["actions"]
    assert action["action"] == "signal_parent" and action["result"] == "still_zombie"
    assert out["still_held"] == [job.pid]
    assert any(f"kill {os.getpid()}" in step for step in out["next_steps"])


def test_reap_refuses_other_users_process_when_not_root(make_sim: Any) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    shared = Path(tempfile.mkdtemp(prefix="gpuwarden-test-"))
    try:
        sim = make_sim("idle-2gpu.json")
        sim.state = shared / "state"
        worker = _orphan(sim, "2G")
        for d in (shared, sim.state, sim.state / "alloc", sim.state / "dev"):
            os.chmod(d, 0o777)
        _reap_as_nobody(sim, worker)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _reap_as_nobody(sim: SimMachine, worker: int) -> None:
    """As an unprivileged user, a root-owned orphan must be left alone."""
    env = sim.env
    r = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "gpuwarden",
            "reap",
            "--yes",
            "--json",
            "--samples",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    import json

    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    try:
        [action] = [a for a in out["actions"] if a["pid"] == worker]
        assert action["action"] == "none" and "run as root" in action["reason"]
        assert psutil.pid_exists(worker)
    finally:
        os.kill(worker, signal.SIGKILL)


def test_reap_named_pid_that_holds_nothing_is_a_usage_error(sim: SimMachine) -> None:
    r = sim.cli("reap", "--pid", str(os.getpid()), "--samples", "1")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "holds no GPU memory" in r.stderr
    assert "Traceback" not in r.stderr


# As from a terminal: SIGINT at its default. A shell's background job (nohup make test &)
# ignores SIGINT, the CLI inherits that, and Ctrl-C is then no Ctrl-C.
INTERACTIVE = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " runpy.run_module('gpuwarden', run_name='__main__')"
)


def test_status_watch_refreshes_until_interrupted(sim: SimMachine) -> None:
    import time

    p = subprocess.Popen(
        [sys.executable, "-c", INTERACTIVE, "status", "--watch", "0.2"],
        env=sim.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"still running 30 s after SIGINT; it printed {out!r}") from None
    assert p.returncode == 130
    assert "Traceback" not in err
    assert "L4" in out


def test_status_watch_on_a_terminal_redraws_in_place_cut_to_its_height(make_sim: Any) -> None:
    """On a terminal, each screen goes home, overwrites the last one line by line and
    erases what is left, in colour, cut to the terminal's height (LINES)."""
    import pty

    sim = make_sim("leaky-4gpu.json")  # more lines than the terminal has
    primary, secondary = pty.openpty()
    env = {**sim.env, "LINES": "12", "COLUMNS": "100", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen(
        [sys.executable, "-c", INTERACTIVE, "status", "--watch", "0.2"],
        env=env,
        stdin=secondary,
        stdout=secondary,
        stderr=subprocess.PIPE,
    )
    os.close(secondary)
    out = b""
    try:
        deadline = time.monotonic() + 30
        while out.count(b"\x1b[H") < 3 and time.monotonic() < deadline:
            if not select.select([primary], [], [], 0.5)[0]:
                continue
            try:
                out += os.read(primary, 1 << 16)
            except OSError:  # the process closed the terminal
                break
    finally:
        p.send_signal(signal.SIGINT)
        # Keep reading while it exits: a full terminal would block its last writes.
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.1)[0]:
                try:
                    os.read(primary, 1 << 16)
                except OSError:
                    break
        p.wait(timeout=5)
        os.close(primary)
        assert p.stderr is not None
        p.stderr.close()
    screens = out.decode(errors="replace").split("\x1b[H")[1:]
    assert len(screens) >= 3, out[-500:]
    for screen in screens[:-1]:
        lines = screen.replace("\r", "").split("\n")
        assert lines[-1].startswith("\x1b[J")  # the rest of the last screen erased
        assert len(lines) - 1 <= 11  # one line short of the terminal: no scrolling
        assert "every 0.2s" in lines[0] and "\x1b[1m" in lines[0]  # the header, bold
        assert "more lines" in lines[-2]
        assert all(line.endswith("\x1b[K") for line in lines[:-1])


def test_bad_scenario_and_bad_flags_are_one_line_errors(sim: SimMachine, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"index": 0}]}')
    env = {**sim.env, "GPUWARDEN_SIM": str(bad)}
    for args in (["status"], ["leaks"], ["doctor"], ["reap"]):
        r = sim.cli(*args, env=env)
        assert r.returncode == 3 and "missing field 'memory_total'" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    for args in (
        ["status", "--gpu", "7"],
        ["leaks", "--threshold", "12X"],
        ["reap", "--grace", "soon"],
        ["status", "--watch", "-1"],
    ):
        r = sim.cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_reap_of_holder_that_allocated_nothing_stops_when_it_is_gone(sim: SimMachine) -> None:
    holder = sim.job("--hold-only", "--seconds", "60", gpus="1")
    wait_for(lambda: any(lk["pid"] == holder.pid for lk in _leaks(sim)))
    started = time.monotonic()
    r = sim.cli("reap", "--gpu", "1", "--yes", "--samples", "1", "--grace", "2")
    took = time.monotonic() - started
    assert r.returncode == 0, r.stdout + r.stderr
    assert took < 15, f"waited {took:.1f}s for memory a process never held"
    assert holder.wait(timeout=5) != 0
    assert "not yet" not in r.stdout
    assert "Next steps" not in r.stdout, "nothing is still held: no next steps"
    assert "gone" in r.stdout
