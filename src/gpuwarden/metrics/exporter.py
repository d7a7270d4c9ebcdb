"""The standalone exporter: /metrics over HTTP for machines without the daemon."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import UsageError
from gpuwarden.units import parse_listen as parse_listen  # its home: the parsers

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpuwarden.gpus.backend import Backend


def registry_for(backend: Backend, *, cache_seconds: float, pid_labels: bool,
                 holders: bool = True) -> CollectorRegistry:
    """A registry with the snapshot collector over ``backend``."""
    from prometheus_client import CollectorRegistry

    from gpuwarden.metrics.collector import SnapshotCollector
    from gpuwarden.observe.snapshot import take_snapshot

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: take_snapshot(backend, holders=holders),
                                        cache_seconds=cache_seconds, pid_labels=pid_labels,
                                        holders=holders))
    return registry


def start(listen: str, registry: CollectorRegistry) -> tuple[Any, threading.Thread]:
    """Serve /metrics from a background thread; returns (server, thread)."""
    from prometheus_client import start_http_server

    host, port = parse_listen(listen)
    try:
        return start_http_server(port, host, registry)
    except OSError as e:
        raise UsageError(f"cannot listen on {listen}: {e.strerror or e}") from None


def serve(listen: str, registry: CollectorRegistry,
          ready: Callable[[str, int], None] | None = None) -> None:
    """Serve /metrics until SIGTERM or SIGINT."""
    host, _ = parse_listen(listen)
    server, thread = start(listen, registry)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if ready is not None:
        ready(host, server.server_port)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
