"""``daemon stop`` returns once the daemon has exited, even while it is a zombie that
its parent has not reaped yet (containers whose init reaps once a second)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import make_env


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_stop_counts_an_unreaped_daemon_as_stopped(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="gw-"))  # a socket path under 108 bytes
    home = short / "home"
    home.mkdir()
    (home / "config.toml").write_text('interval = "100ms"\n')
    env = make_env(tmp_path, EXAMPLES / "idle-2gpu.json")
    env["GPUWARDEN_HOME"] = str(home)
    # The daemon is this test's child, so it stays a zombie until the test reaps it.
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "daemon", "start", "--foreground"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: (home / "gpuwarden.sock").exists(), 30, what="the socket")
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "daemon", "stop", "--timeout", "5s"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert f"gpuwarden daemon (pid {daemon.pid}) stopped" in r.stdout
        assert _state(daemon.pid) == "Z", "the daemon was reaped before stop looked"
    finally:
        daemon.kill()
        daemon.wait()
        shutil.rmtree(short, ignore_errors=True)
