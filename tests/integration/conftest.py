"""Fixtures for the integration tests."""

from tests.integration.daemon_fixture import daemon  # noqa: F401 — a fixture, used by name
