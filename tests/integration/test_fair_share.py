"""Fair share on a real daemon over the simulated machine, with two real users (root and
nobody): with ``fairshare_halflife`` set, a job of the user who used nothing starts
before an earlier job of equal priority whose user holds a GPU; ``show`` and ``ps`` say
why. Off (the default), the earlier job goes first."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import PY, Daemon, start_daemon

SIM = [PY, "-m", "gpuwarden.sim.job", "--mem", "1G"]
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv to act as another user",
)


@pytest.fixture(params=["7d", "0"])
def fair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Daemon, bool]]:
    for d in start_daemon(
        tmp_path, EXAMPLES / "idle-2gpu.json", config=f'fairshare_halflife = "{request.param}"\n'
    ):
        yield d, request.param != "0"


def test_the_user_who_used_less_goes_first(fair: tuple[Daemon, bool]) -> None:
    daemon, on = fair
    env = {**daemon.env, "HOME": "/tmp"}
    probe = subprocess.run(
        [*NOBODY, PY, "-c", "import gpuwarden"], env=env, capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip(f"another user cannot run this test's Python: {probe.stderr}")
    one_gpu = ("--gpu-ids", "0", "--mem", "20G")  # one job at a time on GPU 0
    first = daemon.submit(*one_gpu, cmd=[*SIM, "--seconds", "4"])
    daemon.wait_state(first, "running")
    mine = daemon.submit(*one_gpu, cmd=[*SIM, "--seconds", "0"])
    theirs = int(
        daemon.cli(
            "submit", *one_gpu, "--", "true", env=env, prefix=NOBODY, check=True
        ).stdout.strip()
    )  # its budget books GPU 0 alike
    shown = daemon.cli("show", str(mine), check=True).stdout
    table = daemon.cli("ps", check=True).stdout
    if on:
        assert "fair share root used " in shown and "GiB·h lately" in shown, shown
        assert "[fair share " in table, table
    else:
        assert "fair share" not in shown + table
    done = [daemon.wait_state(j, "succeeded", timeout=60) for j in (mine, theirs)]
    mine_started, theirs_started = (j["started_at"] for j in done)
    if on:  # root holds GPU 0 (its usage grows); nobody has used nothing
        assert theirs_started < mine_started, done
    else:
        assert mine_started < theirs_started, done
