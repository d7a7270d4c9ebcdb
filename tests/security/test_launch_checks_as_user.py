"""What a job's launch tells its user about paths they may not see, and what the public
page tells anyone.

The supervisor (root) used to check the job's working directory and command as root
before dropping privileges: B's job with ``--cwd /private/dir`` failed "not usable"
while ``/private/none`` failed "not found", so B learned what exists in a directory B
may not read. Checked as B, every such path fails alike. The anonymous feed on
``web_listen`` hid command lines but showed reasons and event details, which name those
paths and the supervisor's pid."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from tests.helpers.paths import EXAMPLES, SRC
from tests.integration.daemon_fixture import PY, free_port, start_daemon
from tests.security import pidns
from tests.security.pidns import User

# The client a user would run, minus its own checks: the request as the daemon gets it.
_SUBMIT = """
import json, os, sys
from gpuwarden.client.api import Client
body = json.loads(sys.argv[2])
body["env"] = dict(os.environ)
print(json.dumps(Client(sys.argv[1]).request("POST", "/v1/jobs", body=body)))
"""


def _submit_raw(d: Any, u: User, command: list[str], cwd: str) -> int:
    r = subprocess.run(
        [
            *u.prefix,
            PY,
            "-c",
            _SUBMIT,
            str(d.socket),
            json.dumps({"command": command, "cwd": cwd, "mem": "1G"}),
        ],
        env={**pidns.env_of(d.env, u), "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["id"])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_launch_checks_tell_another_user_nothing(users: tuple[User, User]) -> None:
    _, b = users
    private = Path(tempfile.mkdtemp(prefix="gw-private-"))  # root's, mode 0700
    (private / "dir").mkdir()
    (private / "file").write_text("x")
    (private / "tool").write_text("#!/bin/sh\n")
    os.chmod(private / "tool", 0o755)
    port = free_port()
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json", f'web_listen = "127.0.0.1:{port}"\n'):
        cwds = {
            name: _submit_raw(d, b, ["true"], str(private / name))
            for name in ("dir", "file", "none")
        }
        cmds = {
            name: _submit_raw(d, b, [str(private / name)], b.home)
            for name in ("tool", "file", "none")
        }
        ended = {
            k: d.wait_state(j, "failed", timeout=30)
            for k, j in [
                *(("cwd " + n, j) for n, j in cwds.items()),
                *(("cmd " + n, j) for n, j in cmds.items()),
            ]
        }
        said = {
            k: (j["exit_code"], j["reason"].replace(str(private / k.split()[1]), "X"))
            for k, j in ended.items()
        }
        assert len({v for k, v in said.items() if k.startswith("cwd")}) == 1, said
        assert len({v for k, v in said.items() if k.startswith("cmd")}) == 1, said

        base = f"http://127.0.0.1:{port}"
        feed = json.dumps(
            [
                _get(f"{base}/ui/data/overview?hours=1"),
                *(_get(f"{base}/ui/data/jobs/{j['id']}") for j in ended.values()),
            ]
        )
        assert str(private) not in feed
        assert "supervisor pid" not in feed
        page = _get(f"{base}/ui/data/jobs/{cwds['dir']}")["job"]
        assert page["reason"] is None and page["state"] == "failed"
        assert "failed" in [e["kind"] for e in page["events"]]
        assert all(e["detail"] is None for e in page["events"])
        # The owner (or root) still reads everything through the socket.
        assert str(private) in d.job(cwds["dir"])["reason"]
