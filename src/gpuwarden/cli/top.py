"""``gpuwarden top``: a live, interactive view of GPUs, processes and jobs (textual)."""

from __future__ import annotations

import sys

import click

from gpuwarden.cli.common import DURATION
from gpuwarden.errors import UsageError


@click.command()
@click.option(
    "--interval",
    type=DURATION,
    default=2.0,
    show_default=True,
    help="Seconds between refreshes (e.g. 1, 500ms).",
)
def top(interval: float) -> None:
    """Live view of every GPU's memory (by job, other processes, leaked, free) and a
    table of GPU processes and daemon jobs, queued ones included.

    \b
    Keys: s sort (memory/pid/user/gpu), u filter by user, g cycle GPU filter,
    Enter details, c cancel the selected job, d doctor findings, r refresh, q quit.
    Needs a terminal; in scripts use `gpuwarden status --json` and `gpuwarden ps`."""
    if interval <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            "top needs an interactive terminal; in scripts use "
            "`gpuwarden status --json` or `gpuwarden ps --json`"
        )
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.procs.holders import keep_fd_tables

    keep_fd_tables()  # its doctor screen scans the device files sample after sample
    backend = open_backend()
    try:
        from gpuwarden.tui.app import TopApp

        TopApp(backend, interval=interval).run()
    finally:
        backend.close()
