"""Invariant 4 with real Unix users: identity comes from the kernel (SO_PEERCRED), jobs run
as their submitter, and only the owner, root or a member of a configured admin group
may cancel, hold, release, retry, remove, read the logs of, or see the environment of a
job; everyone sees the queue.

A root daemon (as in production) serves three throwaway users created for the module:
A submits, B is a stranger, C is in the admin group named in the daemon's config.toml.
Each user runs the real CLI (or a raw HTTP request over the socket) through ``setpriv``
with their own uid, gid and supplementary groups. Needs root (CI runs the tests as
root); skipped otherwise, with the reason."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.paths import EXAMPLES, SRC
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon, start_daemon

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="needs root: creates Unix users and runs a "
        "root daemon that drops privileges (CI runs the tests as root)",
    ),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("useradd", "userdel", "groupadd", "groupdel", "setpriv")),
        reason="needs useradd, userdel, groupadd, groupdel and setpriv",
    ),
]

# Job commands are plain programs found on PATH: argv[0] must be one the users can reach
# (this test's Python may live under root's 0700 home, e.g. with pyenv).
SLEEP = ["sleep", "300"]
PRIVATE = "gw_private_value_7f3a"  # an env value only A (and admins) may see


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path
    groups: tuple[int, ...]

    @property
    def prefix(self) -> tuple[str, ...]:
        """argv prefix that runs a command as this user, with their supplementary groups."""
        return ("setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups")


@dataclass(frozen=True)
class Users:
    a: User
    b: User
    admin: User
    admin_group: str


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)


def _user(name: str) -> User:
    pw = pwd.getpwnam(name)
    groups = tuple(sorted(os.getgrouplist(name, pw.pw_gid)))
    return User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), groups)


def _kill_processes_of(uids: set[int]) -> None:
    """Whatever the test users still run (a job that outlived a failed test) goes, so
    that userdel can remove them."""
    for p in psutil.process_iter(["uids"]):
        uids_of = p.info["uids"]
        if uids_of is not None and uids_of.real in uids:
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    tag = secrets.token_hex(4)
    group = f"gw-admins-{tag}"
    names = [f"gw-{tag}-{role}" for role in ("a", "b", "c")]
    made: list[str] = []
    group_made = False
    try:
        _run("groupadd", group)
        group_made = True
        for name in names:
            _run("useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name)
            made.append(name)
        _run("usermod", "-a", "-G", group, names[2])
        a, b, c = (_user(n) for n in names)
        probe = subprocess.run(
            [*a.prefix, PY, "-c", "import click, psutil, gpuwarden"],
            env={"PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if probe.returncode != 0:
            pytest.skip(f"a new user cannot run this test's Python ({PY}): {probe.stderr}")
        assert grp.getgrnam(group).gr_gid in c.groups
        yield Users(a, b, c, group)
    finally:
        uids = set()
        for name in made:
            with contextlib.suppress(KeyError):
                uids.add(pwd.getpwnam(name).pw_uid)
        _kill_processes_of(uids)
        time.sleep(0.2)
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True, timeout=60)
        if group_made:
            subprocess.run(["groupdel", group], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def root_daemon(users: Users, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon run by root, as in production, with C's group as its admin group."""
    tmp = tmp_path_factory.mktemp("security")
    yield from start_daemon(
        tmp, EXAMPLES / "idle-2gpu.json", config=f'admin_groups = ["{users.admin_group}"]\n'
    )


def env_of(daemon: Daemon, user: User, **extra: str) -> dict[str, str]:
    """What the user's login shell would have: their HOME, USER, LOGNAME; the daemon's
    GPUWARDEN_HOME; nothing of root's but PATH and the source tree."""
    env = {
        k: v
        for k, v in daemon.env.items()
        if k in ("PATH", "PYTHONPATH", "GPUWARDEN_HOME", "GPUWARDEN_SIM", "LANG")
    }
    env.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name, **extra)
    return env


