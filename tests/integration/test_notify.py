"""Word of a job's end on a real daemon over the simulated machine: ``submit --notify CMD``
runs CMD with the job's JSON on its standard input however the job ends, a failing one
is an event; ``[notify] webhook`` POSTs every job's end to a real HTTP server, and one
that is down is an event after its tries; bad commands and URLs are one-line errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, free_port, start_daemon

SIM = [PY, "-m", "gpuwarden.sim.job", "--mem", "1G"]


def _events(d: Daemon, jid: int, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.job(jid)["events"] if e["kind"] == kind]


def test_notify_runs_once_the_job_ends_with_its_json(daemon: Daemon, tmp_path: Path) -> None:
    out = tmp_path / "ended"
    ok = daemon.submit("--mem", "1G", "--notify", f"cat > {out}.ok", cmd=[*SIM, "--seconds", "0.2"])
    bad = daemon.submit(
        "--mem",
        "1G",
        "--notify",
        f"cat > {out}.bad",
        cmd=[*SIM, "--seconds", "0.2", "--exit-code", "3"],
    )
    # A job cancelled while it waits (the API's cancel, not the pass) is word too.
    long = daemon.submit("--mem", "1G", cmd=[*SIM, "--seconds", "60"])
    held = daemon.submit(
        "--mem",
        "1G",
        "--after",
        str(long),
        "--notify",
        f"cat > {out}.gone",
        cmd=[*SIM, "--seconds", "0.2"],
    )
    daemon.cli("cancel", str(held), check=True)
    docs = {
        name: json.loads(
            wait_for(
                lambda n=name: Path(f"{out}.{n}").exists() and Path(f"{out}.{n}").read_text(),
                timeout=30,
            )
        )
        for name in ("ok", "bad", "gone")
    }
    assert (docs["ok"]["id"], docs["ok"]["state"]) == (ok, "succeeded")
    assert (docs["bad"]["id"], docs["bad"]["state"], docs["bad"]["exit_code"]) == (bad, "failed", 3)
    assert (docs["gone"]["id"], docs["gone"]["state"]) == (held, "cancelled")
    assert "env" not in docs["ok"] and docs["ok"]["notify"] == f"cat > {out}.ok"
    daemon.cli("cancel", str(long), check=True)
    assert (
        f"notify    cat > {out}.ok (run as its user once it ends)"
        in daemon.cli("show", str(ok), check=True).stdout
    )
    assert "notify_failed" not in [e["kind"] for e in daemon.job(ok)["events"]]


def test_notify_runs_once_for_a_retried_job(daemon: Daemon, tmp_path: Path) -> None:
    # An OOM retry is no end: word comes once, when the retried attempt succeeds.
    out = tmp_path / "ends"
    jid = daemon.submit(
        "--mem",
        "1G",
        "--notify",
        f"cat >> {out}; echo >> {out}",
        cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "1G", "--grow-to", "3G", "--seconds", "1"],
    )
    job = daemon.wait_state(jid, "succeeded", timeout=60)
    assert job["oom_retries"] == 1, job["events"]
    wait_for(lambda: out.exists() and out.read_text().endswith("\n"), timeout=30)
    time.sleep(1.0)
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["state"] == "succeeded", lines


def test_a_failing_notify_command_is_an_event(daemon: Daemon) -> None:
    jid = daemon.submit(
        "--mem", "1G", "--notify", "echo no mail here >&2; exit 7", cmd=[*SIM, "--seconds", "0.1"]
    )
    daemon.wait_state(jid, "succeeded")
    ev = wait_for(lambda: _events(daemon, jid, "notify_failed"), timeout=30)
    assert ev[0]["detail"] == "notify command exited 7: no mail here", ev
    assert daemon.job(jid)["state"] == "succeeded"  # word failing changes nothing else


@pytest.mark.parametrize(
    ("notify", "said"),
    [
        ("", "notify must be a non-empty command"),
        ("x" * 5000, "notify must be a non-empty command of at most 4096 characters"),
    ],
)
def test_a_bad_notify_command_is_one_line_and_exit_2(
    daemon: Daemon, notify: str, said: str
) -> None:
    r = daemon.cli("submit", "--mem", "1G", "--notify", notify, "--", "true")
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


class _Hook(BaseHTTPRequestHandler):
    got: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append({"type": self.headers["Content-Type"], "doc": json.loads(body)})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    handler = type("Hook", (_Hook,), {"got": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", handler.got
    finally:
        server.shutdown()
        server.server_close()


def test_the_webhook_gets_every_jobs_end(
    tmp_path: Path, hook: tuple[str, list[dict[str, Any]]]
) -> None:
    url, got = hook
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", f'[notify]\nwebhook = "{url}"\n'):
        a = d.submit("--mem", "1G", cmd=[*SIM, "--seconds", "0.1"])
        b = d.submit("--mem", "1G", cmd=[*SIM, "--seconds", "0.1", "--exit-code", "1"])
        wait_for(lambda: len(got) >= 2, timeout=30)
        time.sleep(0.5)
        ends = {p["doc"]["id"]: p["doc"]["state"] for p in got}
        assert ends == {a: "succeeded", b: "failed"}, got
        assert all(p["type"] == "application/json" and "env" not in p["doc"] for p in got)


def test_a_webhook_that_is_down_is_an_event_after_its_tries(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", f'[notify]\nwebhook = "{url}"\n'):
        jid = d.submit("--mem", "1G", cmd=[*SIM, "--seconds", "0.1"])
        ev = wait_for(lambda d=d, jid=jid: _events(d, jid, "webhook_failed"), timeout=30)
        assert ev[0]["detail"].startswith(f"webhook {url}: ") and "(3 tries)" in ev[0]["detail"], ev


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ('[notify]\nwebhook = "ftp://x"\n', "notify.webhook must be an http:// or https:// URL"),
        ('[notify]\nhook = "http://x"\n', "notify: unknown setting(s) hook"),
        ('notify = "http://x"\n', "notify must be a table"),
    ],
)
def test_a_bad_webhook_setting_is_one_line(daemon: Daemon, config: str, said: str) -> None:
    bad = daemon.home / "bad.toml"
    bad.write_text(config)
    r = daemon.cli("config", "check", str(bad))
    assert r.returncode == 2 and said in r.stderr, (r.stdout, r.stderr)
