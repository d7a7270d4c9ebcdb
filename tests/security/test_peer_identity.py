"""An attached job's launcher is the process that opened the connection, identified
when the daemon accepted it — not whatever process holds that pid when the request
arrives.

A connects to the root daemon, asks once (so the connection is surely accepted), forks,
and exits; its child keeps the socket. Pid A comes round to B's process. The child then
submits an attached job on the old connection. Read at that moment, the peer's pid
names B's process: the daemon would take it for the launcher and SIGTERM it when A
cancels the job. The request must be refused instead, and B's process left alone."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import start_daemon
from tests.security import pidns
from tests.security.pidns import PY, User

ATTACKER = r"""
import json, os, socket, sys, time
sock_path, go, body = sys.argv[1], sys.argv[2], sys.argv[3].encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock_path)
s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
assert s.recv(65536).startswith(b"HTTP/1.1 200")
if os.fork():
    print(os.getpid(), flush=True)
    os._exit(0)  # the process the daemon saw connect is gone
while not os.path.exists(go):
    time.sleep(0.05)
s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": payload.decode(errors="replace")}))
"""


def pid_of_a_gone_connector(args: dict[str, Any]) -> dict[str, Any]:
    a, b = (pidns.user(u) for u in args["users"])
    tmp = pidns.tmp_home()
    for d in start_daemon(tmp, EXAMPLES / "idle-2gpu.json"):
        go = tmp / "go"
        body = json.dumps(
            {
                "command": ["sleep", "300"],
                "cwd": a.home,
                "mem": 1 << 30,
                "env": {"PATH": "/usr/bin:/bin"},
                "attach": "probe",
            }
        )
        attacker = subprocess.Popen(
            [*a.prefix, PY, "-c", ATTACKER, str(d.socket), str(go), body],
            env=pidns.env_of(d.env, a),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert attacker.stdout is not None
        pid = int(attacker.stdout.readline())
        attacker.wait(timeout=30)  # reaped: the pid is free
        time.sleep(1.2)  # a later start than the connector's, beyond any clock tolerance
        victim = pidns.spawn_with_pid(pid, b, ["sleep", "300"])
        go.touch()
        answer = json.loads(attacker.stdout.readline())
        if answer["status"] == 201:  # taken for the launcher: A cancels once it is placed
            jid = json.loads(answer["body"])["id"]
            d.wait_state(jid, "reserved", "running", "cancelled")
            d.cli("cancel", str(jid), env=pidns.env_of(d.env, a), prefix=a.prefix)
            d.wait_state(jid, "cancelled", "failed")
            time.sleep(3)  # the daemon's grace is 2 s
        return {**answer, "victim_alive": pidns.alive(victim)}
    raise AssertionError("no daemon")


def test_a_request_from_a_connection_whose_process_is_gone_is_refused(
    users: tuple[User, User], pidns_ok: None
) -> None:
    out = pidns.run(f"{__name__}:pid_of_a_gone_connector", {"users": pidns.users_args(*users)})
    assert out["victim_alive"], out
    assert out["status"] == 403, out
    assert "has exited" in json.loads(out["body"])["error"], out
