"""pytest's hooks and the shared fixtures: an isolated simulated machine per test. What
tests import (the wait loop, the CLI runners, builders) is in ``tests/helpers/``."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import EXAMPLES
from tests.helpers.sim import SimMachine


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
