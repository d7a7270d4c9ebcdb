"""A private gpuwarden daemon on the real GPU for the gpu-marked tests: its own home
under a short temporary directory (unix socket paths are short), the CLI as a user runs
it, and a stop that leaves no MPS daemon behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[2] / "src")


class GpuDaemon:
    def __init__(self, config: str = "") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gw-"))
        self.home = self.root / "home"
        self.home.mkdir()
        (self.home / "config.toml").write_text('interval = "200ms"\n' + config)
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_VISIBLE"))
        }
        self.env.update(GPUWARDEN_HOME=str(self.home), PYTHONPATH=SRC)

    def cli(
        self,
        *args: str,
        timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r

    def submit(self, *args: str) -> int:
        return int(self.cli("submit", *args).stdout)

    def job(self, jid: int) -> dict[str, Any]:
        return json.loads(self.cli("show", str(jid), "--json").stdout)  # type: ignore[no-any-return]

    def context_samples(self) -> list[tuple[str, str, float, int]]:
        """The CUDA context measurements the daemon kept (model, driver, at, bytes)."""
        import sqlite3

        with contextlib.closing(sqlite3.connect(self.home / "state.db")) as db:
            return db.execute(
                "SELECT model, driver, at, bytes FROM contexts ORDER BY at"
            ).fetchall()

    def released(self, jid: int, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            rel = self.job(jid)["memory_release"]
            if rel and rel["released_at"] is not None:
                return rel  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, self.job(jid)
            time.sleep(0.2)

    def stop(self) -> None:
        self.cli("daemon", "stop", check=False)
        # Jobs outlive the daemon by design, and so would MPS daemons started for them:
        # a test leaves none behind.
        from gpuwarden.mps.control import MpsControl

        for d in sorted((self.home / "mps").glob("*")):
            control = MpsControl(str(d / "p"), str(d / "l"))
            if control.daemons():
                try:
                    control.stop()
                except Exception as e:  # report, keep cleaning
                    print(f"could not quit the MPS daemon in {d}: {e}")
        shutil.rmtree(self.root, ignore_errors=True)
