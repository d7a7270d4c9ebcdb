"""MIG instances as devices of their own, on the simulated A100 of examples/a100-mig.json
(a 1g.10gb and a 3g.40gb instance): ``status`` lists each under its GPU with its
profile, memory, MIG- UUID and the processes NVML lists on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.gpus.sim import SimBackend
from gpuwarden.sim.scenario import ScenarioError, load_scenario
from tests.helpers.paths import EXAMPLES
from tests.helpers.sim import SimMachine
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import Daemon

SCENARIO = EXAMPLES / "a100-mig.json"
BIG, SMALL = "MIG-00000000-0000-4000-8000-00000000a102", "MIG-00000000-0000-4000-8000-00000000a109"


def test_status_lists_both_instances_under_their_gpu(tmp_path: Path) -> None:
    sim = SimMachine(SCENARIO, tmp_path / "state")
    (gpu,) = sim.json("status")["gpus"]
    assert gpu["mig_mode"] is True and gpu["utilization"] is None  # NVML: n/a in MIG mode
    insts = {m["profile"]: m for m in gpu["mig_instances"]}
    assert sorted(insts) == ["1g.10gb", "3g.40gb"]
    assert insts["3g.40gb"]["uuid"] == BIG and insts["1g.10gb"]["uuid"] == SMALL
    assert insts["3g.40gb"]["memory_total"] == 40 * 10**9
    assert insts["1g.10gb"]["memory_used"] == 6 << 30 and insts["3g.40gb"]["memory_used"] == 0
    assert insts["1g.10gb"]["processes"] == [424201] and insts["3g.40gb"]["processes"] == []
    (proc,) = gpu["processes"]
    assert proc["mig"] == SMALL
    assert gpu["memory_used"] == 6 << 30  # the GPU's memory: its instances' together
    table = sim.cli("status", check=True).stdout
    lines = table.splitlines()
    gpu_row = next(i for i, line in enumerate(lines) if "A100-SXM4-80GB" in line)
    assert "3g.40gb" in lines[gpu_row + 1] and "1g.10gb" in lines[gpu_row + 2]
    assert "6.0G/9.3G" in lines[gpu_row + 2]
    assert BIG in table and SMALL in table
    (row,) = [line for line in lines if "424201" in line]
    assert row.split()[0] == "0/9"  # GPU/GPU instance
    wide = sim.cli("status", env={**sim.env, "COLUMNS": "200"}, check=True).stdout
    (big_row,) = [line for line in wide.splitlines() if "3g.40gb" in line]
    assert BIG in big_row


def test_a_job_on_an_instance_is_charged_to_it(tmp_path: Path) -> None:
    sim = SimMachine(SCENARIO, tmp_path / "state")
    job = sim.job("--mem", "2G", "--seconds", "30", gpus=BIG)
    try:
        (gpu,) = sim.json("status")["gpus"]
        insts = {m["profile"]: m for m in gpu["mig_instances"]}
        assert insts["3g.40gb"]["processes"] == [job.pid]
        assert insts["3g.40gb"]["memory_used"] >= 2 << 30
        assert insts["1g.10gb"]["memory_used"] == 6 << 30
    finally:
        sim.cleanup()


def test_mps_is_refused_on_a_mig_gpu(tmp_path: Path) -> None:
    b = SimBackend.from_file(SCENARIO)
    with pytest.raises(Exception, match="MIG mode"):
        b.set_mps(0, True)


@pytest.mark.parametrize(
    ("gpu", "procs", "message"),
    [
        ({"mig_instances": [{"profile": "3g.40gb"}]}, [], "not in MIG mode"),
        ({"mig_mode": True, "mig_instances": [{"profile": "3g"}]}, [], "not a MIG profile"),
        (
            {"mig_mode": True, "mig_instances": [{"profile": "7g.80gb"}, {"profile": "1g.10gb"}]},
            [],
            "exceeds",
        ),
        (
            {"mig_mode": True, "mig_instances": [{"profile": "1g.10gb", "uuid": "GPU-1"}]},
            [],
            "starts with MIG-",
        ),
        (
            {"mig_mode": True, "mig_instances": [{"profile": "1g.10gb"}]},
            [{"pid": 5, "gpu": 0, "memory": "1G"}],
            "name the GPU instance id",
        ),
        (
            {"mig_mode": True, "mig_instances": [{"profile": "1g.10gb", "gi_id": 3}]},
            [{"pid": 5, "gpu": 0, "memory": "1G", "mig": 4}],
            "no MIG instance",
        ),
    ],
)
def test_bad_mig_scenarios_are_one_line_errors(
    tmp_path: Path, gpu: dict[str, object], procs: list[object], message: str
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"gpus": [{"memory_total": "80GiB", **gpu}], "processes": procs}))
    with pytest.raises(ScenarioError, match=message) as e:
        load_scenario(path)
    assert "\n" not in str(e.value)
    sim = SimMachine(path, tmp_path / "state")
    r = sim.cli("status")
    # a scenario gpuwarden cannot use is a backend it cannot open: exit 3, one line
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and message in r.stderr


def test_a_20g_job_lands_on_the_3g40gb_instance_by_its_mig_uuid(tmp_path: Path) -> None:
    sim = SimMachine(SCENARIO, tmp_path / "state")
    r = sim.cli("select", "--mem", "20G", check=True)
    assert r.stdout.strip() == BIG  # the 1g.10gb is too small; CUDA needs the MIG- UUID
    doc = sim.json("select", "--mem", "20G")
    (big,) = [c for c in doc["considered"] if c["mig"] == "3g.40gb"]
    assert big["qualifies"] and big["uuid"] == BIG and big["gi_id"] == 2
    assert not [c for c in doc["considered"] if c["mig"] is None]  # the GPU is its instances
    out = sim.cli(
        "exec",
        "--mem",
        "20G",
        "--",
        sys.executable,
        "-c",
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUWARDEN_MEM_TOTALS'])",
        check=True,
    ).stdout.split()
    assert out == [BIG, str(40 * 10**9)]
    # it really runs there: a simulated job given that UUID allocates in the instance
    job = sim.job("--mem", "20G", "--seconds", "30", gpus=r.stdout.strip())
    try:
        (gpu,) = sim.json("status")["gpus"]
        (inst,) = [m for m in gpu["mig_instances"] if m["profile"] == "3g.40gb"]
        assert inst["processes"] == [job.pid]
    finally:
        sim.cleanup()


def test_a_50g_job_is_refused_on_the_mig_gpu(tmp_path: Path) -> None:
    sim = SimMachine(SCENARIO, tmp_path / "state")
    r = sim.cli("select", "--mem", "50G")
    assert r.returncode == 2  # never fits: no instance has 50G
    assert "more than any GPU or MIG instance here has (largest: 37.3GiB)" in r.stderr
    r = sim.cli("exec", "--mem", "50G", "--", "true")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_mig_asks_for_an_instance_of_that_profile(tmp_path: Path) -> None:
    sim = SimMachine(SCENARIO, tmp_path / "state")
    assert sim.cli("select", "--mem", "2G", check=True).stdout.strip() == BIG
    assert sim.cli("select", "--mem", "2G", "--mig", "1g.10gb", check=True).stdout.strip() == SMALL
    r = sim.cli("select", "--mem", "5G", "--mig", "1g.10gb")  # 6G of its 9.3G in use
    assert r.returncode == 1 and "GPU 0/9: " in r.stderr
    r = sim.cli("select", "--mem", "1G", "--mig", "2g.20gb")
    assert r.returncode == 2 and "no 2g.20gb MIG instance here" in r.stderr
    assert "1g.10gb, 3g.40gb" in r.stderr
    r = sim.cli("select", "--mem", "1G", "--mig", "big")
    assert r.returncode == 2 and "not a MIG profile" in r.stderr
    r = sim.cli("select", "--mem", "1G", "--count", "2")
    assert r.returncode == 2  # CUDA gives a process one MIG instance
    plain = SimMachine(EXAMPLES / "idle-2gpu.json", tmp_path / "plain")
    r = plain.cli("select", "--mem", "1G", "--mig", "1g.10gb")
    assert r.returncode == 2 and "no GPU in MIG mode" in r.stderr


def _mig_scenario(
    tmp_path: Path, instances: list[dict[str, object]], procs: list[dict[str, object]]
) -> SimMachine:
    path = tmp_path / "mig.json"
    path.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "name": "NVIDIA A100-SXM4-80GB",
                        "memory_total": "80GiB",
                        "cpus": "0-7",
                        "mig_mode": True,
                        "mig_instances": instances,
                    }
                ],
                "processes": procs,
            }
        )
    )
    return SimMachine(path, tmp_path / "state")


def _findings(sim: SimMachine) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for f in sim.json("doctor", "--samples", "1")["findings"]:
        out.setdefault(str(f["rule"]), []).append(f)
    return out


def test_doctor_lists_the_instances_and_prints_the_nvidia_smi_mig_commands(tmp_path: Path) -> None:
    found = _findings(SimMachine(SCENARIO, tmp_path / "state"))
    (f,) = found["mig_instances"]
    assert f["severity"] == "info" and f["gpu"] == 0
    assert BIG in str(f["evidence"]) and SMALL in str(f["evidence"])
    remedy = str(f["remedy"])
    for cmd in (
        "nvidia-smi mig -i 0 -lgi",
        "nvidia-smi mig -i 0 -lgip",
        "nvidia-smi mig -i 0 -cgi PROFILE -C",
        "nvidia-smi mig -i 0 -dci -gi GI",
        "nvidia-smi mig -i 0 -dgi -gi GI",
        "--mig PROFILE",
    ):
        assert cmd in remedy
    assert "mig_instance_full" not in found and "mig_no_instances" not in found


def test_doctor_per_instance(tmp_path: Path) -> None:
    sim = _mig_scenario(
        tmp_path,
        [{"profile": "3g.40gb", "gi_id": 2}, {"profile": "1g.10gb", "gi_id": 9}],
        [
            {"pid": 601, "gpu": 0, "mig": 9, "user": "ann", "memory": "9.2GiB"},
            {"pid": 602, "gpu": 0, "mig": 2, "user": "ann", "memory": "4GiB"},
            {"pid": 603, "gpu": 0, "mig": 2, "user": "ben", "memory": "4GiB"},
        ],
    )
    found = _findings(sim)
    (full,) = found["mig_instance_full"]  # the 1g.10gb, not the GPU or the 3g.40gb
    assert "0/9 (1g.10gb" in str(full["evidence"]) and "601" in str(full["evidence"])
    assert "nvidia-smi mig -i 0 -dci -gi 9" in str(full["remedy"])
    (shared,) = found["mig_shared_users"]  # ann and ben share the 3g.40gb
    assert "0/2 (3g.40gb)" in str(shared["evidence"])
    assert "shared_default_mode" not in found  # MIG isolates the two instances


def test_doctor_warns_of_a_mig_gpu_without_instances(tmp_path: Path) -> None:
    found = _findings(_mig_scenario(tmp_path, [], []))
    (f,) = found["mig_no_instances"]
    assert f["severity"] == "warning" and "nvidia-smi mig -i 0 -cgi" in str(f["remedy"])
    assert "nvidia-smi -i 0 -mig 0" in str(f["remedy"])


def test_leaks_name_the_instance(tmp_path: Path) -> None:
    sim = _mig_scenario(
        tmp_path,
        [{"profile": "3g.40gb", "gi_id": 2, "uuid": BIG}],
        [{"pid": 701, "gpu": 0, "mig": 2, "state": "dead", "memory": "3GiB"}],
    )
    (lk,) = [lk for lk in sim.json("leaks", "--samples", "1")["leaks"] if lk["pid"] == 701]
    assert lk["kind"] == "dead_pid" and lk["gpu"] == 0 and lk["mig"] == BIG
    assert f"GPU 0 (MIG instance {BIG})" in lk["evidence"]


def test_metrics_per_instance(tmp_path: Path) -> None:
    from gpuwarden.metrics.collector import SnapshotCollector
    from gpuwarden.observe.snapshot import take_snapshot

    backend = SimBackend(load_scenario(SCENARIO), tmp_path / "state")
    text = SnapshotCollector(lambda: take_snapshot(backend)).render_text().decode()
    m = {
        name: float(value)
        for name, _, value in (
            line.rpartition(" ") for line in text.splitlines() if line and line[0] != "#"
        )
    }
    assert (
        m[f'gpuwarden_mig_instance_info{{ci="0",gi="2",gpu="0",profile="3g.40gb",uuid="{BIG}"}}']
        == 1
    )
    assert m['gpuwarden_mig_memory_total_bytes{gi="2",gpu="0"}'] == 40 * 10**9
    assert m['gpuwarden_mig_memory_used_bytes{gi="9",gpu="0"}'] == 6 << 30
    assert m['gpuwarden_mig_memory_free_bytes{gi="2",gpu="0"}'] == 40 * 10**9
    assert m['gpuwarden_mig_processes{gi="9",gpu="0"}'] == 1
    assert m['gpuwarden_mig_processes{gi="2",gpu="0"}'] == 0
    plain = SimBackend(load_scenario(EXAMPLES / "idle-2gpu.json"), tmp_path / "plain")
    assert (
        "gpuwarden_mig_"
        not in SnapshotCollector(lambda: take_snapshot(plain)).render_text().decode()
    )


def _allocated_instance(d: Daemon) -> dict[str, Any] | None:
    """The 3g.40gb instance once a process allocates in it: the one
    CUDA_VISIBLE_DEVICES names."""
    (gpu,) = d.json("status", "--fresh")["gpus"]
    (inst,) = [m for m in gpu["mig_instances"] if m["profile"] == "3g.40gb"]
    return inst if inst["processes"] else None


def test_the_daemon_places_a_20g_job_on_the_3g40gb_instance(tmp_path: Path) -> None:
    from tests.integration.daemon_fixture import start_daemon

    for d in start_daemon(tmp_path, SCENARIO):
        jid = d.submit(
            "--mem",
            "20G",
            cmd=[
                sys.executable,
                "-c",
                "import os, subprocess, sys; "
                "print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
                "subprocess.run([sys.executable, '-m', 'gpuwarden.sim.job', '--mem', '20G', "
                "'--seconds', '30'])",
            ],
        )
        job = d.wait_state(jid, "running")
        assert job["gpu_uuids"] == [BIG] and job["gpus"] == [0]
        inst = wait_for(
            lambda d=d: _allocated_instance(d),
            timeout=30,
            interval=0.2,
            what="the job to allocate in its instance",
        )
        assert inst["memory_used"] >= 20 << 30
        r = d.cli("submit", "--mem", "50G", "--", "true")
        assert r.returncode == 2 and "37.3GiB total" in r.stderr  # refused there


def test_placement_treats_each_instance_as_a_place(tmp_path: Path) -> None:
    from gpuwarden.observe.snapshot import take_snapshot
    from gpuwarden.sched.booking import apply
    from gpuwarden.sched.headroom import gpu_states
    from gpuwarden.sched.model import QueuedJob
    from gpuwarden.sched.placement import fits

    snap = take_snapshot(SimBackend(load_scenario(SCENARIO), tmp_path / "state"))
    states = gpu_states(snap, {}, set())
    assert [(s.index, s.uuid, s.mig) for s in states] == [
        (0, BIG, "3g.40gb"),
        (0, SMALL, "1g.10gb"),
    ]
    assert states[0].total == 40 * 10**9 and states[1].foreign_peak == 6 << 30
    first = QueuedJob(id=1, user="ann", mem=20 << 30)
    place = fits(first, states)
    assert place is not None and place.gpus == (0,) and place.uuids == (BIG,)
    after = apply(states, first, place)
    assert [len(s.managed) for s in after] == [1, 0]  # booked on that instance only
    assert fits(QueuedJob(id=2, user="ann", mem=20 << 30), after) is None  # 16G left
    small = fits(QueuedJob(id=3, user="ann", mem=2 << 30), after)
    assert small is not None and small.uuids in ((BIG,), (SMALL,))
    assert fits(QueuedJob(id=4, user="ann", mem=1 << 30, count=2), states) is None


def test_submit_mig_asks_for_an_instance_of_that_profile(tmp_path: Path) -> None:
    from tests.integration.daemon_fixture import start_daemon

    for d in start_daemon(tmp_path, SCENARIO):
        # the 1g.10gb has 6G of alice's in use: 1G still fits there (reserve, context)
        jid = d.submit(
            "--mem",
            "1G",
            "--mig",
            "1g.10gb",
            cmd=[sys.executable, "-m", "gpuwarden.sim.job", "--mem", "1G", "--seconds", "30"],
        )
        job = d.wait_state(jid, "running")
        assert job["gpu_uuids"] == [SMALL] and job["mig"] == "1g.10gb"
        r = d.cli("submit", "--mem", "2G", "--mig", "1g.10gb", "--", "true")
        d.wait_reason(int(r.stdout), "not a 1g.10gb MIG instance")  # the 3g.40gb is no place
        d.cli("cancel", r.stdout.strip(), check=True)
        plain = d.submit(
            "--mem",
            "2G",
            cmd=[sys.executable, "-m", "gpuwarden.sim.job", "--mem", "1G", "--seconds", "30"],
        )
        assert d.wait_state(plain, "running")["gpu_uuids"] == [BIG]  # the roomier one
        r = d.cli("submit", "--mem", "1G", "--mig", "2g.20gb", "--", "true")
        assert r.returncode == 2 and "no 2g.20gb MIG instance here" in r.stderr
        assert "1g.10gb, 3g.40gb" in r.stderr
        r = d.cli("submit", "--mem", "20G", "--mig", "1g.10gb", "--", "true")
        assert r.returncode == 2 and "9537MiB total" in r.stderr  # never fits that profile
        r = d.cli("submit", "--mem", "1G", "--mig", "big", "--", "true")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a MIG profile" in r.stderr
        r = d.cli("submit", "--mem", "1G", "--mig", "1g.10gb", "--mps", "--", "true")
        assert r.returncode == 2 and "MPS" in r.stderr


def test_an_mps_job_is_refused_on_a_mig_gpu(tmp_path: Path) -> None:
    from tests.integration.daemon_fixture import start_daemon

    for d in start_daemon(tmp_path, SCENARIO):
        r = d.cli("submit", "--mem", "1G", "--mps", "--", "true")
        assert r.returncode == 2 and "every GPU here is in MIG mode" in r.stderr
