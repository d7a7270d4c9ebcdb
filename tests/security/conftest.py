"""Two throwaway Unix users for the attacks (A, whose jobs run; B, another user), and
the checks every test here needs: root, the account tools, and a new PID namespace."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.helpers.paths import SRC
from tests.integration.daemon_fixture import PY
from tests.security.pidns import User


def _tools_missing() -> str | None:
    missing = [t for t in ("useradd", "userdel", "setpriv", "unshare") if not shutil.which(t)]
    return f"needs {', '.join(missing)}" if missing else None


def pid_namespace_works() -> bool:
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
    )
    return r.returncode == 0


@pytest.fixture(scope="session")
def users() -> Iterator[tuple[User, User]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates Unix users and runs a root daemon")
    why = _tools_missing()
    if why:
        pytest.skip(why)
    tag = secrets.token_hex(4)
    names = [f"gw-{tag}-{role}" for role in ("a", "b")]
    made: list[str] = []
    try:
        for name in names:
            subprocess.run(
                ["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name],
                check=True,
                capture_output=True,
                timeout=60,
            )
            made.append(name)
        a, b = (_user(n) for n in names)
        probe = subprocess.run(
            [*a.prefix, PY, "-c", "import click, psutil, gpuwarden"],
            env={"PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if probe.returncode != 0:
            pytest.skip(f"a new user cannot run this test's Python ({PY}): {probe.stderr}")
        yield a, b
    finally:
        uids = set()
        for name in made:
            with contextlib.suppress(KeyError):
                uids.add(pwd.getpwnam(name).pw_uid)
        for p in psutil.process_iter(["uids"]):
            if p.info["uids"] is not None and p.info["uids"].real in uids:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        time.sleep(0.2)
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True, timeout=60)


def _user(name: str) -> User:
    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


@pytest.fixture
def pidns_ok() -> None:
    """Skip unless this machine lets root make a new PID namespace."""
    if not pid_namespace_works():
        pytest.skip("unshare --pid --fork --mount-proc does not work here")
