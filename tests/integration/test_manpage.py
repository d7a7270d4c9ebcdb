"""``gpuwarden man``: gpuwarden(1) written from the click commands, so it lists every
command and says the exit codes, and renders as a man page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from gpuwarden.cli.commands import COMMANDS
from tests.helpers.paths import SRC


def _page() -> str:
    r = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "man"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_page_lists_every_command_and_the_exit_codes() -> None:
    text = _page()  # piped: the roff source
    assert text.startswith(".TH GPUWARDEN 1 ")
    for name in COMMANDS:
        assert f'.SS "gpuwarden {name} ' in text, name
    assert '.SS "gpuwarden config check ' in text and '.SS "gpuwarden mps start ' in text
    assert ".SH EXIT STATUS" in text and "leaks: a leak" in text
    assert "\\fB--format [table|csv|json]\\fR" in text  # options with their help


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff renders man pages")
def test_the_page_renders_without_warnings() -> None:
    r = subprocess.run(
        ["groff", "-man", "-ww", "-z"], input=_page(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and not r.stderr, r.stderr
