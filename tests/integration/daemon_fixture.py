"""A real daemon in an isolated GPUWARDEN_HOME over a simulated machine, driven through
the real CLI — the fixture the daemon tests share. The daemon is forked from a process
that imported it once (``preloaded``); the CLI's own code runs in the test's process
where a command only asks and prints (``cli``, ``json``, ``submit``), and in a process
of its own where it execs, loops, runs as another user or the test asks."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.cli import json_answer, run_in_process
from tests.helpers.paths import EXAMPLES, SRC
from tests.helpers.wait import wait_for
from tests.integration.preloaded import fork_daemon

PY = sys.executable
ASKS_ONLY = frozenset(
    {
        "status",
        "ps",
        "leaks",
        "report",
        "show",
        "doctor",
        "reap",
        "clean",
        "hold",
        "submit",
        "cancel",
        "rm",
        "release",
        "retry",
        "edit",
        "unreserve",
        "logs",
        "config",
    }
)
"""Commands that send the daemon requests (or read the machine) and print the answers,
nothing else: no exec, no daemon started, no terminal, no wait without end. ``cli`` runs
them in this process (``run_in_process``: the same words and exit status), unless they
loop (``LOOPS``), run as another user, or the test asks for a process of their own."""
LOOPS = frozenset({"--watch", "-f", "--follow"})
STARTED: set[Path] = set()
"""Homes of every daemon a test started: ``stop_all`` ends what is left of them."""


@dataclass
class Daemon:
    home: Path
    env: dict[str, str]

    @property
    def socket(self) -> Path:
        return self.home / "gpuwarden.sock"

    def cli(
        self,
        *args: str,
        check: bool = False,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
        process: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """``gpuwarden ARGS``: in this process where that is the same (``ASKS_ONLY``),
        else, or with ``process``, in a process of its own (an interpreter each was
        about a sixth of the suite's CPU)."""
        if not (process or prefix) and in_process_ok(args):
            return run_in_process(env or self.env, *args, check=check)
        r = subprocess.run(
            [*prefix, PY, "-m", "gpuwarden", *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"gpuwarden {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
            )
        return r

    def json(self, *args: str) -> Any:
        """What ``gpuwarden ARGS --json`` prints, parsed."""
        return json_answer(self.cli(*args, "--json"), args)

    def submit(self, *args: str, cmd: list[str] | None = None) -> int:
        """A job submitted with ``gpuwarden submit ARGS -- CMD``, for set-up: the CLI run
        in this process (``in_process``), which sends the daemon the request a fresh
        ``gpuwarden`` would; what a test checks of the command itself goes through
        ``cli``."""
        command = cmd if cmd is not None else [PY, "-m", "gpuwarden.sim.job", "--seconds", "0"]
        out = self.in_process("submit", *args, "--", *command, check=True).stdout
        return int(out.strip())

    def in_process(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        """``gpuwarden ARGS`` run by this process with the daemon's environment
        (``run_in_process``): the same request and the same words as ``cli``."""
        return run_in_process(self.env, *args, check=check)

    def api(self, method: str, path: str, **kw: Any) -> Any:
        """The daemon's API asked from this process, as the CLI asks it: for polls and
        set-up, which would otherwise start an interpreter per question. What a test
        checks of the CLI itself goes through ``cli``."""
        from gpuwarden.client.api import Client

        return Client(str(self.socket)).request(method, path, **kw)

    def job(self, job_id: int) -> dict[str, Any]:
        """The job's document: what ``show --json`` prints (GET /v1/jobs/ID)."""
        return dict(self.api("GET", f"/v1/jobs/{job_id}"))

    def wait_state(self, job_id: int, *states: str, timeout: float = 30) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: self.job(job_id),
                timeout,
                0.1,
                until=lambda j: j["state"] in states,
                what=lambda j: f"job {job_id} stayed {j['state']}: {j}",
            )
        )

    def wait_reason(self, job_id: int, text: str, timeout: float = 10) -> dict[str, Any]:
        """The job once it waits, queued, for a reason that says ``text``: the pass after
        its submission writes the reason, so a job seen at once may not have one yet."""
        return dict(
            wait_for(
                lambda: self.job(job_id),
                timeout,
                0.05,
                until=lambda j: j["state"] == "queued" and text in (j["reason"] or ""),
                what=lambda j: f"job {job_id} to wait for {text!r}: {j}",
            )
        )

    def wait_for_release(self, job_id: int, timeout: float = 30) -> dict[str, Any]:
        """The job once the memory of its last attempt is released (or cleared)."""

        def released(j: dict[str, Any]) -> bool:
            rel = j.get("memory_release")
            return rel is not None and rel["released_at"] is not None

        return dict(
            wait_for(
                lambda: self.job(job_id),
                timeout,
                0.1,
                until=released,
                what=lambda j: f"job {job_id}'s memory was not released: {j}",
            )
        )

    def pid(self) -> int | None:
        try:
            return int((self.home / "daemon.lock").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def start(self) -> None:
        """The daemon, forked from a process that imported it once (``preloaded``):
        importing it was half of each daemon's start-up CPU. The tests of ``daemon
        start`` itself run it through ``cli``."""
        from gpuwarden.client.api import Client

        STARTED.add(self.home)  # before the start: a daemon half-started is still ours
        pid = fork_daemon(self.env, self.home / "daemon.log")
        client = Client(str(self.socket))
        wait_for(
            lambda: client.alive() or not psutil.pid_exists(pid),
            30,
            0.02,
            what=f"the daemon of {self.home} to answer",
        )
        if not client.alive():
            log = (self.home / "daemon.log").read_text(errors="replace")
            raise AssertionError(f"the daemon exited at once:\n{log[-2000:]}")

    def stop(self) -> None:
        self.in_process("daemon", "stop")


def in_process_ok(args: tuple[str, ...]) -> bool:
    """Whether ``gpuwarden ARGS`` may run in this process: it only asks and prints
    (``ASKS_ONLY``) and does not loop until interrupted (``LOOPS``)."""
    return bool(args) and args[0] in ASKS_ONLY and not LOOPS.intersection(args)


def make_env(tmp: Path, scenario: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_"))}
    env.update(
        GPUWARDEN_HOME=str(tmp / "home"),
        GPUWARDEN_SIM=str(scenario),
        GPUWARDEN_SIM_STATE=str(tmp / "sim"),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        # Each test's own: what one command leaves the next (cli/plain.backend).
        XDG_CACHE_HOME=str(tmp / "cache"),
    )
    env.pop("XDG_RUNTIME_DIR", None)
    return env


def _kill_jobs(home: Path) -> None:
    """Leave nothing behind: supervisors (and so their trees) of this daemon's jobs."""
    from gpuwarden.supervisor.control import live_supervisors

    for p in live_supervisors(home / "jobs"):
        try:
            for c in p.children(recursive=True):
                c.kill()
            p.kill()
        except psutil.Error:
            pass


def is_daemon(pid: int) -> bool:
    """Is ``pid`` a daemon, started as users start it or forked for the tests
    (``preloaded``), and not a pid reused since?"""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "gpuwarden.daemon.main" in argv or "tests.integration.preloaded" in argv


def _end(home: Path) -> None:
    """Kill the daemon of ``home`` (by its lock file) and its jobs' trees."""
    try:
        pid = int((home / "daemon.lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pid = None
    if pid is not None and is_daemon(pid):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    if (home / "jobs").is_dir():
        _kill_jobs(home)


def stop_all() -> None:
    """End every daemon a test started and did not stop: run when the session ends,
    also when a test (or the whole run) was interrupted."""
    for home in sorted(STARTED):
        _end(home)
    STARTED.clear()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A running daemon over examples/idle-2gpu.json (2 x 24 GiB)."""
    yield from start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json")


def start_daemon(
    tmp: Path, scenario: Path, config: str = "", prepare: Callable[[Path], None] | None = None
) -> Iterator[Daemon]:
    """A daemon in a fresh home; ``prepare(home)`` runs first (a test may mount there)."""
    # A short directory: a unix socket path must stay under 108 bytes.
    short = Path(tempfile.mkdtemp(prefix="gw-"))
    os.chmod(short, 0o755)
    home = short / "home"
    home.mkdir()
    if prepare is not None:
        prepare(home)
    (home / "config.toml").write_text('interval = "100ms"\ngrace = "2s"\n' + config)
    env = make_env(tmp, scenario)
    env["GPUWARDEN_HOME"] = str(home)
    d = Daemon(home, env)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        _end(home)
        STARTED.discard(home)
        shutil.rmtree(short, ignore_errors=True)


def contexts_measured(*mib: int) -> Callable[[Path], None]:
    """A ``start_daemon`` prepare step: these CUDA contexts (MiB) already measured on the
    GPU model of examples/idle-2gpu.json (an NVIDIA L4 on the simulated driver), oldest
    first, in the state file the daemon then opens."""

    def prepare(home: Path) -> None:
        from gpuwarden.daemon.store import Store

        with Store(home / "state.db") as store:
            for at, value in enumerate(mib, start=1):
                store.add_context_sample("NVIDIA L4", "sim-550.00", value << 20, float(at))

    return prepare


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (for metrics_listen, web_listen)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raw_http(sock_path: Path, request: bytes, timeout: float = 15) -> tuple[int, bytes]:
    """Send ``request`` (raw bytes, which should ask for ``Connection: close``) over the
    daemon's unix socket; (status code, body) of the answer, read until the daemon closes
    the connection. For requests the CLI would never send."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock_path))
        s.sendall(request)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return status, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out


def http_request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """A raw HTTP/1.1 request with Content-Length and ``Connection: close``."""
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: localhost",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
