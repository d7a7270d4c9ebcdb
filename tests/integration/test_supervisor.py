"""The per-job supervisor with real processes: exit codes, logs, cancel of a whole tree
(including a grandchild that escaped with setsid), timeout, SIGKILL after grace, start
failures, surviving its launcher, privilege drop to a real user, CPU affinity."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import gpuwarden
from gpuwarden.gpus.model import GpuFacts
from gpuwarden.jobs.jobdir import (
    CHILD,
    EXIT,
    SUPERVISOR,
    ExitInfo,
    SupervisorError,
    SupervisorHandle,
    SupervisorSpec,
    read_status,
    write_spec,
)
from gpuwarden.launch import Host, plan_launch
from gpuwarden.supervisor.control import alive, cancel
from gpuwarden.supervisor.spawn import spawn_supervisor, spec_from_plan
from tests.helpers.procs import end_process
from tests.helpers.wait import wait_for

SRC = Path(gpuwarden.__file__).resolve().parent.parent
PY = sys.executable
JOB_ENV = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONUNBUFFERED": "1", "LC_ALL": "C"}


def launcher_env() -> dict[str, str]:
    """The environment the supervisor itself starts with: gpuwarden importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return env


class Jobs:
    """Runs jobs under supervisors; ends any left over when the test is done."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.handles: list[SupervisorHandle] = []
        self.count = 0

    def spec(self, argv: list[str], **kw: Any) -> Path:
        self.count += 1
        jobdir = self.root / f"job{self.count}"
        fields: dict[str, Any] = {
            "job": self.count,
            "argv": tuple(argv),
            "env": dict(JOB_ENV),
            "cwd": str(self.root),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "groups": tuple(os.getgroups()),
        }
        fields.update(kw)
        write_spec(jobdir, SupervisorSpec(**fields))
        return jobdir

    def spawn(self, jobdir: Path) -> SupervisorHandle:
        handle = spawn_supervisor(jobdir, env=launcher_env())
        self.handles.append(handle)
        return handle

    def start(self, argv: list[str], **kw: Any) -> tuple[Path, SupervisorHandle]:
        jobdir = self.spec(argv, **kw)
        return jobdir, self.spawn(jobdir)

    def run(self, argv: list[str], wait: float = 30, **kw: Any) -> tuple[Path, ExitInfo]:
        jobdir, _ = self.start(argv, **kw)
        return jobdir, wait_exit(jobdir, wait)

    def cleanup(self) -> None:
        for h in self.handles:
            if alive(h):
                os.kill(h.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for h in self.handles:
            while alive(h) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(h):
                os.kill(h.pid, signal.SIGKILL)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    j = Jobs(tmp_path)
    try:
        yield j
    finally:
        j.cleanup()


def wait_exit(jobdir: Path, timeout: float = 30) -> ExitInfo:
    log = jobdir / "supervisor.log"
    ended: ExitInfo = wait_for(
        lambda: read_status(jobdir).exit,
        timeout,
        0.02,
        until=lambda e: e is not None,
        what=lambda _: (
            f"no exit.json after {timeout}s; supervisor.log:\n"
            + (log.read_text() if log.exists() else "(none)")
        ),
    )
    return ended


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    return int(text) if text.endswith("\n") else None


def gone(pid: int, start: float) -> bool:
    """The process (pid, start time) no longer exists (a reused pid is another one)."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - start) > 0.01 or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def create_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


# A job whose child double-forks: the grandchild calls setsid (a new session, no longer
# in the command's process group) and is orphaned, so only the subreaper keeps it.
ESCAPING_TREE = textwrap.dedent("""
    import os, sys, time
    d = sys.argv[1]
    def note(name):
        with open(os.path.join(d, name + ".tmp"), "w") as f:
            f.write(f"{os.getpid()}\\n")
        os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            note("grandchild.pid")
            while True:
                time.sleep(1)
        os._exit(0)
    note("main.pid")
    while True:
        time.sleep(1)
""")

# A job (and its child) that ignore SIGTERM.
STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        while True:
            time.sleep(1)
    print(child, flush=True)
    while True:
        time.sleep(1)
