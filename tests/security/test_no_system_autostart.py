"""A client never starts the system daemon unasked: root with no GPUWARDEN_HOME (system
mode, no /etc/gpuwarden/config.toml) gets one line on how to start it. Run in a new PID
and mount namespace with tmpfs over /run and /var/lib, so a daemon started by mistake
writes nothing on the host and dies with the namespace. (A user without GPUWARDEN_HOME
still gets a user-mode daemon on demand, as the README says.)"""

from __future__ import annotations

import os
import subprocess

import pytest

from gpuwarden.client.paths import SYSTEM_CONFIG
from tests.helpers.paths import EXAMPLES, SRC
from tests.integration.daemon_fixture import PY
from tests.security.conftest import pid_namespace_works

SCENARIO = EXAMPLES / "idle-2gpu.json"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_"))}
    env.update(GPUWARDEN_SIM=str(SCENARIO), PYTHONPATH=str(SRC), **extra)
    return env


def test_root_without_a_home_does_not_start_the_system_daemon() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: system mode is root's")
    if SYSTEM_CONFIG.exists():
        pytest.skip(f"{SYSTEM_CONFIG} exists: this machine has a system daemon")
    if not pid_namespace_works():
        pytest.skip("needs unshare --pid --mount")
    script = (
        "mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/lib || exit 99\n"
        '"$0" -m gpuwarden ps; echo "rc=$?"\n'
        "if [ -e /var/lib/gpuwarden ] || [ -e /run/gpuwarden.sock ]; then "
        "echo STARTED; fi\n"
    )
    r = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            PY,
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "rc=99" not in r.stdout, r.stderr
    assert "STARTED" not in r.stdout, (r.stdout, r.stderr)
    assert "rc=0" not in r.stdout and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    [line] = r.stderr.strip().splitlines()
    assert "/run/gpuwarden.sock" in line and "gpuwarden daemon start" in line, line
    assert "deploy/systemd/gpuwarden.service" in line, line
