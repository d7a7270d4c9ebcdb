"""Daemons for the tests, forked from one process that imported the daemon once.

A daemon started as users start it (``python -m gpuwarden.daemon.main``) spends about
half its start-up CPU importing aiohttp and the daemon's modules; the suite starts some
two hundred of them on two cores. This process imports them once per pytest worker,
then forks one daemon per request: the child leaves the session, takes the request's
environment, writes to the daemon's log and runs ``gpuwarden.daemon.main.run`` as the
module's ``__main__`` does. Nothing the daemon reads comes from its import (paths,
config and the backend are read from the environment when it runs), and what it draws
at random comes from ``secrets``, which a fork does not repeat. The tests of ``daemon
start`` itself still start it with the CLI.

Protocol, one JSON line each way: ``{"env": {...}, "log": PATH}`` in, ``{"pid": N}`` out.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PRELOAD = ("gpuwarden.daemon.main", "gpuwarden.gpus.sim", "gpuwarden.observe.snapshot")
"""What each daemon would import, and what its first pass would."""
_forker: subprocess.Popen[str] | None = None


def fork_daemon(env: dict[str, str], log: Path) -> int:
    """A daemon forked with ``env``, writing to ``log``: its pid (it answers later)."""
    global _forker
    if _forker is None or _forker.poll() is not None:
        _forker = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.preloaded"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"},
        )
    assert _forker.stdin is not None and _forker.stdout is not None
    _forker.stdin.write(json.dumps({"env": env, "log": str(log)}) + "\n")
    _forker.stdin.flush()
    line = _forker.stdout.readline()
    if not line:
        raise AssertionError("the process that forks the tests' daemons has gone")
    return int(json.loads(line)["pid"])


def stop() -> None:
    """End this worker's forking process (its daemons are stopped by their tests)."""
    global _forker
    if _forker is not None:
        for pipe in (_forker.stdin, _forker.stdout):
            if pipe is not None:
                pipe.close()  # it reads end of file and exits
        _forker.wait(timeout=10)
        _forker = None


def _daemon(request: dict[str, Any]) -> None:
    """In the forked child: become the daemon ``python -m gpuwarden.daemon.main``
    would be, in its own session, and exit with its status; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the daemon waits for its children
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir("/")
        os.environ.clear()
        os.environ.update(request["env"])
        from gpuwarden.daemon.main import run

        code = run()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    for module in PRELOAD:
        importlib.import_module(module)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # daemons that end are reaped at once
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _daemon(request)
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