""")


# ------------------------------------------------------------------------ exit codes


@pytest.mark.parametrize(
    ("argv", "code", "sig"),
    [
        (["true"], 0, None),
        ([PY, "-c", "import sys; sys.exit(3)"], 3, None),
        (
            [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"],
            128 + signal.SIGUSR1,
            signal.SIGUSR1,
        ),
    ],
    ids=["zero", "three", "signal"],
)
def test_exit_codes(jobs: Jobs, argv: list[str], code: int, sig: int | None) -> None:
    jobdir, handle = jobs.start(argv)
    ended = wait_exit(jobdir)
    assert (ended.exit_code, ended.signal, ended.reason) == (code, sig, "exited")
    assert ended.tree_clean and ended.started and ended.survivors == ()
    status = read_status(jobdir)
    assert status.supervisor == handle
    assert status.child is not None and status.child.pid != handle.pid
    wait_for(lambda: not alive(handle), what="the supervisor to exit")


def test_output_is_captured_and_private(jobs: Jobs) -> None:
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    jobdir, ended = jobs.run([PY, "-c", script])
    assert ended.exit_code == 0
    assert (jobdir / "stdout").read_text() == "to stdout\n"
    assert (jobdir / "stderr").read_text() == "to stderr\n"
    for name in ("stdout", "stderr"):
        st = (jobdir / name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


def test_argv_is_not_shell_parsed(jobs: Jobs) -> None:
    jobdir, ended = jobs.run(["echo", "$HOME", "a;b", "*"])
    assert ended.exit_code == 0
    assert (jobdir / "stdout").read_text() == "$HOME a;b *\n"


def test_background_leftovers_are_killed_when_the_command_exits(jobs: Jobs) -> None:
    jobdir, ended = jobs.run(["sh", "-c", "sleep 300 & echo $!; exit 4"])
    pid = int((jobdir / "stdout").read_text())
    assert (ended.exit_code, ended.reason, ended.tree_clean) == (4, "exited", True)
    assert not psutil.pid_exists(pid), "the background sleep is still there (or unreaped)"


# ------------------------------------------------------------- cancel, timeout, kill


def test_cancel_kills_the_whole_tree_including_an_escaped_grandchild(jobs: Jobs) -> None:
    grace = 5.0
    jobdir, handle = jobs.start([PY, "-c", ESCAPING_TREE, "."], grace=grace)
    main = wait_for(lambda: read_pid(jobdir.parent / "main.pid"), what="main.pid")
    grand = wait_for(lambda: read_pid(jobdir.parent / "grandchild.pid"), what="grandchild")
    starts = {main: create_time(main), grand: create_time(grand)}
    # The grandchild is in another session (and process group) than the command and,
    # once its parent exited, a child of the supervisor (the subreaper), not of init.
    assert os.getsid(grand) != os.getsid(main) and os.getpgid(grand) != os.getpgid(main)
    wait_for(lambda: psutil.Process(grand).ppid() == handle.pid, what="re-parenting")

    t0 = time.monotonic()
    assert cancel(jobdir)
    ended = wait_exit(jobdir, timeout=grace + 10)
    took = time.monotonic() - t0
    assert ended.reason == "cancelled"
    assert (ended.exit_code, ended.signal) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert ended.tree_clean and ended.survivors == ()
    assert took < grace, f"the tree took {took:.1f}s to die of SIGTERM"
    assert all(gone(pid, start) for pid, start in starts.items())
    wait_for(lambda: not alive(handle), what="the supervisor to exit")
    assert not cancel(jobdir)  # ended: nothing to signal


def test_sigterm_ignored_means_sigkill_after_grace(jobs: Jobs) -> None:
    grace = 1.0
    jobdir, _ = jobs.start([PY, "-c", STUBBORN], grace=grace)
    child = wait_for(lambda: read_pid(jobdir / "stdout"), what="the job to be ready")
    main = read_status(jobdir).child
    assert main is not None
    starts = {main.pid: main.start_time, child: create_time(child)}
    t0 = time.monotonic()
    assert cancel(jobdir)
    ended = wait_exit(jobdir, timeout=grace + 15)
    took = time.monotonic() - t0
    assert (ended.exit_code, ended.signal) == (128 + signal.SIGKILL, signal.SIGKILL)
    assert ended.reason == "cancelled" and ended.tree_clean
    assert grace <= took < grace + 5
    assert all(gone(pid, start) for pid, start in starts.items())


def test_timeout_ends_the_job(jobs: Jobs) -> None:
    t0 = time.monotonic()
    _, ended = jobs.run(["sleep", "60"], wait=20, timeout=1.0)
    took = time.monotonic() - t0
    assert ended.reason == "timeout"
    assert (ended.exit_code, ended.signal) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert 1.0 <= took < 10


# ------------------------------------------------------------------- start failures


def test_command_not_found(jobs: Jobs) -> None:
    jobdir, ended = jobs.run(["gpuwarden-no-such-command-xyz", "arg"])
    assert ended.exit_code == 127
    assert ended.reason == "command not found: gpuwarden-no-such-command-xyz"
    assert not ended.started and ended.tree_clean
    assert not (jobdir / CHILD).exists()


def test_command_not_executable(jobs: Jobs, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    jobdir, ended = jobs.run([str(script)])
    assert ended.exit_code == 126
    assert ended.reason.startswith("command not executable:")
    assert not (jobdir / CHILD).exists()


def test_missing_working_directory(jobs: Jobs, tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    jobdir, ended = jobs.run(["true"], cwd=missing)
    assert ended.exit_code == 127
    assert ended.reason == f"working directory not found: {missing}"
    assert not (jobdir / CHILD).exists()


def test_a_job_never_starts_twice(jobs: Jobs) -> None:
    jobdir, _ = jobs.run(["true"])
    before = (jobdir / EXIT).read_text()
    with pytest.raises(SupervisorError, match="refusing"):
        spawn_supervisor(jobdir, env=launcher_env())
    # child.json alone (a supervisor that died before writing anything else) also refuses
    other = jobs.spec(["true"])
    (other / CHILD).write_text('{"pid": 1, "start_time": 0}')
    with pytest.raises(SupervisorError, match="refusing"):
        spawn_supervisor(other, env=launcher_env())
    assert (jobdir / EXIT).read_text() == before
    assert not (other / SUPERVISOR).exists()


def test_bad_spec_is_a_clear_error(jobs: Jobs, tmp_path: Path) -> None:
    jobdir = tmp_path / "bad"
    jobdir.mkdir()
    (jobdir / "spec.json").write_text(
        json.dumps({"job": 1, "argv": [], "env": {}, "cwd": "/", "uid": 0, "gid": 0})
    )
    with pytest.raises(SupervisorError, match="empty command"):
        spawn_supervisor(jobdir, env=launcher_env())
    with pytest.raises(SupervisorError, match=r"spec\.json"):
        spawn_supervisor(tmp_path / "absent", env=launcher_env())


def test_read_status_tolerates_partial_files(tmp_path: Path) -> None:
    (tmp_path / SUPERVISOR).write_text('{"pid": 12, "start_')
    (tmp_path / CHILD).write_text("[1, 2]")
    (tmp_path / EXIT).write_text('{"exit_code": 0}')
    status = read_status(tmp_path)
    assert (status.supervisor, status.child, status.exit) == (None, None, None)
    assert read_status(tmp_path / "absent") == status
    assert not cancel(tmp_path)


# -------------------------------------------------------------- restart safety


LAUNCHER = textwrap.dedent("""
    import json, sys, time
    from gpuwarden.supervisor.spawn import spawn_supervisor
    h = spawn_supervisor(sys.argv[1])
    print(json.dumps({"pid": h.pid, "start_time": h.start_time, "boot_id": h.boot_id,
                      "start_ticks": h.start_ticks}), flush=True)
    time.sleep(600)
