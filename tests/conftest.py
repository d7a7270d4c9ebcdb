"""Shared fixtures: an isolated simulated machine per test, the CLI (in this process
where that is the same, else as a subprocess) and the one wait loop."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SRC = ROOT / "src"


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM to the test run unwinds it as Ctrl-C does, so every fixture's
    teardown runs (daemons stopped, job trees killed) instead of leaving them behind."""
    signal.signal(signal.SIGTERM, _terminated)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Ray's cluster tests first (with ``--no-loadscope-reorder``, as make test runs
    them: xdist would otherwise hand out files by their number of tests, and the Ray
    file, a dozen tests over two minutes on one worker, would start late and end last);
    then the other files by their number of tests, most first."""
    per_file: dict[Path, int] = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0) + 1
    items.sort(key=lambda item: (item.path.parent.name != "ray", -per_file[item.path]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Whatever a test started and an interrupted teardown left: stop it now."""
    from tests.integration import preloaded
    from tests.integration.daemon_fixture import stop_all

    stop_all()
    preloaded.stop()


@dataclass
class SimMachine:
    """A simulated machine: scenario + private state dir; runs gpuwarden and sim jobs."""

    scenario: Path
    state: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            GPUWARDEN_SIM=str(self.scenario),
            GPUWARDEN_SIM_STATE=str(self.state),
            PYTHONPATH=str(SRC) + os.pathsep + env.get("PYTHONPATH", ""),
            COLUMNS="100",
            PYTHONUNBUFFERED="1",
        )
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    def cli(
        self,
        *args: str,
        check: bool = False,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        process: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """``gpuwarden ARGS``: in this process where that is the same (see
        ``daemon_fixture.in_process_ok``), else, or with ``process``, in its own."""
        from tests.integration.daemon_fixture import in_process_ok

        if not process and in_process_ok(args):
            return run_in_process(env or self.env, *args, check=check)
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"gpuwarden {' '.join(args)} -> {r.returncode}\n{r.stderr}")
        return r

    def json(self, *args: str) -> Any:
        return json_answer(self.cli(*args, "--json"), args)

    def job(
        self, *args: str, gpus: str | None = None, wait_ready: bool = True, **popen: Any
    ) -> subprocess.Popen[str]:
        """Start a simulated GPU job and wait until it holds its memory."""
        env = self.env
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        p = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden.sim.job", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )
        self.procs.append(p)
        if wait_ready:
            assert p.stdout is not None
            line = p.stdout.readline()
            err = p.stderr.read() if p.stderr and p.poll() is not None else ""
            assert line.startswith("ready"), f"job did not start: {line!r} {err}"
        return p

    def cleanup(self) -> None:
        for p in self.procs:
            end_process(p)


def end_process(p: subprocess.Popen[Any]) -> None:
    """Kill ``p`` unless it has ended, wait for it and close its pipes (a pipe left open
    is a ResourceWarning when it is collected)."""
    with p:  # leaving closes the pipes and waits
        p.kill()  # nothing where it was already waited for


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimMachine]:
    m = SimMachine(EXAMPLES / "idle-2gpu.json", tmp_path / "state")
    yield m
    m.cleanup()


@pytest.fixture
def make_sim(tmp_path: Path) -> Iterator[Any]:
    made: list[SimMachine] = []

    def make(scenario: str | dict[str, Any]) -> SimMachine:
        if isinstance(scenario, dict):
            path = tmp_path / f"scenario{len(made)}.json"
            path.write_text(json.dumps(scenario))
        else:
            path = EXAMPLES / scenario
        m = SimMachine(path, tmp_path / f"state{len(made)}")
        made.append(m)
        return m

    yield make
    for m in made:
        m.cleanup()


@functools.lru_cache(maxsize=1)
def nobody_prefix() -> tuple[str, ...] | None:
    """argv prefix that runs this test's Python as nobody, or None where that cannot be
    done (not root, no setpriv/runuser, or nobody cannot reach this interpreter)."""
    if os.geteuid() != 0:
        return None
    for prefix in (
        ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
        ("runuser", "-u", "nobody", "--"),
    ):
        if shutil.which(prefix[0]) is None:
            continue
        probe = subprocess.run(
            [*prefix, sys.executable, "-c", "import click, psutil, gpuwarden"],
            env={**os.environ, "PYTHONPATH": str(SRC)},
            capture_output=True,
            timeout=60,
            check=False,
        )
        if probe.returncode == 0:
            return prefix
    return None


def json_answer(r: subprocess.CompletedProcess[str], args: tuple[str, ...]) -> Any:
    """A ``--json`` command's answer; ``leaks`` and ``doctor`` exit 1 when they find
    something, and their JSON is the answer then too."""
    ok = (0, 1) if args[:1] in (("leaks",), ("doctor",)) else (0,)
    if r.returncode not in ok:
        raise AssertionError(
            f"gpuwarden {' '.join(args)} --json -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        )
    return json.loads(r.stdout)


def run_in_process(
    env: dict[str, str], *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``gpuwarden ARGS`` run by this process with ``env`` (alone, as a fresh process
    would have it) and its output captured: the same words and exit status as a
    ``gpuwarden`` started for it, without the interpreter (over a thousand of them were
    a third of the suite's CPU). Only for commands that start nothing and need no
    terminal."""
    import contextlib
    import io

    from gpuwarden.cli.main import main

    # Text over bytes, as a process's own streams are (the JSON fast path writes the
    # daemon's bytes to sys.stdout.buffer).
    raw = (io.BytesIO(), io.BytesIO())
    out, err = (io.TextIOWrapper(b, encoding="utf-8", errors="replace") for b in raw)
    saved, code = dict(os.environ), 0
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out.flush()
    err.flush()
    texts = [b.getvalue().decode("utf-8", "replace") for b in raw]
    r = subprocess.CompletedProcess(["gpuwarden", *args], code, *texts)
    if check and r.returncode != 0:
        raise AssertionError(
            f"gpuwarden {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        )
    return r


def wait_for(
    pred: Any,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str | Callable[[Any], str] = "the condition",
    until: Callable[[Any], Any] | None = None,
) -> Any:
    """``pred()``'s first true value, asked every ``interval`` seconds: the one wait loop
    of the tests. Past ``timeout`` it fails, naming ``what`` it waited for.

    With ``until``, ``pred()`` is what is observed and ``until(value)`` says whether it
    holds; the value that held is returned. ``what`` may also be a function of the last
    value observed, returning the whole failure message."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if until(value) if until is not None else value:
            return value
        if time.monotonic() > deadline:
            if callable(what):
                raise AssertionError(what(value))
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
