"""``gpuwarden daemon start|stop|status`` and how client commands find (or start) one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, BinaryIO

import click

from gpuwarden.cli.common import DURATION
from gpuwarden.cli.plain import emit_json
from gpuwarden.errors import GpuwardenError

if TYPE_CHECKING:
    from gpuwarden.client.api import Client
    from gpuwarden.client.paths import Paths


def _pid(paths: Paths) -> int | None:
    try:
        return int(paths.lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _make_home(paths: Paths) -> None:
    """The state directory, created if missing; one line when it cannot be."""
    try:
        paths.home.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise GpuwardenError(
            f"the state directory {paths.home} is not a directory "
            "(GPUWARDEN_HOME names a directory)"
        ) from None
    except OSError as e:
        raise GpuwardenError(
            f"cannot create the state directory {paths.home}: {e.strerror or e}"
        ) from None


def _open_log(paths: Paths) -> BinaryIO:
    try:
        return open(paths.home / "daemon.log", "ab")
    except OSError as e:
        raise GpuwardenError(
            f"cannot write {paths.home / 'daemon.log'}: {e.strerror or e}"
        ) from None


def start_detached(paths: Paths, wait: float = 15.0) -> Client:
    """Start a daemon in its own session, logging to the state directory, and wait until
    it answers."""
    from gpuwarden.client.api import Client
    from gpuwarden.daemon.config import load_config

    _make_home(paths)
    load_config(paths)  # a bad config or socket path: its one line, here and now
    with _open_log(paths) as log:
        start = log.tell()
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden.daemon.main"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
                cwd="/",
            )
        except OSError as e:
            raise GpuwardenError(
                f"cannot start the daemon ({sys.executable}): {e.strerror or e}"
            ) from None
    client = Client(str(paths.socket))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if client.alive():
            return client
        if child.poll() is not None:
            if client.alive():  # another daemon started first: ours found its lock
                return client
            raise GpuwardenError(
                f"the daemon exited at once: {_last_error(paths, start)} "
                f"(see {paths.home / 'daemon.log'})"
            )
        time.sleep(0.05)
    raise GpuwardenError(f"the daemon did not start; see {paths.home / 'daemon.log'}")


def _last_error(paths: Paths, start: int) -> str:
    """What a daemon that exited at once wrote last to daemon.log: its reason."""
    try:
        with open(paths.home / "daemon.log", "rb") as f:
            f.seek(start)
            lines = f.read(1 << 16).decode(errors="replace").splitlines()
    except OSError:
        return "no reason recorded"
    lines = [ln.strip() for ln in lines if ln.strip()]
    if not lines:
        return "no reason recorded"
    last = lines[-1]
    for marker in (" ERROR ", " CRITICAL "):
        if marker in last:
            return last.split(marker, 1)[1]
    return last.removeprefix("gpuwarden: ")


def connect() -> Client:
    """A client for the configured daemon; a user-mode daemon is started on demand when
    none runs and none is configured. The system daemon (root's) never is: a root
    daemon with a world-writable socket is started only when someone asks for it."""
    from gpuwarden.client.api import Client, DaemonUnavailable
    from gpuwarden.client.paths import SYSTEM, USER, resolve_paths

    paths = resolve_paths()
    client = Client(str(paths.socket))
    if client.alive():
        return client
    if paths.mode == USER and not paths.configured:
        return start_detached(paths)
    if paths.mode == SYSTEM and not paths.configured:  # root, on a machine not set up
        raise DaemonUnavailable(
            f"no gpuwarden daemon answers at {paths.socket}, and a client never starts the "
            "system daemon: run it as a service (deploy/systemd/gpuwarden.service, then "
            "`systemctl enable --now gpuwarden`) or start it with `gpuwarden daemon start`; "
            "or set GPUWARDEN_HOME for a daemon of your own"
        )
    raise DaemonUnavailable(
        f"no gpuwarden daemon answers at {paths.socket}; start it with "
        "`gpuwarden daemon start` (or systemctl start gpuwarden)"
    )


@click.group()
def daemon() -> None:
    """The job daemon: one per state directory (GPUWARDEN_HOME)."""


@daemon.command()
@click.option("--foreground", is_flag=True, help="Stay in the foreground (for systemd).")
def start(foreground: bool) -> None:
    """Start the daemon (detached unless --foreground)."""
    from gpuwarden.client.api import Client
    from gpuwarden.client.paths import resolve_paths

    paths = resolve_paths()
    if Client(str(paths.socket)).alive():
        click.echo(f"gpuwarden daemon already running (pid {_pid(paths)}) on {paths.socket}")
        return
    if foreground:
        from gpuwarden.daemon.main import run

        _make_home(paths)
        raise SystemExit(run(paths))
    start_detached(paths)
    click.echo(f"gpuwarden daemon started (pid {_pid(paths)}) on {paths.socket}")


@daemon.command()
@click.option(
    "--timeout",
    type=DURATION,
    default=15.0,
    show_default=True,
    help="How long to wait for it to stop (e.g. 30s).",
)
def stop(timeout: float) -> None:
    """Stop the daemon. Running jobs keep running under their supervisors."""
    from gpuwarden.client.api import Client
    from gpuwarden.client.paths import resolve_paths
    from gpuwarden.procs.identity import alive, start_ticks

    paths = resolve_paths()
    pid = _pid(paths)
    if pid is None or not Client(str(paths.socket)).alive():
        click.echo("gpuwarden daemon is not running")
        return
    ticks = start_ticks(pid)  # so that a pid reused meanwhile is not waited on
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        click.echo("gpuwarden daemon is not running")
        return
    except PermissionError:
        raise GpuwardenError(f"not allowed to stop daemon pid {pid}") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Stopped once it has exited: a zombie its parent (often init) has not yet
        # reaped has stopped too (docs/design.md, invariant 7).
        if not alive(pid, None, ticks):
            click.echo(f"gpuwarden daemon (pid {pid}) stopped")
            return
        time.sleep(0.05)
    raise GpuwardenError(f"daemon pid {pid} did not stop within {timeout:g}s")


@daemon.command()
@click.option("--json", "as_json", is_flag=True)
def status(as_json: bool) -> None:
    """Whether a daemon runs, where, and its queue counts. Exit 1 when none runs."""
    from gpuwarden.client.api import Client
    from gpuwarden.client.paths import resolve_paths

    paths = resolve_paths()
    client = Client(str(paths.socket))
    running = client.alive()
    info: dict[str, object] = {
        "running": running,
        "pid": _pid(paths) if running else None,
        "socket": str(paths.socket),
        "home": str(paths.home),
    }
    if running:
        jobs = client.all_jobs()
        counts: dict[str, int] = {}
        for j in jobs:
            counts[j["state"]] = counts.get(j["state"], 0) + 1
        info["jobs"] = counts
    if as_json:
        emit_json(info)
    elif running:
        click.echo(
            f"gpuwarden daemon running (pid {info['pid']}) on {paths.socket}, state in "
            f"{paths.home}; jobs: "
            + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none")
        )
    else:
        click.echo(f"gpuwarden daemon not running (socket {paths.socket})")
    if not running:
        raise SystemExit(1)
