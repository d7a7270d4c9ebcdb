"""Fixtures for the integration tests."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.gpus.backend import Backend, open_backend
from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import (  # noqa: F401 — daemon: a fixture, used by name
    Daemon,
    daemon,
    free_port,
    start_daemon,
)


@pytest.fixture
def leaky(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Backend]:
    """The leaky 4-GPU scenario, private simulation state, and no daemon to reach (for
    ``top``'s tests)."""
    monkeypatch.setenv("GPUWARDEN_SIM", str(EXAMPLES / "leaky-4gpu.json"))
    monkeypatch.setenv("GPUWARDEN_SIM_STATE", str(tmp_path / "sim"))
    monkeypatch.setenv("GPUWARDEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    b = open_backend()
    yield b
    b.close()


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    """A daemon serving its /metrics (each scrape at most 100 ms old), and their URL."""
    port = free_port()
    for d in start_daemon(
        tmp_path,
        EXAMPLES / "idle-2gpu.json",
        f'metrics_listen = "127.0.0.1:{port}"\nmetrics_cache = "100ms"\n',
    ):
        yield d, f"http://127.0.0.1:{port}/metrics"
