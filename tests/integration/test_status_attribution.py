"""``status`` says who a GPU process belongs to as ``leaks`` does: the container the
scenario puts a process in (seen from another PID namespace), and, while a daemon runs,
the job of each pid as the daemon knows it (one request, skipped when none answers).
Another user's job processes: tests/security/test_status_job_ids.py."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from tests.helpers.paths import EXAMPLES
from tests.helpers.procs import end_process
from tests.helpers.sim import SimMachine
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import Daemon

CONTAINER = "docker:9c0ffee12345"


def test_status_names_the_container_leaks_attributes_a_process_to(tmp_path: Path) -> None:
    sim = SimMachine(EXAMPLES / "leaky-4gpu.json", tmp_path / "state")
    (proc,) = [p for g in sim.json("status")["gpus"] for p in g["processes"] if p["pid"] == 88]
    (leak,) = [lk for lk in sim.json("leaks", "--samples", "1")["leaks"] if lk["pid"] == 88]
    assert leak["kind"] == "other_namespace" and f"container {CONTAINER}" in leak["evidence"]
    assert proc["container"] == CONTAINER
    env = {**sim.env, "COLUMNS": "200"}
    table = sim.cli("status", env=env, check=True).stdout
    (row,) = [line for line in table.splitlines() if line.split()[1:2] == ["88"]]
    assert "docker:9c0ffee1" in row  # the column, cut to its width


def test_status_takes_job_ids_from_the_daemon(daemon: Daemon) -> None:
    d = daemon
    jid = d.submit(
        "--mem",
        "1G",
        cmd=[sys.executable, "-m", "gpuwarden.sim.job", "--mem", "1G", "--seconds", "30"],
    )
    d.wait_state(jid, "running")
    started = time.monotonic()
    procs = wait_for(
        lambda: [p for g in d.json("status")["gpus"] for p in g["processes"]],
        timeout=30,
        interval=0.1,
        what="the job to allocate",
    )
    assert [p["job"] for p in procs] == [str(jid)]
    # A process that merely claims a job in its environment is not that job's.
    env = {**d.env, "GPUWARDEN_JOB": str(jid), "CUDA_VISIBLE_DEVICES": "1"}
    import subprocess

    impostor = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.sim.job", "--mem", "1G", "--seconds", "30"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert impostor.stdout is not None and impostor.stdout.readline().startswith("ready")

        def with_impostor() -> dict[int, str | None] | None:
            jobs = {p["pid"]: p["job"] for g in d.json("status")["gpus"] for p in g["processes"]}
            return jobs if impostor.pid in jobs else None

        # The daemon's snapshot may be a second older than the impostor; both waits
        # share one minute.
        jobs = wait_for(
            with_impostor,
            timeout=started + 60 - time.monotonic(),
            interval=0.1,
            what="status to show the impostor",
        )
        assert jobs[impostor.pid] is None and list(jobs.values()).count(str(jid)) == 1
    finally:
        end_process(impostor)
    d.cli("cancel", str(jid))


def test_status_is_quick_when_no_daemon_answers(tmp_path: Path) -> None:
    sim = SimMachine(EXAMPLES / "idle-2gpu.json", tmp_path / "state")
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"gw-mute-{os.getpid()}"
    home.mkdir(exist_ok=True)
    mute = socket.socket(socket.AF_UNIX)  # listens, never answers
    try:
        mute.bind(str(home / "gpuwarden.sock"))
        mute.listen(8)
        env = {**sim.env, "GPUWARDEN_HOME": str(home)}
        started = time.monotonic()
        r = sim.cli("status", "--json", env=env)
        took = time.monotonic() - started
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert took < 5, took
    finally:
        mute.close()
        (home / "gpuwarden.sock").unlink(missing_ok=True)
        home.rmdir()
