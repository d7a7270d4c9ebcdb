"""What nvidia-smi, pueue and Slurm users script with: ``ps --state/--sort/--format
csv/--watch`` against a real daemon, ``status --format csv`` on a simulated machine."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time

from gpuwarden.observe.jsonview import SCHEMA_VERSION
from tests.helpers.paths import EXAMPLES
from tests.helpers.procs import end_process
from tests.helpers.sim import SimMachine
from tests.integration.daemon_fixture import PY, Daemon


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _queue(daemon: Daemon) -> tuple[int, int, int, int]:
    """A succeeded job (1G), a running one (4G), and behind it a held (3G) and a queued
    (2G) one."""
    done = daemon.submit("--mem", "1G", "--name", "done")
    daemon.wait_state(done, "succeeded")
    running = daemon.submit("--mem", "4G", cmd=[PY, "-m", "gpuwarden.sim.job", "--seconds", "60"])
    held = daemon.submit("--mem", "3G", "--after", str(running))
    daemon.cli("hold", str(held), check=True)
    waiting = daemon.submit("--mem", "2G", "--after", str(running))
    daemon.wait_state(running, "running")
    return done, running, held, waiting


def test_ps_filters_by_state_sorts_and_prints_csv(daemon: Daemon) -> None:
    done, running, held, waiting = _queue(daemon)
    jobs = daemon.json("ps", "--state", "held,succeeded")["jobs"]
    assert sorted(j["id"] for j in jobs) == [done, held]  # ended ones too, without --all
    assert [j["id"] for j in daemon.json("ps", "--state", "held", "--state", "queued")["jobs"]] == [
        held,
        waiting,
    ]
    assert [j["id"] for j in daemon.json("ps", "--all", "--sort", "-mem")["jobs"]] == [
        running,
        held,
        waiting,
        done,
    ]
    assert [j["id"] for j in daemon.json("ps", "--all", "--sort", "state")["jobs"]] == [
        waiting,
        held,
        running,
        done,
    ]
    r = daemon.cli("ps", "--state", "nosuch")
    assert r.returncode == 2 and "unknown state 'nosuch'" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = daemon.cli("ps", "--sort", "size")
    assert r.returncode == 2 and "unknown sort key" in r.stderr

    out = daemon.cli("ps", "--all", "--format", "csv", check=True).stdout
    assert out.splitlines()[0] == (
        "id,user,name,group,state,gpus,mem,peak_memory,"
        "submitted_at,started_at,ended_at,exit_code,restart,"
        "restarts,task,reason,command"
    )
    rows = {int(r["id"]): r for r in _rows(out)}
    assert set(rows) == {done, running, held, waiting}
    assert rows[held]["mem"] == str(3 << 30) and rows[held]["state"] == "held"
    assert rows[done]["exit_code"] == "0" and rows[waiting]["exit_code"] == ""
    assert (rows[done]["restart"], rows[done]["restarts"]) == ("", "0")  # not a service
    assert rows[done]["command"].startswith(PY + " -m gpuwarden.sim.job")


def test_ps_watch_refreshes_with_a_header_saying_when_and_how_often(daemon: Daemon) -> None:
    daemon.submit(
        "--mem", "1G", "--name", "sleeper", cmd=[PY, "-m", "gpuwarden.sim.job", "--seconds", "60"]
    )
    for args, check in (
        (["ps", "--watch", "200ms"], "gpuwarden ps · every 0.2s · "),
        (["ps", "--json", "--watch", "0.2"], '{"jobs":['),
    ):
        p = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", *args],
            env=daemon.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stdout is not None
            seen: list[str] = []
            deadline = time.monotonic() + 30
            while sum(line.startswith(check) for line in seen) < 2:
                assert time.monotonic() < deadline and p.poll() is None, (seen, p.stderr)
                seen.append(p.stdout.readline())
            if args[1] == "--json":
                assert json.loads(seen[0])["jobs"][0]["name"] == "sleeper"
            else:
                assert any("sleeper" in line for line in seen)
        finally:
            end_process(p)
    r = daemon.cli("ps", "--format", "csv", "--watch")
    assert r.returncode == 2 and "not CSV" in r.stderr


def test_status_csv_has_the_json_keys_as_columns(sim: SimMachine) -> None:
    m = SimMachine(EXAMPLES / "leaky-4gpu.json", sim.state)
    doc = m.json("status")
    assert doc["schema"] == SCHEMA_VERSION
    gpus = _rows(m.cli("status", "--format", "csv", check=True).stdout)
    keys = [k for k in doc["gpus"][0] if k != "processes"]
    assert list(gpus[0]) == keys  # one definition: the JSON's names and units
    assert [int(g["index"]) for g in gpus] == [g["index"] for g in doc["gpus"]]
    assert gpus[1]["memory_total"] == str(doc["gpus"][1]["memory_total"])
    assert gpus[1]["persistence_mode"] == "false"
    procs = _rows(m.cli("status", "--format", "csv", "--processes", check=True).stdout)
    assert list(procs[0]) == ["gpu", *doc["gpus"][0]["processes"][0]]
    assert len(procs) == sum(len(g["processes"]) for g in doc["gpus"])
    assert {(int(p["gpu"]), int(p["pid"]), int(p["memory"])) for p in procs} == {
        (g["index"], p["pid"], p["memory"]) for g in doc["gpus"] for p in g["processes"]
    }
    r = m.cli("status", "--processes")
    assert r.returncode == 2 and "--format csv" in r.stderr


def test_status_watch_header_shows_the_interval_and_the_time(sim: SimMachine) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "status", "--watch", "300ms"],
        env=sim.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "gpuwarden status · every 0.3s · " in line, line
        stamp = line.rsplit("· ", 1)[1].strip()
        assert time.strptime(stamp, "%Y-%m-%d %H:%M:%S")
    finally:
        end_process(p)


def test_ps_o_chooses_the_columns_of_the_table_and_the_csv(daemon: Daemon) -> None:
    done = daemon.submit("--mem", "1G", "--name", "first")
    daemon.wait_state(done, "succeeded")
    lines = daemon.cli("ps", "--all", "-o", "id,state,mem,name", check=True).stdout
    assert lines.splitlines() == ["ID  STATE      MEM   NAME", f"{done:<2}  succeeded  1.0G  first"]
    out = daemon.cli("ps", "--all", "--format", "csv", "--columns", "state,id", check=True).stdout
    assert out.splitlines() == ["state,id", f"succeeded,{done}"]
    r = daemon.cli("ps", "-o", "id,colour")
    assert r.returncode == 2 and "unknown column 'colour'" in r.stderr
    assert daemon.cli("ps", "-o", "id", "--json").returncode == 2
