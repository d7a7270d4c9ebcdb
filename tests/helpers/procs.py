"""Processes a test starts: ending them cleanly, and running one as another user."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Any

from tests.helpers.paths import SRC


def end_process(p: subprocess.Popen[Any]) -> None:
    """Kill ``p`` unless it has ended, wait for it and close its pipes (a pipe left open
    is a ResourceWarning when it is collected)."""
    with p:  # leaving closes the pipes and waits
        p.kill()  # nothing where it was already waited for


@functools.lru_cache(maxsize=1)
def nobody_prefix() -> tuple[str, ...] | None:
    """argv prefix that runs this test's Python as nobody, or None where that cannot be
    done (not root, no setpriv/runuser, or nobody cannot reach this interpreter)."""
    if os.geteuid() != 0:
        return None
    for prefix in (
        ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
        ("runuser", "-u", "nobody", "--"),
    ):
        if shutil.which(prefix[0]) is None:
            continue
        probe = subprocess.run(
            [*prefix, sys.executable, "-c", "import click, psutil, gpuwarden"],
            env={**os.environ, "PYTHONPATH": str(SRC)},
            capture_output=True,
            timeout=60,
            check=False,
        )
        if probe.returncode == 0:
            return prefix
    return None