""")


def test_supervisor_outlives_its_launcher(jobs: Jobs) -> None:
    jobdir = jobs.spec([PY, "-c", "import time; time.sleep(2); raise SystemExit(5)"])
    launcher = subprocess.Popen(
        [PY, "-c", LAUNCHER, str(jobdir)], env=launcher_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        handle = SupervisorHandle(**json.loads(launcher.stdout.readline()))
        jobs.handles.append(handle)
        assert psutil.Process(handle.pid).ppid() != launcher.pid
        launcher.kill()  # the daemon dies with SIGKILL
        launcher.wait()
        assert alive(handle)
        ended = wait_exit(jobdir, timeout=30)
    finally:
        end_process(launcher)
    assert (ended.exit_code, ended.reason, ended.tree_clean) == (5, "exited", True)
    assert read_status(jobdir).supervisor == handle


def test_a_killed_supervisor_takes_its_command_along(jobs: Jobs) -> None:
    """SIGKILL of the supervisor itself cannot be handled; the command then gets SIGKILL
    (parent-death signal) rather than running on unsupervised."""
    jobdir, handle = jobs.start(["sleep", "300"])
    child = wait_for(lambda: read_status(jobdir).child, what="child.json")
    os.kill(handle.pid, signal.SIGKILL)
    wait_for(lambda: gone(child.pid, child.start_time), what="the command to die")
    assert read_status(jobdir).exit is None  # nobody recorded an end: the daemon sees
    assert not alive(handle)  # a dead supervisor without exit.json


# ----------------------------------------------------------------- launch facts


def test_cpu_affinity_is_applied(jobs: Jobs) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    want = [allowed[-1]]
    jobdir, ended = jobs.run(
        [PY, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], cpus=frozenset(want)
    )
    assert ended.exit_code == 0 and ended.warnings == ()
    assert json.loads((jobdir / "stdout").read_text()) == want


def test_spec_from_a_launch_plan(jobs: Jobs) -> None:
    """The daemon plans with gpuwarden.launch; the supervisor runs exactly that plan."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    gpus = [
        GpuFacts(
            index=i,
            uuid=f"GPU-{i}",
            name="Test",
            memory_total=1 << 34,
            memory_used=0,
            memory_free=1 << 34,
            numa_node=None,
            cpus=str(cpu),
        )
        for i in (1, 0)
    ]
    host = Host(allowed_cpus=frozenset(os.sched_getaffinity(0)), numactl=None, numa_nodes=None)
    show = (
        "import json, os; print(json.dumps([os.environ.get(k) for k in "
        "('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'GPUWARDEN_MEM_LIMIT')]"
        " + [sorted(os.sched_getaffinity(0))]))"
    )
    command = [PY, "-c", show]
    plan = plan_launch(command, gpus, base_env=JOB_ENV, host=host, mem_limit=1 << 30)
    spec = spec_from_plan(
        7, plan, command, cwd="/", uid=os.getuid(), gid=os.getgid(), groups=os.getgroups(), grace=2
    )
    assert spec.numactl_prefix == () and spec.cpus == frozenset({cpu})
    jobdir = jobs.root / "planned"
    write_spec(jobdir, spec)
    jobs.spawn(jobdir)
    ended = wait_exit(jobdir)
    assert ended.exit_code == 0
    out = json.loads((jobdir / "stdout").read_text())
    assert out == ["1,0", "PCI_BUS_ID", str(1 << 30), [cpu]]


