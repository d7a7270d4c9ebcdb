"""``gpuwarden config check`` validates a config file as the daemon would, starting
nothing; the shipped sample deploy/config.toml passes it and shows every setting."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gpuwarden.daemon.config import LIMIT_SETTINGS, SETTINGS, Config, read_config
from tests.helpers.paths import SRC

SAMPLE = SRC.parent / "deploy" / "config.toml"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "config", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )


def test_the_sample_passes_and_holds_the_defaults() -> None:
    r = _check(str(SAMPLE))
    assert r.returncode == 0 and r.stdout.strip() == f"{SAMPLE}: ok", r.stderr
    assert read_config(SAMPLE) == Config()  # its values are the defaults


def test_every_setting_the_loader_knows_is_in_the_sample() -> None:
    text = SAMPLE.read_text()
    shown = set(re.findall(r"^#? ?(\w+) =", text, re.M))
    tables = ("limits", "notify")
    missing = [
        k for k in (*SETTINGS, *LIMIT_SETTINGS, "webhook") if k not in tables and k not in shown
    ]
    assert not missing, f"deploy/config.toml lacks {missing}"
    for table in tables:
        assert re.search(rf"^# \[{table}\]", text, re.M), table


def test_each_problem_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text('grace = "1x"\nfoo = 1\nspike_buffer = 99\n[limits]\nmax_memory = [1]\n')
    r = _check(str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr and not r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 4, r.stderr
    assert all(line.startswith(f"gpuwarden: error: {bad}: ") for line in lines)
    assert any("unknown setting foo" in line for line in lines)
    assert any("spike_buffer must be" in line for line in lines)
    assert any("grace: invalid duration" in line for line in lines)
    assert any("limits.max_memory must be a size" in line for line in lines)
    # Settings that are fine alone but not together.
    bad.write_text('grace = "1h"\n')
    r = _check(str(bad))
    assert r.returncode == 2 and "grace must be at most max_grace" in r.stderr
    bad.write_text("x")
    assert _check(str(bad)).returncode == 2
    r = _check(str(tmp_path / "nosuch.toml"))
    assert r.returncode == 2 and "no such file" in r.stderr
