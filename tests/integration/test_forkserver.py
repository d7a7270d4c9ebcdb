"""The fork server starts supervisors like a fresh interpreter would, only faster: the
job runs and is recorded, starts are never doubled, a dead helper is replaced, and the
helper leaves nothing of itself (socket, ignored signals) in the job."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpuwarden.jobs.jobdir import SupervisorError, SupervisorSpec, read_status, write_spec
from gpuwarden.supervisor.forkserver import ForkServer
from tests.helpers.wait import wait_for
from tests.integration.test_supervisor import JOB_ENV, launcher_env

PY = sys.executable

PROBE = """
import json, os, signal, sys
fds = {}
for fd in os.listdir('/proc/self/fd'):
    try:
        fds[fd] = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        pass
print(json.dumps({"fds": fds, "sigint": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                  "ppid": os.getppid()}))
"""


@pytest.fixture
def server() -> Iterator[ForkServer]:
    fs = ForkServer(env=launcher_env())
    yield fs
    fs.close()


def spec(root: Path, n: int, argv: list[str]) -> Path:
    d = root / f"job{n}"
    write_spec(
        d,
        SupervisorSpec(
            job=n,
            argv=tuple(argv),
            env=dict(JOB_ENV),
            cwd=str(root),
            uid=os.getuid(),
            gid=os.getgid(),
            groups=tuple(os.getgroups()),
        ),
    )
    return d


def finished(d: Path) -> dict[str, object]:
    assert wait_for(lambda: read_status(d).exit is not None, 20), f"{d} did not finish"
    ex = read_status(d).exit
    assert ex is not None
    return {"code": ex.exit_code, "reason": ex.reason}


def test_jobs_run_and_are_recorded(server: ForkServer, tmp_path: Path) -> None:
    dirs = [spec(tmp_path, n, [PY, "-c", f"import sys; sys.exit({n})"]) for n in range(1, 6)]
    handles = [server.spawn(d) for d in dirs]
    assert len({h.pid for h in handles}) == 5
    for n, d in enumerate(dirs, 1):
        assert finished(d) == {"code": n, "reason": "exited"}


def test_the_job_inherits_nothing_from_the_helper(server: ForkServer, tmp_path: Path) -> None:
    d = spec(tmp_path, 1, [PY, "-c", PROBE])
    handle = server.spawn(d)
    assert finished(d)["code"] == 0
    seen = json.loads((d / "stdout").read_text())
    assert not any(t.startswith("socket:") for t in seen["fds"].values()), seen["fds"]
    assert set(seen["fds"]) <= {"0", "1", "2", "3"}  # 3: at most the probe's own listdir
    assert seen["sigint"] is False
    assert seen["ppid"] == handle.pid  # the supervisor, not the helper
    assert handle.pid != server.pid


def test_a_job_is_never_started_twice(server: ForkServer, tmp_path: Path) -> None:
    d = spec(tmp_path, 1, [PY, "-c", "pass"])
    server.spawn(d)
    with pytest.raises(SupervisorError, match=r"refusing to start it again|owns this job"):
        server.spawn(d)
    assert finished(d)["code"] == 0


def test_bad_spec_is_a_clear_error(server: ForkServer, tmp_path: Path) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "spec.json").write_text("{not json")
    with pytest.raises(SupervisorError, match="spec"):
        server.spawn(d)
    # The helper survives a failed start.
    ok = spec(tmp_path, 2, [PY, "-c", "pass"])
    server.spawn(ok)
    assert finished(ok)["code"] == 0


def test_a_killed_helper_is_replaced(server: ForkServer, tmp_path: Path) -> None:
    server.warm()
    first = server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert wait_for(
        lambda: (
            not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        ),
        5,
    )
    d = spec(tmp_path, 1, [PY, "-c", "pass"])
    server.spawn(d)
    assert server.pid not in (None, first)
    assert finished(d)["code"] == 0


def test_the_helper_exits_with_the_daemon_end(tmp_path: Path) -> None:
    fs = ForkServer(env=launcher_env())
    fs.warm()
    pid = fs.pid
    assert pid is not None
    d = spec(tmp_path, 1, [PY, "-c", "import time; time.sleep(0.5)"])
    handle = fs.spawn(d)
    assert fs._proc is not None and fs._sock is not None and fs._file is not None
    fs._file.close()
    fs._sock.close()  # what a dying daemon does: its end closes
    fs._proc.wait(5)  # the helper noticed and exited by itself
    fs._proc = fs._sock = fs._file = None
    assert psutil.pid_exists(handle.pid)  # the job's supervisor lives on
    assert finished(d)["code"] == 0


def test_supervisors_come_from_the_helper_not_a_fresh_interpreter(
    server: ForkServer, tmp_path: Path
) -> None:
    """A fork of the helper carries its command line; a fresh interpreter (the fallback)
    would carry the supervisor module's."""
    server.warm()
    helper = server.pid
    d = spec(tmp_path, 1, [PY, "-c", "import time; time.sleep(1)"])
    handle = server.spawn(d)
    cmdline = psutil.Process(handle.pid).cmdline()
    assert "gpuwarden.supervisor.forkserver" in cmdline, cmdline
    assert server.pid == helper  # the same helper served it
    assert psutil.Process(handle.pid).name() == "gw-sup-1"
    assert finished(d)["code"] == 0


def test_a_helper_dying_mid_launch_queues_the_job_again(tmp_path: Path) -> None:
    """The daemon's helper dies with a launch request unanswered (stopped, then killed):
    the attempt is voided, which proves nothing of the job ran, so the job is queued
    again and runs on a fresh helper instead of failing."""
    from tests.helpers.paths import EXAMPLES
    from tests.integration.daemon_fixture import start_daemon

    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json"):
        pid = d.pid()
        assert pid is not None

        def helper(daemon_pid: int = pid) -> psutil.Process | None:
            for p in psutil.Process(daemon_pid).children():
                if "gpuwarden.supervisor.forkserver" in " ".join(p.cmdline()):
                    return p
            return None

        assert wait_for(lambda: helper() is not None, 20)
        h = helper()
        assert h is not None
        h.suspend()
        try:
            job = d.submit("--cwd", "/", cmd=["true"])
            spec_json = d.home / "jobs" / str(job) / "attempt-0" / "spec.json"
            assert wait_for(spec_json.exists, 20)
            time.sleep(0.3)  # the request is on the socket, unanswered
        finally:
            h.kill()
        j = d.wait_state(job, "succeeded", "failed")
        kinds = [e["kind"] for e in j["events"]]
        assert j["state"] == "succeeded", j["events"]
        assert "requeued" in kinds and j["attempts"] == 1, j["events"]
        assert "launch_failed" not in kinds
        claim = json.loads((spec_json.parent / "supervisor.json").read_text())
        assert claim.get("void") is True and not spec_json.exists()
