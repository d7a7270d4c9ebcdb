"""The alert rules under deploy/: promtool accepts them and their unit tests pass, and
every gpuwarden metric they use is one the exporter really exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuwarden.daemon.store import Store
from gpuwarden.gpus.sim import SimBackend
from gpuwarden.metrics.collector import SnapshotCollector
from gpuwarden.metrics.jobs import JobsCollector, pass_histogram
from gpuwarden.observe.snapshot import take_snapshot

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("no promtool (Debian package prometheus; .ci/run installs it)")
    return found


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    promtool = _promtool()
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=RULES.parent,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def exposed_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(tmp_path / "sim"))
    backend = SimBackend.from_file(ROOT / "examples" / "a100x8-shared.json")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: take_snapshot(backend)))
    # The daemon's queue metrics, over a real (empty) store.
    reg.register(JobsCollector(Store(tmp_path / "state.db"), lambda: []))
    pass_histogram(reg)
    text = generate_latest(reg).decode()
    return set(re.findall(r"^# TYPE (\w+) ", text, re.M))


def test_every_metric_the_rules_use_is_exposed(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    used = set(re.findall(r"\b(gpuwarden_\w+)", RULES.read_text()))
    exposed = exposed_names(tmp_path, monkeypatch)
    # Info metrics are exposed as NAME_info.
    exposed |= {n + "_info" for n in exposed}
    assert used and used <= exposed, used - exposed
