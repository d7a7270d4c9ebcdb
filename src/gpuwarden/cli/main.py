"""Entry point. Subcommands are imported only when invoked, so ``--help`` stays fast;
``status`` with a daemon running is answered before click is imported (``fast.py``)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing itself is not imported: cli/fast.py starts on this module
if TYPE_CHECKING:
    from typing import Any, NoReturn

    import click


def __getattr__(name: str) -> click.Group:
    """``cli``, the click group, built on first use: ``status`` served by the daemon
    (``cli/fast.py``) never imports click."""
    if name == "cli":
        from gpuwarden.cli.group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _negative(e: click.UsageError, argv: list[str] | None) -> str | None:
    """``--watch -1``: click reads ``-1`` as an unknown option; say what it is."""
    import click

    if not isinstance(e, click.NoSuchOption) or not e.option_name[1:2].isdigit():
        return None
    args = sys.argv[1:] if argv is None else argv
    i = args.index(e.option_name) if e.option_name in args else 0
    before = args[i - 1] if i > 0 and args[i - 1].startswith("--") else "a value"
    return f"{before}: must not be negative, got {e.option_name}"


def main(argv: list[str] | None = None) -> NoReturn:
    from gpuwarden.cli.fast import plain_status, served

    args = sys.argv[1:] if argv is None else argv
    if served(args):
        sys.exit(0)
    try:
        once = plain_status(args)
        if once is not None:  # no daemon answered: the snapshot is taken here, no click
            _status_once(once)
        _click_main(argv)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # Output piped into `head`: not an error worth a traceback.
        sys.stderr.close()
        sys.exit(0)


def _click_main(argv: list[str] | None) -> NoReturn:
    """Every other command, through click; its errors end in one line."""
    import click

    from gpuwarden.cli.group import cli
    from gpuwarden.errors import GpuwardenError

    try:
        rv = cli.main(args=argv, prog_name="gpuwarden", standalone_mode=False)
    except GpuwardenError as e:
        click.echo(f"gpuwarden: error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("gpuwarden: aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:
        e.show()  # a group named alone: its help
        sys.exit(e.exit_code)
    except click.UsageError as e:  # one line, as every other error: exit 2
        see = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
        click.echo(f"gpuwarden: error: {_negative(e, argv) or e.format_message()}{see}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"gpuwarden: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    # Without standalone mode click returns the exit code of ctx.exit() instead of exiting.
    sys.exit(rv if isinstance(rv, int) else 0)


def _status_once(opts: dict[str, Any]) -> NoReturn:
    """A plain ``status`` (options as ``cli/fast.py`` parsed them) answered without
    click; its errors end as ``main`` ends click's: one line, the error's exit code."""
    from gpuwarden.cli.statusonce import status_once
    from gpuwarden.errors import GpuwardenError

    try:
        status_once(opts["json"], tuple(opts["gpus"]), opts["user"], opts["pid"])
        sys.stdout.flush()
    except GpuwardenError as e:
        sys.stderr.write(f"gpuwarden: error: {e}\n")
        sys.exit(e.exit_code)
    sys.exit(0)
