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


def registry_for(
    backend: Backend, *, cache_seconds: float, pid_labels: bool, holders: bool = True
) -> CollectorRegistry:
    """A registry with the snapshot collector over ``backend``."""
    from gpuwarden.metrics.collector import SnapshotCollector, SnapshotRegistry
    from gpuwarden.observe.snapshot import take_snapshot

    return SnapshotRegistry(
        SnapshotCollector(
            lambda: take_snapshot(backend, holders=holders),
            cache_seconds=cache_seconds,
            pid_labels=pid_labels,
            holders=holders,
        )
    )


def wsgi_app(registry: CollectorRegistry) -> Callable[..., Any]:
    """prometheus_client's /metrics app, except that a scrape of a snapshot registry in
    the text or OpenMetrics format (what ``choose_encoder`` picks from the Accept header)
    is rendered by its collector: the same bytes, cheaper. ``name[]`` filters and other
    methods go to prometheus_client as they are."""
    from prometheus_client import generate_latest, make_wsgi_app
    from prometheus_client.exposition import choose_encoder, gzip_accepted
    from prometheus_client.openmetrics.exposition import (
        generate_latest as openmetrics_latest,
    )

    from gpuwarden.metrics.collector import SnapshotRegistry
    from gpuwarden.metrics.gzipped import GzipSegments

    fallback = make_wsgi_app(registry)
    gzipped: dict[str, GzipSegments] = {}  # per format: the last scrape's pieces differ

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if (
            isinstance(registry, SnapshotRegistry)
            and environ["REQUEST_METHOD"] == "GET"
            and environ.get("PATH_INFO") != "/favicon.ico"
            and "name[]" not in environ.get("QUERY_STRING", "")
        ):
            encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
            base = getattr(encoder, "func", encoder)  # a functools.partial with options
            if base is generate_latest or base is openmetrics_latest:
                fmt = repr(
                    (
                        base.__module__,
                        getattr(encoder, "args", ()),
                        sorted(getattr(encoder, "keywords", {}).items()),
                    )
                )
                headers = [("Content-Type", content_type)]
                if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
                    pieces = registry.collector.render_segments(encoder, fmt)
                    segments = gzipped.get(fmt)
                    if segments is None:  # (not setdefault: a compressor is costly to make)
                        segments = gzipped[fmt] = GzipSegments()
                    output = segments.compress(pieces)
                    headers.append(("Content-Encoding", "gzip"))
                else:
                    output = registry.collector.render_text(encoder, fmt)
                start_response("200 OK", headers)
                return [output]
        result: list[bytes] = fallback(environ, start_response)
        return result

    return app


def start(listen: str, registry: CollectorRegistry) -> tuple[Any, threading.Thread]:
    """Serve /metrics from a background thread; returns (server, thread)."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    host, port = parse_listen(listen)
    try:
        # The address family from the address, as prometheus_client's server does.
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        Server.address_family = family
        server = make_server(
            str(sockaddr[0]), port, wsgi_app(registry), Server, handler_class=Quiet
        )
    except OSError as e:
        raise UsageError(f"cannot listen on {listen}: {e.strerror or e}") from None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def serve(
    listen: str, registry: CollectorRegistry, ready: Callable[[str, int], None] | None = None
) -> None:
    """Serve /metrics until SIGTERM or SIGINT."""
    import gc

    from gpuwarden.procs.holders import keep_fd_tables

    keep_fd_tables()  # every scrape scans /proc for device holders

    # A scrape of 8 GPUs x 200 processes makes some 10,000 short-lived objects, and
    # with the default first threshold (700) the collector's older generations were
    # walked often enough to cost 12% of each scrape (8.7 -> 7.6 ms). Collecting less
    # often keeps at most a scrape's worth of garbage a little longer.
    gc.set_threshold(10_000, 10, 10)
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
