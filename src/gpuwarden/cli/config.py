"""``gpuwarden config check``: validate the daemon's config file without starting
anything, so a typo is found before a restart, not by a daemon that will not start."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def config() -> None:
    """The daemon's config file."""


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
def check(path: Path | None) -> None:
    """Validate PATH (default: the config file the daemon reads) as the daemon would.

    \b
    Exit status:
      0  ok
      2  a problem: one line on stderr for each
    The sample deploy/config.toml shows every setting with its default."""
    import sys

    from gpuwarden.daemon.config import check_config

    if path is None:
        from gpuwarden.client.paths import resolve_paths

        path = resolve_paths().config
    problems = check_config(path)
    for line in problems:
        click.echo(f"gpuwarden: error: {line}", err=True)
    if problems:
        sys.exit(2)
    click.echo(f"{path}: ok")
