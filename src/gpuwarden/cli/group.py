"""The click group of every command, each imported only when invoked (``commands.COMMANDS``)."""

from __future__ import annotations

import importlib
import os

import click

from gpuwarden import __version__
from gpuwarden.cli.commands import COMMANDS


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(entry[0])
        cmd = getattr(module, entry[1])
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuwarden")
@click.option(
    "--sim",
    metavar="SCENARIO",
    envvar="GPUWARDEN_SIM",
    help="Use the simulated backend with this scenario file (or set GPUWARDEN_SIM).",
)
def cli(sim: str | None) -> None:
    """gpuwarden: see, clean and share the GPUs of a multi-user Linux machine."""
    if sim:
        os.environ["GPUWARDEN_SIM"] = sim
