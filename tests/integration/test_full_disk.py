"""A full disk under the state directory (logs and database on one small tmpfs), filled by
a job's runaway log: requests fail with a clear error instead of killing the daemon, the
running job's end is kept by its supervisor until it can be recorded, and once space is
freed everything carries on with an intact database."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, start_daemon

# Writes ~16 MiB of output: more than the 4 MiB file system holds.
FLOOD = (
    "import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 1023 + '\\n')\n"
    "sys.stdout.flush()\n"
)


@pytest.fixture
def small_home(tmp_path: Path) -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted: list[Path] = []

    def mount(home: Path) -> None:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(home)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
        mounted.append(home)

    try:
        yield from start_daemon(
            tmp_path, EXAMPLES / "idle-2gpu.json", 'release_timeout = "1s"\n', prepare=mount
        )
    finally:
        for home in mounted:
            for _ in range(50):
                if (
                    subprocess.run(
                        ["umount", str(home)], capture_output=True, check=False
                    ).returncode
                    == 0
                ):
                    break
                time.sleep(0.1)
            shutil.rmtree(home.parent, ignore_errors=True)


def _full(path: Path) -> bool:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize < 64 * 1024


def test_a_full_disk_fails_requests_cleanly_and_nothing_is_lost(small_home: Daemon) -> None:
    from gpuwarden.client.paths import DB_NAME
    from gpuwarden.daemon.store import Store

    d = small_home
    running = d.submit("--mem", "1G", cmd=[PY, "-c", "import time; time.sleep(2)"])
    d.wait_state(running, "running")
    # A job's log fills the disk (as a runaway job's would).
    flood = d.submit("--mem", "1G", cmd=[PY, "-c", FLOOD])
    assert wait_for(lambda: _full(d.home), 30), "the flood did not fill the disk"
    time.sleep(3)  # the running job ends meanwhile; its end cannot be written yet

    # Requests: a clear one-line error or an answer, never a dead daemon.
    r = d.cli("submit", "--mem", "1G", "--", "true")
    print("submit on a full disk:", r.returncode, r.stdout.strip(), r.stderr.strip())
    assert "Traceback" not in r.stderr
    if r.returncode != 0:  # the daemon's trouble, not bad input: exit 3, one line
        assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "cannot do that now" in r.stderr and "disk is full" in r.stderr, r.stderr
    assert d.cli("ps", "--all").returncode == 0
    assert d.pid() is not None and d.cli("daemon", "status").returncode == 0

    # An admin empties the runaway log: every end is recorded (the supervisor retries
    # its exit record with a backoff of up to 30 s), nothing ran twice, the database is
    # sound.
    for log in (d.home / "jobs" / str(flood)).glob("attempt-*/std*"):
        log.write_bytes(b"")
    d.wait_state(running, "succeeded", timeout=90)
    flooded = d.wait_state(flood, "succeeded", "failed", timeout=90)
    print("flood:", flooded["state"], flooded["reason"], [e["kind"] for e in flooded["events"]])
    assert flooded["exit_code"] is not None
    ok = d.submit("--mem", "1G", cmd=[PY, "-c", "print('after')"])
    assert d.cli("wait", str(ok), timeout=60).returncode == 0
    with Store(d.home / DB_NAME) as store:
        assert store.integrity() == "ok" and store.audit() == []
