"""``gpuwarden man``: gpuwarden(1), written from the click commands themselves when asked,
so the page cannot drift from ``--help``."""

from __future__ import annotations

import click

EXIT_STATUS = (
    ("0", "success; doctor: no critical finding; leaks: no leak"),
    ("1", "doctor: a critical finding; leaks: a leak (for cron and monitors)"),
    (
        "2",
        "bad usage or input (one line on stderr), a job that can never run here, a "
        "config file with problems",
    ),
    ("3", "no GPU backend, or no daemon answers"),
    ("124", "wait: the timeout passed"),
    ("130", "interrupted"),
    ("N", "wait: the job's own exit code"),
)
ENVIRONMENT = (
    ("GPUWARDEN_SIM", "a scenario file: the simulated backend instead of NVML (as --sim)"),
    ("GPUWARDEN_HOME", "the daemon's state directory (socket, database, config.toml)"),
)
FILES = (
    (
        "/etc/gpuwarden/config.toml",
        "the system daemon's config; deploy/config.toml is a "
        "commented sample; check one with gpuwarden config check",
    ),
    ("/run/gpuwarden.sock", "the system daemon's socket"),
)


def _roff(text: str) -> str:
    """Text as roff reads it: backslashes and leading dots or quotes escaped."""
    out = []
    for line in text.replace("\\", "\\e").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _help(cmd: click.Command) -> str:
    """The command's help as --help shows it: click's \\b blocks kept as lines."""
    text = (cmd.help or cmd.short_help or "").strip()
    paras = []
    for para in text.split("\n\n"):
        if para.lstrip().startswith("\b"):
            lines = para.lstrip()[1:].strip("\n").splitlines()
            paras.append(".nf\n" + _roff("\n".join(lines)) + "\n.fi")
        else:
            paras.append(_roff(" ".join(para.split())))
    return "\n.PP\n".join(paras)


def _options(ctx: click.Context, cmd: click.Command) -> list[str]:
    out = []
    for param in cmd.get_params(ctx):
        if not isinstance(param, click.Option) or param.name == "help":
            continue  # arguments are in the usage line; every command has --help
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, helptext = record
        out += [".TP", f"\\fB{_roff(names)}\\fR", _roff(" ".join(helptext.split()))]
    return out


def _command(ctx: click.Context, path: str, cmd: click.Command) -> list[str]:
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out = [f'.SS "{path} {_roff(usage)}"'.replace("  ", " "), _help(cmd)]
    out += _options(ctx, cmd)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                sub_ctx = click.Context(sub, info_name=name, parent=ctx)
                out += _command(sub_ctx, f"{path} {name}", sub)
    return out


def manpage() -> str:
    from gpuwarden.cli.main import cli

    root = click.Context(cli, info_name="gpuwarden")
    lines = [
        '.TH GPUWARDEN 1 "" "gpuwarden" "User Commands"',
        ".SH NAME",
        "gpuwarden \\- see, clean and share the GPUs of a multi-user Linux machine",
        ".SH SYNOPSIS",
        ".B gpuwarden",
        "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        _help(cli),
        ".PP",
        "Every read command takes --json (a stable schema: bytes and seconds); status and "
        "ps take --format csv. Durations take units (500ms, 30s, 10m, 2h, 7d); sizes take "
        "a unit (14G, 512MiB).",
        ".SH OPTIONS",
        *_options(root, cli),
        ".SH COMMANDS",
    ]
    for name in cli.list_commands(root):
        cmd = cli.get_command(root, name)
        assert cmd is not None
        lines += _command(click.Context(cmd, info_name=name, parent=root), f"gpuwarden {name}", cmd)
    for title, rows in (
        ("EXIT STATUS", EXIT_STATUS),
        ("ENVIRONMENT", ENVIRONMENT),
        ("FILES", FILES),
    ):
        lines.append(f".SH {title}")
        for key, text in rows:
            lines += [".TP", f"\\fB{_roff(key)}\\fR", _roff(text)]
    lines += [".SH SEE ALSO", "nvidia-smi(1), the README of gpuwarden"]
    return "\n".join(lines) + "\n"


@click.command("man")
@click.option(
    "--roff",
    is_flag=True,
    help="Print the page's roff source, even on a terminal "
    "(e.g. to install it: gpuwarden man --roff > "
    "/usr/local/share/man/man1/gpuwarden.1).",
)
def man(roff: bool) -> None:
    """The manual page: every command with its options, the exit codes, the environment
    and the files. On a terminal it opens in man(1); piped, it is roff (man -l -)."""
    import shutil
    import subprocess
    import sys

    page = manpage()
    viewer = shutil.which("man")
    if roff or not sys.stdout.isatty() or viewer is None:
        click.echo(page, nl=False)
        return
    subprocess.run([viewer, "-l", "-"], input=page, text=True, check=False)
