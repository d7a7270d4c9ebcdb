"""``gpuwarden web`` serves its owner alone, and only the page.

A runs ``gpuwarden web``: it reads the daemon's socket as A. B, another local user,
reaches the same TCP port. Without A's token B gets nothing (403), in particular not
A's job output through an encoded ``..`` (``/ui/%2e%2e/v1/jobs/N/logs``); with the token
no path outside the page's read-only routes reaches the API either (404)."""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES, SRC
from tests.integration.daemon_fixture import Daemon, free_port, start_daemon
from tests.security import pidns
from tests.security.pidns import PY, User

SECRET = "gw-secret-output-5c1e"
FETCH = r"""
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
c.request("GET", sys.argv[2])
r = c.getresponse()
print(json.dumps({"status": r.status, "body": r.read().decode(errors="replace")}))
"""


@pytest.fixture
def served(users: tuple[User, User], tmp_path: Path) -> Iterator[tuple[Daemon, int, int, str]]:
    """A root daemon; A's finished job with SECRET in its output; A's ``gpuwarden web``."""
    a, _ = users
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json"):
        env = pidns.env_of(d.env, a)
        r = d.cli(
            "submit", "--cwd", a.home, "--", "sh", "-c", f"echo {SECRET}", env=env, prefix=a.prefix
        )
        assert r.returncode == 0, r.stderr
        jid = int(r.stdout)
        assert d.cli("wait", str(jid), env=env, prefix=a.prefix).returncode == 0
        assert SECRET in d.cli("logs", str(jid), env=env, prefix=a.prefix).stdout
        port = free_port()
        with subprocess.Popen(
            [*a.prefix, PY, "-m", "gpuwarden", "web", "--listen", f"127.0.0.1:{port}"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        ) as proxy:  # leaving closes its pipe
            try:
                assert proxy.stderr is not None
                line = proxy.stderr.readline()
                assert f"127.0.0.1:{port}/ui/" in line, line
                token = line.split("?token=", 1)[1].split()[0] if "?token=" in line else ""
                yield d, jid, port, token
            finally:
                proxy.terminate()
                proxy.wait(timeout=10)


def fetch_as(u: User, port: int, path: str) -> tuple[int, str]:
    r = subprocess.run(
        [*u.prefix, PY, "-c", FETCH, str(port), path],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["status"], out["body"]


def fetch(
    port: int, path: str, cookie: str | None = None
) -> tuple[int, http.client.HTTPMessage, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        r = c.getresponse()
        return r.status, r.headers, r.read().decode(errors="replace")
    finally:
        c.close()


def test_another_user_gets_nothing_through_gpuwarden_web(
    users: tuple[User, User], served: tuple[Daemon, int, int, str]
) -> None:
    _, b = users
    _, jid, port, _ = served
    for path in (
        f"/ui/%2e%2e/v1/jobs/{jid}/logs",
        f"/ui/..%2fv1/jobs/{jid}/logs",
        f"/ui/%2E%2E/%2E%2E/v1/jobs/{jid}",
        "/ui/data/overview",
        "/ui/",
        "/v1/jobs",
        f"/ui/data/jobs/{jid}",
    ):
        status, body = fetch_as(b, port, path)
        assert SECRET not in body, (path, body)
        assert status == 403, (path, status, body)


def test_the_token_opens_the_page_and_nothing_more(served: tuple[Daemon, int, int, str]) -> None:
    _, jid, port, token = served
    assert token, "gpuwarden web printed no token"
    status, headers, _ = fetch(port, f"/ui/?token={token}")
    assert status == 302 and headers["Location"] == "/ui/"  # the token leaves the URL
    morsel = headers["Set-Cookie"]
    assert token in morsel and "HttpOnly" in morsel and "SameSite=Strict" in morsel, morsel
    cookie = morsel.split(";", 1)[0]
    status, _, body = fetch(port, "/ui/data/overview?hours=1", cookie)
    assert status == 200 and "gpus" in json.loads(body)
    assert fetch(port, "/ui/", cookie)[0] == 200
    for path in (
        f"/ui/%2e%2e/v1/jobs/{jid}/logs",
        f"/ui/..%2fv1/jobs/{jid}/logs",
        f"/ui/static/..%2f..%2fv1%2fjobs%2f{jid}%2flogs",
        "/v1/jobs",
        f"/ui/data/jobs/{jid}/../../../v1/jobs/{jid}/logs",
        "/openapi.json",
        f"/ui/data/jobs/{jid}%2f..%2f..%2f..%2fv1%2fjobs",
    ):
        status, _, body = fetch(port, path, cookie)
        assert SECRET not in body, (path, body)
        assert status == 404, (path, status, body)
    status, _, body = fetch(port, f"/ui/%2e%2e/v1/jobs/{jid}/logs?token={token}")
    assert status == 404 and SECRET not in body
    assert fetch(port, "/ui/data/overview", "gpuwarden_web_1=" + token)[0] == 403
    assert fetch(port, "/ui/data/overview", cookie.replace(token, token[:-1] + "x"))[0] == 403
