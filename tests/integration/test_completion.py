"""``gpuwarden completion bash|zsh|fish`` prints a script that completes commands,
options and choices through click."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import SRC


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC), **env},
    )


def test_each_shell_gets_a_script_that_completes_commands_and_choices() -> None:
    for shell, marker in (
        ("bash", "complete -o nosort -F"),
        ("zsh", "#compdef gpuwarden"),
        ("fish", "complete --no-files --command gpuwarden"),
    ):
        r = _run("completion", shell)
        assert r.returncode == 0 and marker in r.stdout, (shell, r.stdout, r.stderr)
        assert "_GPUWARDEN_COMPLETE" in r.stdout
    # What the bash script asks for when the user presses tab.
    words = _run(
        _GPUWARDEN_COMPLETE="bash_complete", COMP_WORDS="gpuwarden st", COMP_CWORD="1"
    ).stdout.split()
    assert "plain,status" in words
    words = _run(
        _GPUWARDEN_COMPLETE="bash_complete", COMP_WORDS="gpuwarden ps --format ", COMP_CWORD="3"
    ).stdout.split()
    assert "plain,csv" in words
    words = _run(
        _GPUWARDEN_COMPLETE="bash_complete", COMP_WORDS="gpuwarden ps --sort s", COMP_CWORD="3"
    ).stdout.split()
    assert words == ["plain,submitted", "plain,state"]
    words = _run(
        _GPUWARDEN_COMPLETE="bash_complete", COMP_WORDS="gpuwarden ps -o id,st", COMP_CWORD="3"
    ).stdout.split()
    assert words == ["plain,id,state", "plain,id,started_at"]
    r = _run("completion", "tcsh")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
