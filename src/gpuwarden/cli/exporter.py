"""``gpuwarden exporter``: Prometheus metrics for a machine without the daemon."""

from __future__ import annotations

import click

from gpuwarden.cli.common import DURATION


@click.command()
@click.option(
    "--listen", default="127.0.0.1:9402", show_default=True, help="HOST:PORT to serve /metrics on."
)
@click.option(
    "--cache",
    "cache_seconds",
    type=DURATION,
    default=1.0,
    show_default=True,
    help="Reuse one snapshot for scrapes this close together.",
)
@click.option(
    "--no-pid-labels",
    is_flag=True,
    help="Sum processes per GPU, user, container and job (fewer series).",
)
@click.option(
    "--no-holders",
    is_flag=True,
    help="Skip the /proc device-file scan (cheaper; no hidden-holder series).",
)
def exporter(listen: str, cache_seconds: float, no_pid_labels: bool, no_holders: bool) -> None:
    """Serve GPU, process, user and leak metrics at http://LISTEN/metrics."""
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.metrics.exporter import registry_for, serve

    backend = open_backend()
    registry = registry_for(
        backend, cache_seconds=cache_seconds, pid_labels=not no_pid_labels, holders=not no_holders
    )

    def ready(host: str, port: int) -> None:
        click.echo(f"gpuwarden exporter: serving http://{host}:{port}/metrics", err=True)

    try:
        serve(listen, registry, ready)
    finally:
        backend.close()
