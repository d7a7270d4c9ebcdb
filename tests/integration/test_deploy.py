"""What deploy/ ships: the alert rules (promtool accepts them, their unit tests pass,
every metric they use is exposed), the Grafana dashboard (valid, every query names a
metric gpuwarden really exposes) and the systemd unit (jobs outlive a daemon stop)."""

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
    r = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yml"],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
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


def test_every_metric_the_rules_use_is_exposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = set(re.findall(r"\b(gpuwarden_\w+)", RULES.read_text()))
    exposed = exposed_names(tmp_path, monkeypatch)
    # Info metrics are exposed as NAME_info.
    exposed |= {n + "_info" for n in exposed}
    assert used and used <= exposed, used - exposed


def _base(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_the_dashboard_queries_only_metrics_that_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    dash = json.loads((ROOT / "deploy" / "grafana" / "gpuwarden.json").read_text())
    assert dash["uid"] == "gpuwarden" and dash["panels"]
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    assert all(p["title"] and p["gridPos"] for p in dash["panels"])
    used = {_base(n) for e in exprs for n in re.findall(r"\b(gpuwarden_\w+)", e)}
    exposed = {_base(n) for n in exposed_names(tmp_path, monkeypatch)}
    assert used and used <= exposed, used - exposed
    # Every stacked memory panel is in bytes, every ratio in percent of one.
    for p in dash["panels"]:
        unit = p["fieldConfig"]["defaults"]["unit"]
        assert unit in ("bytes", "percentunit", "short", "s"), (p["title"], unit)


def test_the_systemd_unit_keeps_jobs_alive_across_daemon_restarts(tmp_path: Path) -> None:
    import configparser

    unit = ROOT / "deploy" / "systemd" / "gpuwarden.service"
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(unit)
    svc = cp["Service"]
    assert svc["ExecStart"].endswith("gpuwarden daemon start --foreground")
    assert svc["KillMode"] == "process"  # supervisors and jobs outlive a stop
    assert svc["Restart"] == "on-failure" and svc["StateDirectory"] == "gpuwarden"
    verify = shutil.which("systemd-analyze")
    if verify is None:
        return
    # systemd's own check, with ExecStart pointed at this checkout's entry point.
    gw = shutil.which("gpuwarden") or "/bin/true"
    local = tmp_path / "gpuwarden.service"
    local.write_text(unit.read_text().replace("/usr/local/bin/gpuwarden", gw))
    r = subprocess.run(
        [verify, "verify", str(local)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [
        ln
        for ln in (r.stdout + r.stderr).splitlines()
        if "gpuwarden.service" in ln and "nvidia-persistenced" not in ln
    ]
    assert not problems, problems
