"""A simulated machine for a test: a scenario, a private state directory, and the
gpuwarden commands and simulated GPU jobs run on it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.cli import json_answer, run_in_process
from tests.helpers.paths import SRC
from tests.helpers.procs import end_process


@dataclass
class SimMachine:
    """A simulated machine: scenario + private state dir; runs gpuwarden and sim jobs."""

    scenario: Path
    state: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            GPUWARDEN_SIM=str(self.scenario),
            GPUWARDEN_SIM_STATE=str(self.state),
            PYTHONPATH=str(SRC) + os.pathsep + env.get("PYTHONPATH", ""),
            COLUMNS="100",
            PYTHONUNBUFFERED="1",
            # This machine's own: what one command leaves the next (cli/plain.backend).
            XDG_CACHE_HOME=str(self.state / "cache"),
        )
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("XDG_RUNTIME_DIR", None)
        return env

    def cli(
        self,
        *args: str,
        check: bool = False,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        process: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """``gpuwarden ARGS``: in this process where that is the same (see
        ``daemon_fixture.in_process_ok``), else, or with ``process``, in its own."""
        from tests.integration.daemon_fixture import in_process_ok

        if not process and in_process_ok(args):
            return run_in_process(env or self.env, *args, check=check)
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"gpuwarden {' '.join(args)} -> {r.returncode}\n{r.stderr}")
        return r

    def json(self, *args: str) -> Any:
        return json_answer(self.cli(*args, "--json"), args)

    def job(
        self, *args: str, gpus: str | None = None, wait_ready: bool = True, **popen: Any
    ) -> subprocess.Popen[str]:
        """Start a simulated GPU job and wait until it holds its memory."""
        env = self.env
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        p = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden.sim.job", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )
        self.procs.append(p)
        if wait_ready:
            assert p.stdout is not None
            line = p.stdout.readline()
            err = p.stderr.read() if p.stderr and p.poll() is not None else ""
            assert line.startswith("ready"), f"job did not start: {line!r} {err}"
        return p

    def cleanup(self) -> None:
        for p in self.procs:
            end_process(p)
