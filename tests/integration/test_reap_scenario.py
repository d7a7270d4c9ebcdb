"""``reap --yes`` on a scenario: the scenario's pids are simulated, never signalled, and
what reap reports agrees with itself (what it reaped is no longer listed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for

# A real process that records every signal it gets instead of dying of it.
_RECORDER = """
import signal, sys, time
out = sys.argv[1]
def note(sig, frame):
    open(out, "a").write(f"{sig}\\n")
for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, note)
open(out + ".ready", "w").close()
time.sleep(120)
"""


def test_reap_on_a_scenario_signals_no_real_process_and_agrees_with_itself(
    make_sim: Any, tmp_path: Path
) -> None:
    got = tmp_path / "signals"
    recorder = subprocess.Popen([sys.executable, "-c", _RECORDER, str(got)])
    try:
        wait_for(lambda: Path(f"{got}.ready").exists(), timeout=10)
        scenario = json.loads((EXAMPLES / "leaky-4gpu.json").read_text())
        # The scenario's pids are another process's here: the zombie's parent, the
        # orphan and the hidden holder all name the recorder.
        for p in scenario["processes"]:
            if p["pid"] == 23457:
                p["ppid"] = recorder.pid
            if p["pid"] == 23456:
                p["pid"] = recorder.pid
        sim = make_sim(scenario)
        r = sim.cli(
            "reap", "--yes", "--json", "--samples", "1", "--interval", "0.05", "--timeout", "5"
        )
        time.sleep(0.3)
        assert not got.exists(), f"signals sent to a real process: {got.read_text()}"
        assert recorder.poll() is None
        out = json.loads(r.stdout)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert out["still_held"] == []
        results = {a["pid"]: a.get("result") for a in out["actions"]}
        assert results[recorder.pid] == "terminated (simulated)"
        assert results[23457] == "reaped (simulated)"
        assert results[45678] == "terminated (simulated)"
        [gpu2] = [x for x in out["reclaimed"] if x["gpu"] == 2]
        assert gpu2["bytes"] == 4 << 30 and gpu2["seconds"] is not None

        text = sim.cli("reap", "--yes", "--samples", "1", "--interval", "0.05", "--timeout", "5")
        assert text.returncode == 0, text.stdout
        assert "Still listed" not in text.stdout
        assert "not signalled" in text.stdout
        # The scenario file is unchanged: the next look finds the same leaks.
        again = {lk["pid"] for lk in sim.json("leaks", "--samples", "1")["leaks"]}
        assert {recorder.pid, 23457, 45678} <= again
    finally:
        recorder.kill()
        recorder.wait()
