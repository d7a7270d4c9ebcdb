"""Fixtures for the integration tests."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.gpus.backend import Backend, open_backend
from tests.conftest import EXAMPLES
from tests.integration.daemon_fixture import daemon  # noqa: F401 — a fixture, used by name


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
