"""``gpuwarden doctor`` as a user runs it: a subprocess on the simulated backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"


def doctor(
    tmp_path: Path, scenario: str | dict[str, Any], *args: str, columns: int = 80
) -> subprocess.CompletedProcess[str]:
    if isinstance(scenario, dict):
        path = tmp_path / "scenario.json"
        path.write_text(json.dumps(scenario))
    else:
        path = EXAMPLES / scenario
    env = {
        **os.environ,
        "GPUWARDEN_SIM": str(path),
        "GPUWARDEN_SIM_STATE": str(tmp_path / "st"),
        "PYTHONPATH": str(ROOT / "src"),
        "COLUMNS": str(columns),
    }
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# Findings that depend on the host running the tests, not on the scenario: a test run in
# a container, or real MPS daemons on the machine.
HOST_DEPENDENT = {"container_namespace", "mps_no_memory_limit"}


def doctor_json(
    tmp_path: Path, scenario: str | dict[str, Any], *args: str, host: bool = False
) -> tuple[int, list[dict[str, Any]], dict[str, int]]:
    """Exit code, findings and summary; without ``host``, host-dependent findings are
    dropped from both (the summary is recounted)."""
    r = doctor(tmp_path, scenario, "--json", "--samples", "2", "--interval", "50ms", *args)
    assert "Traceback" not in r.stderr, r.stderr
    data = json.loads(r.stdout)
    findings, summary = data["findings"], data["summary"]
    assert sum(summary.values()) == len(findings)
    if not host:
        findings = [f for f in findings if f["rule"] not in HOST_DEPENDENT]
        summary = {s: sum(1 for f in findings if f["severity"] == s) for s in summary}
    return r.returncode, findings, summary


def find(findings: list[dict[str, Any]], rule: str, **where: Any) -> list[dict[str, Any]]:
    return [f for f in findings if f["rule"] == rule and all(f[k] == v for k, v in where.items())]


def test_leaky_machine(tmp_path: Path) -> None:
    rc, findings, summary = doctor_json(tmp_path, "leaky-4gpu.json")
    for f in findings:
        assert set(f) == {"rule", "severity", "gpu", "pid", "evidence", "remedy"}
        assert f["severity"] in ("critical", "warning", "info") and f["remedy"]
    [shared] = find(findings, "shared_default_mode", gpu=3)
    assert "dave" in shared["evidence"] and "erin" in shared["evidence"]
    assert "nvidia-smi -i 3 -c EXCLUSIVE_PROCESS" in shared["remedy"]
    [pm] = find(findings, "persistence_off", gpu=1)
    assert "nvidia-smi -i 1 -pm 1" in pm["remedy"]
    assert find(findings, "persistence_off", gpu=0) == []
    [hidden] = find(findings, "hidden_holder", pid=45678)
    assert hidden["gpu"] == 2 and "gpuwarden reap --pid 45678 --yes" in hidden["remedy"]
    assert find(findings, "residual_memory", gpu=1)
    assert find(findings, "dead_pid", gpu=0, pid=12345)
    assert find(findings, "garbage_pid", gpu=1, pid=4294967295)
    assert find(findings, "other_namespace", gpu=1, pid=88)
    assert find(findings, "zombie", gpu=2, pid=23457)
    assert find(findings, "orphan", gpu=2, pid=23456)
    assert {f["pid"] for f in find(findings, "alloc_conf_unset")} == {34567, 34568}
    # GPU 3 has exactly 5% free: a warning, not yet critical; warnings exit 0.
    assert summary == {"critical": 0, "warning": 8, "info": 3}
    assert rc == 0


def test_shared_a100_machine(tmp_path: Path) -> None:
    rc, findings, summary = doctor_json(tmp_path, "a100x8-shared.json")
    assert find(findings, "residual_memory", gpu=3)
    [numa] = find(findings, "numa_mismatch", pid=2332308)
    assert numa["gpu"] == 2
    assert "taskset -a -cp 0-23,48-71 2332308" in numa["remedy"]
    assert len(find(findings, "numa_mismatch")) == 1  # GPU 6's vLLM runs on its own node
    assert {f["pid"] for f in find(findings, "alloc_conf_unset")} == {2332308, 2095211}
    # GPU 6: llm and alice in Default mode with 2.3% free: the OOM is one allocation away.
    [shared] = find(findings, "shared_default_mode", gpu=6)
    assert shared["severity"] == "critical"
    assert summary["critical"] >= 1
    assert rc == 1


def test_gpu_filter_keeps_that_gpu_and_machine_wide_findings(tmp_path: Path) -> None:
    _, findings, _ = doctor_json(tmp_path, "leaky-4gpu.json", "--gpu", "3")
    assert findings
    assert {f["gpu"] for f in findings} <= {3, None}


def test_bad_gpu_is_one_line_error(tmp_path: Path) -> None:
    r = doctor(tmp_path, "leaky-4gpu.json", "--gpu", "9", "--samples", "1")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPU with index 9" in lines[0]
    assert r.stdout == ""


def test_bad_samples_is_a_usage_error(tmp_path: Path) -> None:
    r = doctor(tmp_path, "leaky-4gpu.json", "--samples", "0")
    assert r.returncode != 0 and "Traceback" not in r.stderr


def test_human_output_fits_80_columns_and_exits_1_on_critical(tmp_path: Path) -> None:
    r = doctor(tmp_path, "a100x8-shared.json", "--samples", "1")
    assert r.returncode == 1, r.stderr
    out = r.stdout
    assert out.index("Critical") < out.index("Warning") < out.index("Info")
    assert "nvidia-smi -i 6 -c EXCLUSIVE_PROCESS" in out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80


def test_healthy_machine_says_so(tmp_path: Path) -> None:
    rc, findings, summary = doctor_json(tmp_path, "idle-2gpu.json")
    assert (rc, findings, summary) == (0, [], {"critical": 0, "warning": 0, "info": 0})
    _, on_host, _ = doctor_json(tmp_path, "idle-2gpu.json", host=True)
    if on_host:
        pytest.skip(f"this host adds findings of its own: {[f['rule'] for f in on_host]}")
    r = doctor(tmp_path, "idle-2gpu.json", "--samples", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("No problems found")


_GPU = {
    "memory_total": "40GiB",
    "compute_mode": "Default",
    "persistence_mode": True,
    "numa_node": 0,
    "cpus": "0-7",
}


@pytest.mark.parametrize(
    ("scenario", "rule", "severity"),
    [
        ({"gpus": [{**_GPU, "index": 0, "ecc_uncorrected": 3}]}, "ecc_uncorrected", "critical"),
        (
            {"gpus": [{**_GPU, "index": 0, "retired_pages_pending": True}]},
            "retired_pages_pending",
            "critical",
        ),
        (
            {
                "gpus": [{**_GPU, "index": 0, "mps": True}],
                "processes": [
                    {"pid": 501, "gpu": 0, "user": "ann", "memory": "2GiB"},
                    {"pid": 502, "gpu": 0, "user": "ben", "memory": "2GiB"},
                ],
            },
            "mps_shared_users",
            "warning",
        ),
        ({"gpus": [{**_GPU, "index": 0}], "in_container": True}, "container_namespace", "info"),
    ],
)
def test_scenario_rules(tmp_path: Path, scenario: dict[str, Any], rule: str, severity: str) -> None:
    rc, findings, _ = doctor_json(tmp_path, scenario, host=True)
    [f] = find(findings, rule)
    assert f["severity"] == severity
    assert rc == (1 if severity == "critical" else 0)
