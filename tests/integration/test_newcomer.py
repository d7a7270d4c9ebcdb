"""What a new user trips over, through the real CLI on simulated machines: typos taken
as commands, sizes without units, wrong exit codes, tracebacks instead of one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers.procs import end_process
from tests.helpers.sim import SimMachine
from tests.integration.daemon_fixture import PY, Daemon

GiB = 1 << 30


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one line a user error prints (no traceback)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_an_unknown_option_before_the_command_is_an_error(daemon: Daemon, sim: SimMachine) -> None:
    r = daemon.cli("submit", "--memm", "1G", "--", "true")
    assert r.returncode == 2 and "No such option '--memm'" in r.stderr, r.stderr
    assert daemon.json("ps", "--all")["jobs"] == []  # nothing was queued
    r = sim.cli("exec", "--mem", "1G", "--bogus", "--", "true")
    assert r.returncode == 2 and "No such option '--bogus'" in r.stderr, r.stderr
    # Options after the command are still the command's own.
    jid = daemon.submit(
        "--mem", "1G", cmd=[PY, "-c", "import sys; print(sys.argv[1:])", "--memm", "-v"]
    )
    assert daemon.cli("wait", str(jid)).returncode == 0
    assert daemon.cli("logs", str(jid), check=True).stdout == "['--memm', '-v']\n"


def test_a_size_without_a_unit_is_an_error_that_suggests_one(
    daemon: Daemon, sim: SimMachine
) -> None:
    r = daemon.cli("submit", "--mem", "20", "--", "true")
    assert r.returncode == 2 and "give a unit, e.g. 20G" in one_line(r)
    r = sim.cli("select", "--mem", "1")
    assert r.returncode == 2 and "give a unit, e.g. 1G" in one_line(r)
    r = sim.cli("leaks", "--threshold", "100")
    assert r.returncode == 2 and "give a unit, e.g. 100G" in r.stderr, r.stderr
    assert daemon.json("ps", "--all")["jobs"] == []


def test_submit_mem_takes_a_fraction_of_a_gpu(daemon: Daemon) -> None:
    jid = daemon.submit("--mem", "0.5", cmd=[PY, "-c", "pass"])
    half = daemon.job(jid)["mem"]
    # Half of what one 24 GiB GPU can give a job: its total less the daemon's reserve
    # (and whatever else placement keeps back), not 0.5 bytes.
    assert 11 * GiB < half <= 12 * GiB, half
    r = daemon.cli("submit", "--mem", "1.5", "--", "true")
    assert r.returncode == 2 and "(0, 1]" in one_line(r)
    r = daemon.cli("submit", "--json", "--mem", "0.25", "--", "true")
    assert abs(json.loads(r.stdout)["mem"] * 2 - half) <= 1


def test_wait_with_timeout_0_on_an_ended_job_exits_with_its_code(daemon: Daemon) -> None:
    ok = daemon.submit("--mem", "1G", cmd=[PY, "-c", "pass"])
    bad = daemon.submit("--mem", "1G", cmd=[PY, "-c", "raise SystemExit(3)"])
    daemon.wait_state(ok, "succeeded")
    daemon.wait_state(bad, "failed")
    assert daemon.cli("wait", str(ok), "--timeout", "0").returncode == 0
    assert daemon.cli("wait", str(bad), "--timeout", "0").returncode == 3
    slow = daemon.submit("--mem", "1G", cmd=[PY, "-c", "import time; time.sleep(30)"])
    r = daemon.cli("wait", str(slow), "--timeout", "0")
    assert r.returncode == 124, r.stderr
    daemon.cli("cancel", str(slow), check=True)


def test_rm_refuses_a_job_that_has_not_ended_in_one_line(daemon: Daemon) -> None:
    first = daemon.submit("--mem", "1G", cmd=[PY, "-c", "import time; time.sleep(30)"])
    queued = daemon.submit("--after", str(first), cmd=[PY, "-c", "pass"])
    for jid, state in ((first, "running"), (queued, "queued")):
        daemon.wait_state(jid, state)
        r = daemon.cli("rm", str(jid))
        assert r.returncode == 2
        assert one_line(r) == (
            f"gpuwarden: error: job {jid} is {state}; cancel it before removing it"
        )
        assert daemon.job(jid)["state"] == state
    held = daemon.submit("--after", str(first), cmd=[PY, "-c", "pass"])
    daemon.cli("hold", str(held), check=True)
    r = daemon.cli("rm", str(held))
    assert r.returncode == 2 and f"job {held} is held; cancel it" in one_line(r)
    # The help says so.
    assert "is refused: cancel it first" in " ".join(
        daemon.cli("rm", "--help", check=True).stdout.split()
    )
    assert "cancel waiting ones first" in daemon.cli("--help", check=True).stdout
    daemon.cli("cancel", str(first), str(queued), str(held), check=True)


def _scrape(sim: SimMachine, *args: str) -> str:
    """One scrape of ``gpuwarden exporter ARGS`` on a free port."""
    import urllib.request

    from tests.helpers.wait import wait_for
    from tests.integration.daemon_fixture import free_port

    port = free_port()
    proc = subprocess.Popen(
        [PY, "-m", "gpuwarden", "exporter", "--listen", f"127.0.0.1:{port}", *args],
        env=sim.env,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def get() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return None

    try:
        text = wait_for(get, 20)
        assert text, "the exporter did not come up"
        return str(text)
    finally:
        proc.terminate()
        proc.wait(10)


def test_exporter_without_the_holder_scan_leaves_the_hidden_holder_series_out(
    make_sim: Any,
) -> None:
    sim = make_sim("leaky-4gpu.json")  # bob's notebook holds /dev/nvidia2, NVML lists it not
    assert 'gpuwarden_gpu_hidden_holders{gpu="2"} 1.0' in _scrape(sim)
    text = _scrape(sim, "--no-holders")
    assert "gpuwarden_gpu_memory_total_bytes" in text
    assert "gpuwarden_gpu_hidden_holders" not in text  # not 0: nothing was scanned
    assert 'kind="hidden_holder"' not in text


def test_what_used_to_be_a_traceback_is_one_line(make_sim: Any, tmp_path: Path) -> None:
    sim = make_sim("idle-2gpu.json")
    r = sim.cli("leaks", "--interval", "99999999999d", "--samples", "2")
    assert r.returncode == 2 and "invalid duration" in one_line(r)
    env = {**sim.env, "GPUWARDEN_HOME": "/etc/passwd"}
    for args in (("daemon", "start"), ("ps",)):
        r = sim.cli(*args, env=env)
        assert r.returncode != 0 and "/etc/passwd" in one_line(r), args
    hot = make_sim({"gpus": [{"index": 0, "memory_total": "24G", "temperature": "hot"}]})
    for args in (("status",), ("exporter", "--listen", "127.0.0.1:0")):
        r = hot.cli(*args, timeout=20)
        assert r.returncode == 3 and "gpus[0].temperature" in one_line(r), args
    raw = tmp_path / "raw.json"
    raw.write_bytes(b'{"gpus": [{"memory_total": "24G", "name": "\xff"}]}')
    r = sim.cli("status", env={**sim.env, "GPUWARDEN_SIM": str(raw)})
    assert r.returncode == 3 and "not UTF-8" in one_line(r)


def test_durations_take_units_everywhere(sim: SimMachine, tmp_path: Path) -> None:
    # status --watch 2s refreshes (it runs until stopped: a timeout ends it)
    p = subprocess.Popen(
        [PY, "-m", "gpuwarden", "status", "--json", "--watch", "200ms"],
        env=sim.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        docs = [json.loads(p.stdout.readline()) for _ in range(3)]  # one JSON per refresh
        assert all(len(d["gpus"]) == 2 for d in docs)
    finally:
        end_process(p)
    for bad in ("-1", "0", "2x"):
        r = sim.cli("status", "--watch", bad)
        line = one_line(r)
        assert r.returncode == 2 and line.startswith("gpuwarden: error: "), line
        assert "--watch" in line or "negative" in line, line
    home = {**sim.env, "GPUWARDEN_HOME": str(tmp_path / "home")}
    r = sim.cli("daemon", "stop", "--timeout", "5s", env=home)
    assert r.returncode == 0 and "not running" in r.stdout, r.stderr
    r = sim.cli("daemon", "stop", "--timeout", "5x", env=home)
    assert r.returncode == 2 and "invalid duration" in one_line(r)


def test_a_busy_port_is_one_line(sim: SimMachine) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = f"127.0.0.1:{s.getsockname()[1]}"
        r = sim.cli("exporter", "--listen", busy, timeout=20)
    assert r.returncode == 2
    assert one_line(r) == f"gpuwarden: error: cannot listen on {busy}: Address already in use"


def test_the_readme_says_what_the_code_and_the_makefile_do() -> None:
    import re

    from gpuwarden.cli.doctor import EXIT_CRITICAL
    from tests.helpers.paths import ROOT

    readme = (ROOT / "README.md").read_text()
    said = re.search(r"gpuwarden doctor .*exit (\d+) if critical", readme)
    assert said and int(said.group(1)) == EXIT_CRITICAL, said
    extra = re.search(r"pip install -q -e '(\.\[[a-z,]+\])'", (ROOT / "Makefile").read_text())
    assert extra and f"pip install -e '{extra.group(1)}'" in " ".join(readme.split())
    # The tests that skip without these say where to get them; so does the README.
    for needle in ("promtool", "prometheus", "chromium-driver", ".ci/run"):
        assert needle in readme.split("## Everyday use")[0], needle


def test_messages_name_a_job_once(daemon: Daemon) -> None:
    running = daemon.submit(
        "--mem", "1G", "--group", "g", cmd=[PY, "-c", "import time; time.sleep(30)"]
    )
    daemon.wait_state(running, "running")
    queued = daemon.submit("--after", str(running), cmd=[PY, "-c", "pass"])
    r = daemon.cli("hold", str(running))
    assert r.returncode == 2
    assert one_line(r) == (
        f"gpuwarden: error: job {running} is running; only a queued job can be held"
    )
    assert daemon.cli("cancel", str(queued), check=True).stdout == f"job {queued} cancelled\n"
    r = daemon.cli("cancel", str(running))
    assert r.returncode == 0
    assert r.stdout == f"job {running}: stopping (SIGTERM, then SIGKILL after its grace period)\n"
    r = daemon.cli("wait", str(running))
    assert one_line(r) == f"job {running} cancelled", r.stderr  # not "cancelled: cancelled"
    r = daemon.cli("cancel", "--group", "nosuch")
    assert r.returncode == 2
    assert one_line(r) == "gpuwarden: error: no waiting or running job of yours in group 'nosuch'"
    assert daemon.cli("rm", str(queued), check=True).stdout == f"job {queued} removed\n"


def test_a_job_that_can_never_run_here_is_refused_at_submit(tmp_path: Path) -> None:
    from tests.helpers.paths import EXAMPLES
    from tests.integration.daemon_fixture import start_daemon

    run = start_daemon(
        tmp_path,
        EXAMPLES / "idle-2gpu.json",  # 2 x 24 GiB
        config='[limits]\nmax_memory = "10G"\nmax_gpus = 1\n',
    )
    d = next(run)
    try:
        for args, words in (
            (["--mem", "40G"], "more than this machine can give"),
            (["--gpus", "3", "--mem", "1G"], "needs 3 GPUs"),
            (["--mem", "12G"], "may reserve 10.0GiB; this job needs 12.0GiB"),
            (["--gpus", "2", "--mem", "1G"], "may hold 1 GPU(s)"),
        ):
            r = d.cli("submit", *args, "--", "true")
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            line = one_line(r)
            assert line.startswith("gpuwarden: error: this job can never run here: "), line
            assert words in line, (args, line)
        assert d.json("ps", "--all")["jobs"] == []  # nothing queued to wait for ever
        assert d.cli("wait", str(d.submit("--mem", "8G", cmd=[PY, "-c", "pass"]))).returncode == 0
    finally:
        run.close()
