"""Entry point. Subcommands are imported only when invoked, so ``--help`` stays fast;
``status`` with a daemon running is answered before click is imported (``fast.py``)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing itself is not imported: cli/fast.py starts on this module
if TYPE_CHECKING:
    from typing import NoReturn

    import click

# name -> (module, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "status": ("gpuwarden.cli.status", "status", "Every GPU and GPU process, with leaks."),
    "leaks": ("gpuwarden.cli.leaks", "leaks", "Find leaked GPU memory and hidden holders."),
    "reap": ("gpuwarden.cli.leaks", "reap", "Kill what leaks memory and prove it came back."),
    "doctor": ("gpuwarden.cli.doctor", "doctor", "Diagnose the machine: findings and fixes."),
    "select": ("gpuwarden.cli.select", "select", "Print CUDA_VISIBLE_DEVICES for the best GPUs."),
    "exec": ("gpuwarden.cli.select", "exec_", "Run a command on the best GPUs, capped."),
    "gpu": ("gpuwarden.cli.settings", "gpu", "GPU settings (root): compute mode; drain a GPU."),
    "mps": ("gpuwarden.cli.settings", "mps", "Start, stop and inspect the MPS daemon (root)."),
    "daemon": ("gpuwarden.cli.daemon", "daemon", "Start, stop or check the job daemon."),
    "config": ("gpuwarden.cli.config", "config", "Check the daemon's config file."),
    "completion": ("gpuwarden.cli.completion", "completion",
                   "Shell completion script: bash, zsh or fish."),
    "man": ("gpuwarden.cli.manpage", "man", "The manual page: every command, exit codes."),
    "submit": ("gpuwarden.cli.jobs", "submit", "Queue a command; prints its job id."),
    "ps": ("gpuwarden.cli.jobs", "ps", "The job queue."),
    "show": ("gpuwarden.cli.jobs", "show", "One job, with its events."),
    "logs": ("gpuwarden.cli.jobs", "logs", "A job's stdout or stderr (-f to follow)."),
    "cancel": ("gpuwarden.cli.jobs", "cancel", "Cancel jobs and their process trees."),
    "wait": ("gpuwarden.cli.jobs", "wait", "Wait for jobs; exit with their exit code."),
    "hold": ("gpuwarden.cli.jobs", "hold", "Keep queued jobs from starting."),
    "edit": ("gpuwarden.cli.edit", "edit", "Change a queued or held job's request."),
    "release": ("gpuwarden.cli.jobs", "release", "Let held jobs start."),
    "retry": ("gpuwarden.cli.jobs", "retry", "Queue failed or cancelled jobs again."),
    "unreserve": ("gpuwarden.cli.jobs", "unreserve",
                  "Admins: clear memory a job holds after a leak."),
    "report": ("gpuwarden.cli.report", "report",
               "Accounting: GPU-hours, memory, OOMs, waits per user."),
    "rm": ("gpuwarden.cli.jobs", "rm", "Remove ended jobs (cancel waiting ones first)."),
    "exporter": ("gpuwarden.cli.exporter", "exporter", "Prometheus metrics on HTTP."),
    "clean": ("gpuwarden.cli.jobs", "clean", "Remove ended jobs older than a duration."),
    "top": ("gpuwarden.cli.top", "top", "Live view of GPUs, processes and jobs."),
    "web": ("gpuwarden.cli.web", "web", "The daemon's web page, for you, on a local port."),
    "cluster": ("gpuwarden.cli.cluster", "cluster", "Budgets on a Ray cluster (gpuwarden[ray])."),
}


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
    from gpuwarden.cli.fast import served

    if served(sys.argv[1:] if argv is None else argv):
        sys.exit(0)
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
        click.echo(f"gpuwarden: error: {_negative(e, argv) or e.format_message()}{see}",
                   err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"gpuwarden: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # Output piped into `head`: not an error worth a traceback.
        sys.stderr.close()
        sys.exit(0)
    # Without standalone mode click returns the exit code of ctx.exit() instead of exiting.
    sys.exit(rv if isinstance(rv, int) else 0)
