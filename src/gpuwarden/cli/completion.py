"""``gpuwarden completion bash|zsh|fish``: click's completion script for the shell, so
that users need not know click's environment variable to get it."""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (commands, options, choices).

    \b
    bash:  eval "$(gpuwarden completion bash)"    (in ~/.bashrc)
    zsh:   eval "$(gpuwarden completion zsh)"     (in ~/.zshrc)
    fish:  gpuwarden completion fish > ~/.config/fish/completions/gpuwarden.fish"""
    from click.shell_completion import get_completion_class

    from gpuwarden.cli.main import cli

    cls = get_completion_class(shell)
    assert cls is not None  # every one of SHELLS is click's
    click.echo(cls(cli, {}, "gpuwarden", "_GPUWARDEN_COMPLETE").source())
