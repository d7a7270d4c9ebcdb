"""Arguments and environment values that are not UTF-8 (any bytes but NUL are valid on
Linux) are carried as the same bytes from submit to the job's execve, on a real daemon
over the simulated 2 x 24 GiB machine; people see them as \\xNN escapes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.integration.daemon_fixture import PY, Daemon

PRINT = (
    "import os, sys; sys.stdout.buffer.write(os.fsencode(sys.argv[1]) + b'|' + "
    "os.environb[b'GW_BYTES'] + b'\\n')"
)


def test_non_utf8_argv_and_env_reach_the_job_as_bytes(daemon: Daemon, tmp_path: Path) -> None:
    env = dict(daemon.env, GW_BYTES=os.fsdecode(b"caf\xe9"))
    script = tmp_path / "p.py"
    script.write_text(PRINT)
    r = subprocess.run(
        [PY, "-m", "gpuwarden", "submit", "--mem", "1G", "--", PY, script, b"\xff\xfeok"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    jid = int(r.stdout)
    daemon.wait_state(jid, "succeeded")
    out = subprocess.run(
        [PY, "-m", "gpuwarden", "logs", str(jid)], env=daemon.env, capture_output=True, timeout=60
    )
    assert out.stdout == b"\xff\xfeok|caf\xe9\n", out
    # ps and show print the bytes as escapes; --json keeps them exact (as \udcXX).
    ps = daemon.cli("ps", "--all")
    assert ps.returncode == 0 and "Traceback" not in ps.stderr, ps.stderr
    assert "\\xff\\xfeok" in ps.stdout, ps.stdout
    show = daemon.cli("show", str(jid))
    assert show.returncode == 0 and "\\xff\\xfeok" in show.stdout, show.stderr
    raw = subprocess.run(
        [PY, "-m", "gpuwarden", "show", str(jid), "--json"],
        env=daemon.env,
        capture_output=True,
        timeout=60,
    )
    assert raw.returncode == 0, raw.stderr
    job = json.loads(raw.stdout)
    assert os.fsencode(job["command"][-1]) == b"\xff\xfeok"


def test_a_cwd_that_is_not_utf8_is_one_line(daemon: Daemon) -> None:
    r = subprocess.run(
        [PY, "-m", "gpuwarden", "submit", "--cwd", b"/tmp/\xff", "--", "true"],
        env=daemon.env,
        capture_output=True,
        timeout=60,
    )
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
