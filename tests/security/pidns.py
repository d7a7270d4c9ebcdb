"""Attacks that need a pid to be reused, made deterministic: a scenario runs as root in
a new PID namespace (``unshare --pid --fork --mount-proc``), where it may write
``/proc/sys/kernel/ns_last_pid`` so that the next process forked gets the pid it wants.
Everything of the scenario — the daemon, the users' processes — lives in that
namespace and dies with it.

``run(target, args)`` runs ``target`` ("module:function", called with ``args``) there
and returns the JSON object it returned."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.helpers.paths import ROOT, SRC

PY = sys.executable
RESULT = "RESULT "


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str

    @property
    def prefix(self) -> tuple[str, ...]:
        """argv prefix that runs a command as this user."""
        return ("setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups")


def run(target: str, args: dict[str, Any], timeout: float = 240) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{SRC}"}
    r = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            PY,
            "-m",
            "tests.security.pidns",
            target,
            json.dumps(args),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(RESULT)]
    assert r.returncode == 0 and lines, f"scenario {target} failed:\n{r.stdout}\n{r.stderr}"
    return dict(json.loads(lines[-1][len(RESULT) :]))


def user(data: dict[str, Any]) -> User:
    return User(**data)


def users_args(*users: User) -> list[dict[str, Any]]:
    return [asdict(u) for u in users]


def env_of(daemon_env: dict[str, str], u: User) -> dict[str, str]:
    """What the user's shell would have: their HOME, USER; the daemon's home and the
    simulated machine; nothing else of root's."""
    env = {
        k: v
        for k, v in daemon_env.items()
        if k
        in ("PATH", "PYTHONPATH", "GPUWARDEN_HOME", "GPUWARDEN_SIM", "GPUWARDEN_SIM_STATE", "LANG")
    }
    env.update(HOME=u.home, USER=u.name, LOGNAME=u.name)
    return env


def spawn_with_pid(pid: int, u: User, argv: list[str], tries: int = 20) -> psutil.Process:
    """Start ``argv`` as user ``u`` with exactly ``pid``, orphaned (its parent, the leader
    of its own session, exits at once) as a detached worker would be."""
    for _ in range(tries):
        r, w = os.pipe()
        helper = os.fork()
        if helper == 0:  # the parent that leaves: a session leader, then the user
            try:
                os.close(w)
                os.setsid()
                os.setgroups([])
                os.setgid(u.gid)
                os.setuid(u.uid)
                os.read(r, 1)
                if os.fork() == 0:
                    os.execvp(argv[0], argv)
            finally:
                os._exit(0)
        os.close(r)
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        os.write(w, b"x")
        os.close(w)
        os.waitpid(helper, 0)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.uids().real == u.uid and p.cmdline() == argv:
                    return p
            time.sleep(0.02)
        time.sleep(0.1)  # another fork took the pid first: try again
    raise AssertionError(f"could not start {argv} with pid {pid}")


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _main() -> None:
    assert os.getpid() == 1, "run this through unshare --pid --fork --mount-proc"
    target, raw = sys.argv[1], sys.argv[2]
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    out = fn(json.loads(raw))
    print(RESULT + json.dumps(out), flush=True)


def tmp_home() -> Path:
    """A directory the scenario's users may reach (the simulated machine's state is
    written by their jobs)."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="gw-sec-"))
    os.chmod(tmp, 0o755)
    for sub in ("sim", "sim/alloc", "sim/dev"):
        (tmp / sub).mkdir()
        os.chmod(tmp / sub, 0o1777)
    return tmp


if __name__ == "__main__":
    _main()
