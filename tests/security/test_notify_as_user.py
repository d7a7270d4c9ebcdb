"""A job's ``--notify`` command runs as the job's user, not as the root daemon: user A's
command writes its ids beside A's files and can read no file only root may read."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.paths import EXAMPLES, SRC
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, start_daemon
from tests.security import pidns
from tests.security.pidns import User

_SUBMIT = """
import json, os, sys
from gpuwarden.client.api import Client
body = json.loads(sys.argv[2])
body["env"] = dict(os.environ)
print(json.dumps(Client(sys.argv[1]).request("POST", "/v1/jobs", body=body)))
"""


def _submit(d: Any, u: User, body: dict[str, Any]) -> int:
    r = subprocess.run(
        [*u.prefix, PY, "-c", _SUBMIT, str(d.socket), json.dumps(body)],
        env={**pidns.env_of(d.env, u), "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["id"])


def test_notify_runs_as_the_jobs_user(users: tuple[User, User]) -> None:
    a, _ = users
    secret = Path(tempfile.mkdtemp(prefix="gw-root-only-")) / "secret"  # root's, 0700 dir
    secret.write_text("root only")
    out = Path(a.home) / "notified"
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json"):
        jid = _submit(
            d,
            a,
            {
                "command": ["true"],
                "cwd": a.home,
                "mem": "1G",
                "notify": f"{{ id -u; id -g; cat {secret} || echo denied; cat; }} > {out}",
            },
        )
        d.wait_state(jid, "succeeded", timeout=60)
        wait_for(
            lambda: out.exists() and out.read_text().count("\n") >= 3,
            timeout=30,
            interval=0.1,
            what="the notify command to run",
        )
        time.sleep(0.3)
        uid, gid, read, doc = out.read_text().split("\n", 3)
        assert (int(uid), int(gid)) == (a.uid, a.gid)
        assert read == "denied" and "root only" not in doc
        assert json.loads(doc)["id"] == jid
        assert os.stat(out).st_uid == a.uid