def cli_as(
    daemon: Daemon, user: User, *args: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    return daemon.cli(*args, env=env_of(daemon, user, **extra), prefix=user.prefix)


def json_as(daemon: Daemon, user: User, *args: str) -> Any:
    r = cli_as(daemon, user, *args, "--json")
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return json.loads(r.stdout)


def submit_as(daemon: Daemon, user: User, cmd: list[str], *opts: str, **extra: str) -> int:
    r = cli_as(daemon, user, "submit", "--cwd", str(user.home), *opts, "--", *cmd, **extra)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def python_as(user: User, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*user.prefix, PY, "-c", code, *args],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(SRC), "HOME": str(user.home)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_denied(r: subprocess.CompletedProcess[str], job_id: int) -> None:
    """A refusal: non-zero exit, one line on stderr saying whose job it is, no traceback."""
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"job {job_id}" in lines[0] and "only its owner or an admin" in lines[0], lines[0]


# ----------------------------------------------------------------------------- tests


def test_other_users_can_connect_but_not_read_the_state(root_daemon: Daemon, users: Users) -> None:
    sock = root_daemon.socket
    assert stat.S_IMODE(sock.stat().st_mode) & 0o006 == 0o006  # anyone may connect
    for d in (sock.parent, *sock.parents):
        if d == Path("/"):
            break
        assert stat.S_IMODE(d.stat().st_mode) & 0o001, f"{d} is not traversable by others"
    r = cli_as(root_daemon, users.b, "daemon", "status")
    assert r.returncode == 0, r.stderr
    # The database holds every job's environment: others must not read it directly.
    state = root_daemon.home / "state.db"
    assert state.exists()
    for path in (state, state.with_name("state.db-wal"), state.with_name("state.db-shm")):
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    r = python_as(users.b, "import sys; open(sys.argv[1], 'rb').read(1)", str(state))
    assert r.returncode != 0 and "PermissionError" in r.stderr
    jobs_dir = root_daemon.home / "jobs"
    assert stat.S_IMODE(jobs_dir.stat().st_mode) & 0o004 == 0  # nobody lists the job dirs


def test_a_job_runs_as_its_submitter(root_daemon: Daemon, users: Users) -> None:
    a = users.a
    jid = submit_as(root_daemon, a, ["id", "-u"])
    jid2 = submit_as(root_daemon, a, ["grep", "-E", "^(Uid|Gid|Groups):", "/proc/self/status"])
    jid3 = submit_as(root_daemon, a, ["pwd"])
    for j in (jid, jid2, jid3):
        r = cli_as(root_daemon, a, "wait", str(j))
        assert r.returncode == 0, r.stderr
    assert cli_as(root_daemon, a, "logs", str(jid)).stdout == f"{a.uid}\n"
    # Real, effective, saved and filesystem ids all A's; A's groups and no others.
    status = dict(
        line.split(":", 1) for line in cli_as(root_daemon, a, "logs", str(jid2)).stdout.splitlines()
    )
    assert status["Uid"].split() == [str(a.uid)] * 4, status
    assert status["Gid"].split() == [str(a.gid)] * 4, status
    assert sorted(map(int, status["Groups"].split())) == sorted(a.groups), status
    assert cli_as(root_daemon, a, "logs", str(jid3)).stdout == f"{a.home}\n"
    job = json_as(root_daemon, a, "show", str(jid))
    assert job["user"] == a.name and job["uid"] == a.uid and job["state"] == "succeeded"
    # Root's own job runs as root: the drop is to the submitter, not to a fixed user.
    rid = root_daemon.submit(cmd=["id", "-u"])
    assert root_daemon.cli("wait", str(rid)).returncode == 0
    assert root_daemon.cli("logs", str(rid)).stdout == "0\n"


def test_job_logs_on_disk_are_the_owners_alone(root_daemon: Daemon, users: Users) -> None:
    a, b = users.a, users.b
    jid = submit_as(root_daemon, a, ["sh", "-c", "echo secret out; echo secret err >&2"])
    assert cli_as(root_daemon, a, "wait", str(jid)).returncode == 0
    files = [p for p in (root_daemon.home / "jobs" / str(jid)).rglob("*") if p.is_file()]
    logs = [p for p in files if p.name in ("stdout", "stderr")]
    assert len(logs) == 2, files
    for path in logs:
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600, (path, oct(st.st_mode))
        assert (st.st_uid, st.st_gid) == (a.uid, a.gid), path
        r = python_as(b, "import sys; print(open(sys.argv[1]).read())", str(path))
        assert r.returncode != 0 and "secret" not in r.stdout, r.stdout
        assert "PermissionError" in r.stderr
    # The job's spec holds its environment: root's alone, in a directory only root enters.
    spec = next(p for p in files if p.name == "spec.json")
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600 and spec.stat().st_uid == 0
    assert stat.S_IMODE(spec.parent.stat().st_mode) & 0o077 == 0
    assert cli_as(root_daemon, a, "logs", "--stderr", str(jid)).stdout == "secret err\n"


def test_everyone_sees_the_queue_but_only_the_owner_the_job(
    root_daemon: Daemon, users: Users
) -> None:
    a, b = users.a, users.b
    running = submit_as(
        root_daemon,
        a,
        SLEEP,
        "--mem",
        "2G",
        "--name",
        "a-train",
        "--group",
        "a-grp",
        A_SETTING=PRIVATE,
    )
    queued = submit_as(
        root_daemon, a, SLEEP, "--after", str(running), "--name", "a-next", "--group", "a-grp"
    )
    root_daemon.wait_state(running, "running")

    # B sees the queue: user, name, GPUs, memory, state, in JSON and as a table.
    seen = {j["id"]: j for j in json_as(root_daemon, b, "ps")["jobs"]}
    assert {running, queued} <= set(seen)
    j = seen[running]
    assert (j["user"], j["name"], j["state"], j["mem"]) == (a.name, "a-train", "running", 2 << 30)
    assert len(j["gpus"]) == 1
    assert seen[queued]["state"] == "queued"
    table = cli_as(root_daemon, b, "ps").stdout
    assert a.name in table and "a-train" in table
    assert "env" not in j and PRIVATE not in json.dumps(seen)

    # show: B sees the job but not its environment; A (and admin C) see it.
    shown = json_as(root_daemon, b, "show", str(running))
    assert shown["user"] == a.name and "env" not in shown
    assert PRIVATE not in cli_as(root_daemon, b, "show", str(running), "--json").stdout
    assert json_as(root_daemon, a, "show", str(running))["env"]["A_SETTING"] == PRIVATE
    assert json_as(root_daemon, users.admin, "show", str(running))["env"]["A_SETTING"] == PRIVATE

    # B may change nothing of A's and read none of its output.
    for verb in ("cancel", "hold", "release", "retry", "rm"):
        assert_denied(cli_as(root_daemon, b, verb, str(queued)), queued)
        assert_denied(cli_as(root_daemon, b, verb, str(running)), running)
    for args in (
        ("logs", str(running)),
        ("logs", "--stderr", str(running)),
        ("logs", "-f", str(running)),
    ):
        assert_denied(cli_as(root_daemon, b, *args), running)
    assert cli_as(root_daemon, b, "cancel", "--group", "a-grp").returncode != 0
    assert root_daemon.job(running)["state"] == "running"
    assert root_daemon.job(queued)["state"] == "queued"

    # A may: hold and release its queued job, cancel both.
    assert json_as(root_daemon, a, "hold", str(queued))["jobs"][0]["state"] == "held"
    assert_denied(cli_as(root_daemon, b, "release", str(queued)), queued)
    assert json_as(root_daemon, a, "release", str(queued))["jobs"][0]["state"] == "queued"
    r = cli_as(root_daemon, a, "cancel", str(queued), str(running))
    assert r.returncode == 0, r.stderr
    root_daemon.wait_state(running, "cancelled")
    assert root_daemon.job(queued)["state"] == "cancelled"

    # Ended jobs: B can neither retry, remove nor clean them away; A can.
    assert_denied(cli_as(root_daemon, b, "retry", str(queued)), queued)
    assert_denied(cli_as(root_daemon, b, "rm", str(queued)), queued)
    assert json_as(root_daemon, b, "clean", "--older-than", "0s")["removed"] == 0
    assert root_daemon.job(queued)["state"] == "cancelled"
    assert json_as(root_daemon, a, "retry", str(running))["jobs"][0]["state"] in (
        "queued",
        "reserved",
        "running",
    )
    assert cli_as(root_daemon, a, "cancel", str(running)).returncode == 0
    assert cli_as(root_daemon, a, "rm", str(queued)).returncode == 0
    assert root_daemon.cli("show", str(queued)).returncode != 0


def test_root_and_admin_group_members_may_manage_any_job(root_daemon: Daemon, users: Users) -> None:
    a, c = users.a, users.admin
    by_admin = submit_as(
        root_daemon, a, ["sh", "-c", "echo hello admin; exec sleep 300"], "--mem", "1G"
    )
    by_root = submit_as(root_daemon, a, SLEEP, "--mem", "1G")
    root_daemon.wait_state(by_admin, "running")
    root_daemon.wait_state(by_root, "running")
    wait_for(
        lambda: cli_as(root_daemon, c, "logs", str(by_admin)).stdout == "hello admin\n",
        20,
        0.2,
        what=lambda _: "the admin could not read the job's log",
    )
    r = cli_as(root_daemon, c, "cancel", str(by_admin))
    assert r.returncode == 0, r.stderr
    job = root_daemon.wait_state(by_admin, "cancelled")
    assert any(
        e["kind"] == "cancel_requested" and c.name in (e["detail"] or "") for e in job["events"]
    )
    r = root_daemon.cli("cancel", str(by_root))
    assert r.returncode == 0, r.stderr
    root_daemon.wait_state(by_root, "cancelled")
    # The admin group is what counts: the same user without it is a stranger.
    r = subprocess.run(
        [
            "setpriv",
            f"--reuid={c.uid}",
            f"--regid={c.gid}",
            "--clear-groups",
            PY,
            "-m",
            "gpuwarden",
            "rm",
            str(by_admin),
        ],
        env=env_of(root_daemon, c),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_denied(r, by_admin)
    assert cli_as(root_daemon, c, "rm", str(by_admin)).returncode == 0


_RAW_SUBMIT = r"""
import json, socket, sys
sock, body, extra = sys.argv[1], sys.argv[2].encode(), json.loads(sys.argv[3])
head = ["POST /v1/jobs HTTP/1.1", "Host: localhost", "Connection: close",
        "Content-Type: application/json", f"Content-Length: {len(body)}"]
head += [f"{k}: {v}" for k, v in extra.items()]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock)
s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": payload.decode()}))
"""


def _raw_submit_as(
    daemon: Daemon, user: User, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, str]:
    r = python_as(
        user, _RAW_SUBMIT, str(daemon.socket), json.dumps(body), json.dumps(headers or {})
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["status"], out["body"]


def test_a_forged_identity_in_the_request_is_rejected_or_ignored(
    root_daemon: Daemon, users: Users
) -> None:
    a = users.a
    before = {j["id"] for j in root_daemon.json("ps", "--all")["jobs"]}
    cmd = {
        "command": ["id", "-u"],
        "cwd": str(a.home),
        "env": {"PATH": "/usr/bin:/bin", "HOME": str(a.home)},
    }
    # Identity fields in the body: refused, and no job is made.
    for forged in (
        {"user": "root"},
        {"uid": 0},
        {"uid": 0, "gid": 0, "groups": [0]},
        {"user": users.b.name, "uid": users.b.uid},
    ):
        status, body = _raw_submit_as(root_daemon, a, {**cmd, **forged})
        assert status == 400 and "unknown field" in json.loads(body)["error"], body
    assert {j["id"] for j in root_daemon.json("ps", "--all")["jobs"]} == before
    # Identity claims in headers: ignored; the job is A's and runs as A.
    status, body = _raw_submit_as(
        root_daemon,
        a,
        cmd,
        {
            "X-Remote-User": "root",
            "X-Forwarded-User": "root",
            "Remote-User": "root",
            "Authorization": "Basic cm9vdDo=",
            "X-Uid": "0",
            "From": "root@localhost",
        },
    )
    assert status == 201, body
    job = json.loads(body)
    assert (job["user"], job["uid"]) == (a.name, a.uid)
    assert cli_as(root_daemon, a, "wait", str(job["id"])).returncode == 0
    assert cli_as(root_daemon, a, "logs", str(job["id"])).stdout == f"{a.uid}\n"
    # And the other way: root cannot be made to submit as A by claiming it either.
    status, body = _raw_submit_as(root_daemon, _root(), {**cmd, "user": a.name, "uid": a.uid})
    assert status == 400, body


def _root() -> User:
    return User("root", 0, 0, Path("/root"), (0,))


_GROUPS_THEN_REQUEST = r"""
import json, os, socket, sys
sock_path, gid, when, method, path = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
if when == "before":
    os.setgroups([gid])
elif when == "before-among-many":  # more than fit the first buffer the daemon offers
    os.setgroups([*range(70000, 70100), gid])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock_path)
if when == "after":
    os.setgroups([gid])  # the process now has the group; its connection does not
s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
          "Content-Length: 0\r\n\r\n".encode())
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": payload.decode(),
                  "groups": sorted(os.getgroups())}))
"""


def test_groups_are_the_connections_not_the_processes_later(
    root_daemon: Daemon, users: Users
) -> None:
    """The admin check must use the groups the caller had when it connected (as the kernel
    recorded them), not /proc/PID at request time: a process may gain groups later, or
    exit and have its pid reused by an admin's process. B is given CAP_SETGID (and
    nothing else) to play both parts deterministically."""
    a, b = users.a, users.b
    admin_gid = grp.getgrnam(users.admin_group).gr_gid
    jid = submit_as(root_daemon, a, SLEEP, "--mem", "1G", A_SETTING=PRIVATE)
    prefix = (
        "setpriv",
        f"--reuid={b.uid}",
        f"--regid={b.gid}",
        "--init-groups",
        "--inh-caps=+setgid",
        "--ambient-caps=+setgid",
    )

    def as_b(when: str, method: str, path: str) -> dict[str, Any]:
        r = subprocess.run(
            [
                *prefix,
                PY,
                "-c",
                _GROUPS_THEN_REQUEST,
                str(root_daemon.socket),
                str(admin_gid),
                when,
                method,
                path,
            ],
            env={"PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode != 0 and ("setpriv:" in r.stderr or "Operation not permitted" in r.stderr):
            pytest.skip(f"cannot give a test user CAP_SETGID here: {r.stderr.strip()}")
        assert r.returncode == 0, r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        assert admin_gid in out["groups"]
        return out

    # In the group when connecting: an admin, who sees the job's environment.
    for when in ("before", "before-among-many"):
        shown = as_b(when, "GET", f"/v1/jobs/{jid}")
        assert shown["status"] == 200, shown
        assert json.loads(shown["body"])["env"]["A_SETTING"] == PRIVATE, when
    # In the group only after connecting: still B, a stranger.
    shown = as_b("after", "GET", f"/v1/jobs/{jid}")
    assert shown["status"] == 200 and "env" not in json.loads(shown["body"])
    for verb in ("cancel", "hold", "retry"):
        r = as_b("after", "POST", f"/v1/jobs/{jid}/{verb}")
        assert r["status"] == 403, r
    r = as_b("after", "GET", f"/v1/jobs/{jid}/logs")
    assert r["status"] == 403, r
    assert root_daemon.job(jid)["state"] in ("reserved", "running")  # not cancelled
    assert cli_as(root_daemon, a, "cancel", str(jid)).returncode == 0
