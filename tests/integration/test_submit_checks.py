"""``submit`` refuses at once what could never start, as the submitting user: a missing
working directory, a command that is not there or not executable. Commands on PATH,
shell builtins through ``sh -c`` and scripts (by relative path, from --cwd) still go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.daemon_fixture import Daemon


def _jobs(daemon: Daemon) -> list[dict[str, object]]:
    return list(daemon.json("ps", "--all")["jobs"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cwd", "/nonexistent", "--", "true"], "working directory not found: /nonexistent"),
        (["--", "/nonexistent/prog"], "command not found: /nonexistent/prog"),
        (["--", "no-such-command-anywhere"], "command not found: no-such-command-anywhere"),
        (["--cwd", "/etc/hostname", "--", "true"], "/etc/hostname"),  # click: "is a file"
    ],
)
def test_submit_refuses_what_could_never_start(daemon: Daemon, args: list[str], says: str) -> None:
    r = daemon.cli("submit", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert _jobs(daemon) == []


def test_submit_refuses_a_script_that_is_not_executable(daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    r = daemon.cli("submit", "--cwd", str(tmp_path), "--", "./train.sh")
    assert r.returncode == 2 and "not executable" in r.stderr, r.stderr
    assert _jobs(daemon) == []


def test_commands_on_path_builtins_and_scripts_still_submit(daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\ncd . && exit 0\n")
    os.chmod(script, 0o755)
    ids = [
        daemon.submit(cmd=["true"]),
        daemon.submit(cmd=["sh", "-c", "cd / && export X=1 && exit 0"]),
        daemon.submit("--cwd", str(tmp_path), cmd=["./train.sh"]),
        daemon.submit(cmd=[str(script)]),
    ]
    for job in ids:
        assert daemon.wait_state(job, "succeeded", "failed")["state"] == "succeeded"


@pytest.mark.parametrize(
    "line",
    ["#gpuwarden --help", "#gpuwarden --memm 1G", "#gpuwarden stray-word", "#gpuwarden --gpus"],
)
def test_a_bad_directive_in_a_script_is_one_line_and_exit_2(
    daemon: Daemon, tmp_path: Path, line: str
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n{line}\nexit 0\n")
    script.chmod(0o755)
    r = daemon.cli("submit", "--", str(script))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "#gpuwarden line" in r.stderr, r.stderr
    assert str(script) in r.stderr and "Usage" not in r.stdout + r.stderr
    assert _jobs(daemon) == []