# ------------------------------------------------------------------ privileges


@pytest.fixture
def test_user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a real Unix user and drops privileges to it")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs useradd/userdel to create a real Unix user")
    name = f"gpuwarden-test-{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", name], check=True, capture_output=True
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def test_job_runs_as_its_user(jobs: Jobs, test_user: pwd.struct_passwd) -> None:
    uid, gid = test_user.pw_uid, test_user.pw_gid
    extra = 4242 if gid != 4242 else 4243
    jobdir, ended = jobs.run(
        ["/bin/sh", "-c", "id -u; id -g; id -G"], cwd="/", uid=uid, gid=gid, groups=(gid, extra)
    )
    assert ended.exit_code == 0, (jobdir / "stderr").read_text()
    lines = (jobdir / "stdout").read_text().split("\n")
    assert int(lines[0]) == uid and int(lines[1]) == gid
    assert {int(g) for g in lines[2].split()} == {gid, extra}
    for name in ("stdout", "stderr"):
        st = (jobdir / name).stat()
        assert (st.st_uid, st.st_gid) == (uid, gid)
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0, "logs readable by others"


def test_job_cannot_regain_root(jobs: Jobs, test_user: pwd.struct_passwd) -> None:
    uid, gid = test_user.pw_uid, test_user.pw_gid
    python = "/usr/bin/python3"  # one every user may run (not a venv under /root)
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is not installed")
    script = "import os; os.setuid(0)"
    jobdir, ended = jobs.run([python, "-I", "-c", script], cwd="/", uid=uid, gid=gid, groups=(gid,))
    assert ended.exit_code == 1
    assert "PermissionError" in (jobdir / "stderr").read_text()


def test_cwd_is_entered_as_the_user(
    jobs: Jobs, test_user: pwd.struct_passwd, tmp_path: Path
) -> None:
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    _, ended = jobs.run(
        ["true"], cwd=str(private), uid=test_user.pw_uid, gid=test_user.pw_gid, groups=()
    )
    assert ended.exit_code == 126
    assert ended.reason.startswith("working directory not usable:")
    assert not ended.started


def test_a_removed_job_directory_lets_the_supervisor_go(jobs: Jobs) -> None:
    """Nobody can read an end recorded in a directory that is gone: the supervisor does
    not linger for an hour retrying it (a full disk, by contrast, may clear)."""
    jobdir, handle = jobs.start(["sleep", "3"])  # still running while its files go
    wait_for(lambda: read_status(jobdir).child, what="child.json")
    shutil.rmtree(jobdir)
    wait_for(lambda: not alive(handle), 20, what="the supervisor to go")
