"""Bad input to the daemon and its configuration gives one clear line, never a
traceback: request bodies, config files, ``daemon start`` that cannot start."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import (
    PY,
    STARTED,
    Daemon,
    _end,
    http_request,
    make_env,
    raw_http,
)


def test_deeply_nested_json_body_is_a_400(daemon: Daemon) -> None:
    for body in (
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"command": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    ):
        status, answer = raw_http(
            daemon.socket,
            http_request("POST", "/v1/jobs", body, {"Content-Type": "application/json"}),
        )
        assert status == 400, answer[:300]
        assert "nested too deeply" in json.loads(answer)["error"]
    assert daemon.cli("ps").returncode == 0  # the daemon still serves


def _home(config: bytes | None) -> tuple[Path, dict[str, str]]:
    short = Path(tempfile.mkdtemp(prefix="gw-"))
    home = short / "home"
    home.mkdir()
    if config is not None:
        (home / "config.toml").write_bytes(config)
    env = make_env(short, EXAMPLES / "idle-2gpu.json")
    env["GPUWARDEN_HOME"] = str(home)
    return home, env


def _start(home: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    STARTED.add(home)
    began = time.monotonic()
    r = subprocess.run(
        [PY, "-m", "gpuwarden", "daemon", "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r, time.monotonic() - began


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (b"\xff\xfe\x00grace = 1\n\x80\x81", "not UTF-8"),
        (b"grace = 1e308\n", "grace"),
        (b'grace = "1000000d"\n', "grace"),
        (b'reserve = "1000T"\n', "reserve must be at most"),
        (b'interval = "10d"\n', "interval must be at most"),
    ],
)
def test_daemon_start_refuses_a_bad_config_in_one_line(config: bytes, says: str) -> None:
    home, env = _home(config)
    try:
        r, took = _start(home, env)
        assert r.returncode != 0
        assert says in r.stderr and "Traceback" not in r.stderr + r.stdout, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert took < 10
    finally:
        _end(home)
        STARTED.discard(home)
        shutil.rmtree(home.parent, ignore_errors=True)


def test_daemon_start_refuses_a_socket_path_too_long() -> None:
    home, env = _home(None)
    deep = home / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    env["GPUWARDEN_HOME"] = str(deep)
    try:
        r, took = _start(deep, env)
        assert r.returncode != 0 and took < 10
        assert "socket path" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        _end(deep)
        STARTED.discard(deep)
        shutil.rmtree(home.parent, ignore_errors=True)


def test_daemon_start_says_why_the_daemon_exited_at_once() -> None:
    """A failure only the daemon meets (its web port taken): start stops waiting the
    moment the daemon exits, and prints its reason."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home, env = _home(f'web_listen = "127.0.0.1:{port}"\n'.encode())
        try:
            r, took = _start(home, env)
            assert r.returncode != 0 and took < 10, r.stderr
            assert f"web_listen 127.0.0.1:{port}" in r.stderr, r.stderr
            assert "exited at once" in r.stderr and "Traceback" not in r.stderr
        finally:
            _end(home)
            STARTED.discard(home)
            shutil.rmtree(home.parent, ignore_errors=True)
