"""``gpuwarden gpu drain``/``undrain`` on a real daemon over the simulated 2 x 24 GiB
machine: a drained GPU gets no new placement (a job that may use only it waits, saying
so), its running job finishes, undrain restores it; only root or an admin may drain."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import PY, Daemon, http_request, raw_http

SIM = [PY, "-m", "gpuwarden.sim.job"]


def test_a_drained_gpu_gets_no_placement_and_undrain_restores_it(daemon: Daemon) -> None:
    running = daemon.submit(
        "--mem", "2G", "--gpu-ids", "0", cmd=[*SIM, "--mem", "1G", "--seconds", "5"]
    )
    assert daemon.wait_state(running, "running")["gpus"] == [0]
    r = daemon.cli("gpu", "drain", "0", "--reason", "ECC errors", check=True)
    assert "GPU 0 drained" in r.stdout
    drains = json.loads(daemon.cli("gpu", "drains", "--json", check=True).stdout)["drains"]
    assert [(d["gpu"], d["reason"], d["by"]) for d in drains] == [(0, "ECC errors", "root")]

    pinned = daemon.submit("--mem", "2G", "--gpu-ids", "0", cmd=[*SIM, "--seconds", "0"])
    reason = daemon.wait_reason(pinned, "drained", timeout=20)["reason"]
    assert "GPU 0: drained (ECC errors)" in reason, reason
    free = [daemon.submit("--mem", "2G", cmd=[*SIM, "--seconds", "0"]) for _ in range(3)]
    for jid in free:  # each would fit on GPU 0 beside the running job: only GPU 1 is used
        daemon.cli("wait", str(jid), timeout=60)
        j = daemon.job(jid)
        assert j["state"] == "succeeded" and j["gpus"] == [1], j

    code, body = raw_http(daemon.socket, http_request("GET", "/ui/data/overview?hours=1"))
    assert code == 200 and json.loads(body)["drains"] == [{"gpu": 0, "reason": "ECC errors"}]
    ps = daemon.cli("ps", check=True).stdout
    assert "GPU 0 drained by root (ECC errors): no new placement there" in ps, ps
    status = daemon.cli("status", check=True, env={**daemon.env, "COLUMNS": "200"}).stdout
    assert "GPU 0 drained by root (ECC errors)" in status, status

    # The running job finishes where it is; the pinned one still waits.
    assert daemon.cli("wait", str(running), timeout=60).returncode == 0
    assert daemon.job(running)["gpus"] == [0]
    time.sleep(0.5)
    assert daemon.job(pinned)["state"] == "queued"

    r = daemon.cli("gpu", "undrain", "0", check=True)
    assert "GPU 0 undrained" in r.stdout
    daemon.cli("wait", str(pinned), timeout=60)
    j = daemon.job(pinned)
    assert j["state"] == "succeeded" and j["gpus"] == [0], j
    assert json.loads(daemon.cli("gpu", "drains", "--json", check=True).stdout) == {"drains": []}
    assert "drained" not in daemon.cli("ps", check=True).stdout

    for args, said in (
        (("gpu", "undrain", "0"), "GPU 0 is not drained"),
        (("gpu", "drain", "7"), "no GPU with index 7"),
        (("gpu", "drain", "x"), "'x' is not a valid integer"),
    ):
        bad = daemon.cli(*args)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
        assert said in bad.stderr, bad.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv to act as another user",
)
def test_only_root_or_an_admin_may_drain(daemon: Daemon) -> None:
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    probe = subprocess.run(
        [*nobody, PY, "-c", "import gpuwarden"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"another user cannot run this test's Python: {probe.stderr}")
    daemon.cli("gpu", "drain", "1", check=True)
    for verb in ("drain", "undrain"):
        r = daemon.cli("gpu", verb, "1", prefix=nobody)
        assert r.returncode == 4 and len(r.stderr.splitlines()) == 1, r.stderr
        assert f"only root or an admin may {verb} a GPU" in r.stderr
    # Anyone may see which GPUs are drained.
    r = daemon.cli("gpu", "drains", prefix=nobody, check=True)
    assert "GPU 1 drained by root" in r.stdout
    assert [
        d["gpu"]
        for d in json.loads(daemon.cli("gpu", "drains", "--json", check=True).stdout)["drains"]
    ] == [1]


def test_doctor_suggests_draining_a_gpu_with_ecc_errors(tmp_path: Path) -> None:
    scenario = json.loads((EXAMPLES / "idle-2gpu.json").read_text())
    scenario["gpus"][1]["ecc_uncorrected"] = 3
    path = tmp_path / "ecc.json"
    path.write_text(json.dumps(scenario))
    env = {**os.environ, "GPUWARDEN_SIM": str(path), "GPUWARDEN_SIM_STATE": str(tmp_path / "s")}
    r = subprocess.run(
        [PY, "-m", "gpuwarden", "doctor", "--json", "--samples", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(r.stdout)["findings"]
    [f] = [f for f in findings if f["rule"] == "ecc_uncorrected"]
    assert f["gpu"] == 1
    assert "gpuwarden gpu drain 1 --reason 'ECC errors'" in f["remedy"], f
    assert "gpuwarden gpu undrain 1" in f["remedy"]
