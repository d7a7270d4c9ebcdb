"""Start supervisors from a pre-imported fork server instead of a fresh interpreter.

A fresh ``python -m gpuwarden.supervisor`` pays interpreter start-up and imports
(about 100 ms) before it does anything, on every launch. The daemon instead starts one
small helper process at start-up that has already imported the supervisor; each launch is
a request on a socket pair, and the helper forks a copy of itself that runs exactly what
``python -m gpuwarden.supervisor --nonce N JOBDIR`` would run (detach, claim the
directory, report). The daemon is multi-threaded, so it must not fork itself; the helper
is single-threaded and holds nothing but the socket.

Protocol: one JSON line per request ``{"jobdir", "nonce"}``, one JSON line per reply
``{"rc", "err"}`` (the exit status and stderr of the process that started the
supervisor, as ``spawn_supervisor`` sees them). The helper exits when the daemon's end of
the socket closes, so a dead daemon leaves no helper behind; supervisors it started are
detached and live on, as they must.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwarden.jobs.jobdir import SupervisorError, SupervisorHandle, void_start
from gpuwarden.supervisor import detach
from gpuwarden.supervisor.spawn import NotStarted, abandon_start, spawn_supervisor, started


class ForkServer:
    """The daemon's side: ``spawn(jobdir)`` is ``spawn_supervisor(jobdir)``, fast. Thread
    safe. The helper is started on first use and again if it died; when even that fails,
    launching falls back to a fresh interpreter, so a broken helper never stops jobs."""

    def __init__(
        self,
        python: str = sys.executable,
        *,
        timeout: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.python = python
        self.timeout = timeout
        self.env = env
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._file: io.BufferedRWPair | None = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [self.python, "-m", "gpuwarden.supervisor.forkserver", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                env=self.env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(self.timeout)
        self._sock = ours
        self._file = ours.makefile("rwb")

    def _stop(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()
        self._proc = self._sock = self._file = None

    def warm(self) -> None:
        """Start the helper now, so the first launch does not pay for it."""
        with self._lock:
            if self._file is None:
                try:
                    self._start()
                except OSError:
                    self._stop()

    def close(self) -> None:
        with self._lock:
            self._stop()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def spawn(self, jobdir: str | os.PathLike[str]) -> SupervisorHandle:
        """Start the supervisor for ``jobdir``; raises ``SupervisorError`` like
        ``spawn_supervisor``."""
        d = Path(jobdir).resolve()
        with self._lock:
            for _ in range(2):  # a helper that died since the last launch is restarted once
                nonce = secrets.token_hex(8)
                try:
                    if self._file is None:
                        self._start()
                    assert self._file is not None
                    self._file.write(
                        json.dumps({"jobdir": str(d), "nonce": nonce}).encode() + b"\n"
                    )
                    self._file.flush()
                except OSError:
                    self._stop()  # nothing was asked: safe to ask a fresh helper
                    continue
                try:
                    line = self._file.readline()
                    reply = json.loads(line) if line else None
                except (OSError, ValueError):
                    reply = None
                if not isinstance(reply, dict) or not isinstance(reply.get("rc"), int):
                    # The helper died or hung mid-request: the supervisor may or may not
                    # exist. It is ours only if it recorded our nonce; never start twice.
                    self._stop()
                    with contextlib.suppress(SupervisorError):
                        return started(d, nonce, 0, "")
                    if void_start(d, "gpuwarden fork server"):
                        raise NotStarted(
                            f"the launcher died before the supervisor for {d} "
                            "started; nothing of the job ran"
                        )
                    try:  # a supervisor claimed it meanwhile: ours if it has our nonce
                        return started(d, nonce, 0, "")
                    except SupervisorError:
                        abandon_start(d, nonce)
                        raise SupervisorError(
                            f"the launcher died while starting the supervisor for {d}"
                        ) from None
                return started(d, nonce, reply["rc"], str(reply.get("err", "")))
        return spawn_supervisor(d, self.python, timeout=self.timeout, env=self.env)


# ------------------------------------------------------------------------- the helper


def _start_one(request: Any) -> dict[str, Any]:
    """Start one supervisor as ``python -m gpuwarden.supervisor`` would (it forks
    twice and waits until the supervisor owns the directory) and return its status and
    message."""
    if (
        not isinstance(request, dict)
        or not isinstance(request.get("jobdir"), str)
        or not isinstance(request.get("nonce"), str)
    ):
        return {"rc": 2, "err": "gpuwarden supervisor: malformed launch request"}
    rc, err = detach.start(request["jobdir"], request["nonce"])
    return {"rc": rc, "err": err}


def _in_child(fd: int) -> Callable[[], None]:
    """After a fork in the helper: drop the helper's socket (a fork is not exec'd, so
    close-on-exec would not keep it from the supervisor and its job) and its ignored
    SIGINT (an ignored signal would be inherited through exec by the job). Only the
    helper's own forks do this; the supervisor's later forks are not the helper's."""
    helper = os.getpid()

    def child() -> None:
        if os.getppid() == helper:
            with contextlib.suppress(OSError):
                os.close(fd)
            signal.signal(signal.SIGINT, signal.SIG_DFL)

    return child


def serve(fd: int) -> int:
    """Answer launch requests on ``fd`` until the other end closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on a foreground daemon is its own
    os.register_at_fork(after_in_child=_in_child(fd))
    gc.freeze()  # keep the imported heap shared with forks: fewer copy-on-write faults
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    with sock, sock.makefile("rwb") as f:
        for line in f:
            try:
                request = json.loads(line)
            except ValueError:
                request = None
            try:
                reply = _start_one(request)
            except OSError as e:
                reply = {"rc": 1, "err": f"gpuwarden supervisor: cannot fork: {e}"}
            try:
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()
            except OSError:
                break
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
