"""``gpuwarden submit``: a command queued with its request, from the options and the
``#gpuwarden`` directives at the top of a script; the one-field options are made from
the table of request fields (jobs/request.py); ``--cluster`` sends it to Ray instead."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from gpuwarden.cli.common import DURATION, warn
from gpuwarden.cli.daemon import connect
from gpuwarden.cli.plain import emit_json
from gpuwarden.errors import UsageError

DIRECTIVE = "#gpuwarden"


def read_directives(command: Sequence[str]) -> list[str]:
    """Options from ``#gpuwarden --mem=14G`` lines at the top of a script (like #SBATCH):
    read up to the first line that is neither blank nor a comment."""
    path = Path(command[0])
    try:
        if not path.is_file():
            return []
    except OSError:  # e.g. a directory on the way that this user may not search
        return []
    tokens: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f):
                s = line.strip()
                if n > 500 or (s and not s.startswith("#")):
                    break
                if s.startswith(DIRECTIVE + " ") or s == DIRECTIVE:
                    tokens += shlex.split(s[len(DIRECTIVE) :])
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read directives from {path}: {e}") from None
    return tokens


NO_OPTION = ("command", "env", "attach")
"""Request fields without a submit option: the command is submit's argument, the
environment the caller's own, and ``attach`` belongs to ``gpuwarden attach``."""

# Options whose value is not the field as it is (text split or resolved, a path made
# absolute, a repeated option): help of their own.
_OWN_OPTIONS = {
    "cwd": click.option("--cwd", type=click.Path(file_okay=False), help="Working directory."),
    "env_keep": click.option(
        "--env-keep",
        "env_keep",
        multiple=True,
        help="Keep this credential-looking variable (repeatable).",
    ),
    "gpu_ids": click.option("--gpu-ids", help="Only these GPUs (comma-separated indices)."),
    "after": click.option(
        "--after",
        "after",
        multiple=True,
        help="Start only after this job succeeded (repeatable, or 3,5; an "
        "array's id: each of its tasks).",
    ),
    "after_any": click.option(
        "--after-any",
        "after_any",
        multiple=True,
        help="Start only after this job ended, however it ended (repeatable).",
    ),
    "after_fail": click.option(
        "--after-fail",
        "after_fail",
        multiple=True,
        help="Start only after this job ended without succeeding (repeatable).",
    ),
}
NOT_ONE_FIELD = tuple(_OWN_OPTIONS)
"""Request fields whose submit option is written here. Every other field but
``NO_OPTION`` has an option made from the table (jobs/request.py): its help, bounds,
choices and metavar."""


def _field_option(name: str) -> Any:
    """``--NAME`` for one request field: an integer's range, a choice's list (but
    restart's, which the daemon explains), a flag for a boolean, a duration parsed
    here, the help and metavar."""
    from gpuwarden.jobs import request

    f = request.FIELDS[name]
    kw: dict[str, Any] = {}
    if f.kind == request.INTEGER:
        kw["type"] = click.IntRange(f.lo, f.hi)
        if f.default is not None:
            kw.update(default=f.default, show_default=True)
    elif f.kind == request.CHOICE and name != "restart":
        kw["type"] = click.Choice(f.choices)
    elif f.kind == request.BOOLEAN:
        kw["is_flag"] = True
    elif f.kind == request.DURATION:
        kw["type"] = DURATION
    if f.metavar is not None:
        kw["metavar"] = f.metavar
    return click.option("--" + name.replace("_", "-"), help=f.help, **kw)


def _options_from_the_table() -> list[Any]:
    """submit's options, one a request field, in the table's order."""
    from gpuwarden.jobs.request import FIELDS

    return [
        _OWN_OPTIONS[name] if name in _OWN_OPTIONS else _field_option(name)
        for name in FIELDS
        if name not in NO_OPTION
    ]


_SUBMIT_OPTIONS = _options_from_the_table()


def _submit_options(f: Any) -> Any:
    for opt in reversed(_SUBMIT_OPTIONS):
        f = opt(f)
    return f


def _submit_to_ray(cluster: str, command: tuple[str, ...], opts: dict[str, Any]) -> None:
    """``submit --cluster``: the job goes to Ray's job API; Ray places it by its memory
    share, gpuwarden enforces it on the node (gpuwarden.ray)."""
    from gpuwarden.ray.submit import dashboard_address, submit
    from gpuwarden.units import parse_size

    if not command:
        raise UsageError("no command given (put it after --)")
    if opts["mem"] in (None, "auto"):
        raise UsageError("--cluster needs --mem SIZE: Ray places the job by its memory share")
    unsupported = [
        k
        for k in (
            "gpu_ids",
            "after",
            "after_any",
            "after_fail",
            "timeout",
            "mps",
            "cpus",
            "key",
            "mig",
            "notify",
            "array",
        )
        if opts.get(k) not in (None, False, (), 0)
    ]
    if unsupported:
        raise UsageError(
            "not supported with --cluster: "
            + ", ".join("--" + k.replace("_", "-") for k in unsupported)
        )
    sid = submit(
        dashboard_address(cluster),
        mem=parse_size(opts["mem"]),
        gpus=opts["gpus"],
        command=list(command),
        retries=opts["retries"] or 0,
        name=opts["name"],
        qos=opts.get("qos"),
        priority=opts.get("priority") or 0,
    )
    click.echo(sid)


# Parsing stops at the command (its options are its own); an unknown option before it
# is a typo, not the start of the command.
@click.command(context_settings={"allow_interspersed_args": False})
@_submit_options
@click.option(
    "--cluster",
    help="Submit to a Ray cluster instead: ray (RAY_ADDRESS or the "
    "local dashboard), ray://HOST:PORT or http://HOST:PORT.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx: click.Context, /, command: tuple[str, ...], as_json: bool, **opts: Any) -> None:
    """Queue COMMAND (after --) and print its job id.

    A script may carry its options in lines such as `#gpuwarden --mem=14G` at its top;
    options on the command line win."""
    cluster = opts.pop("cluster")
    if cluster is not None:
        _submit_to_ray(cluster, command, opts)
        return
    tokens = read_directives(command)
    if tokens:
        try:  # no --help here: it would print help and exit 0 with nothing submitted
            dctx = _directive_command.make_context("#gpuwarden", list(tokens), help_option_names=[])
        except click.ClickException as e:
            raise UsageError(f"{command[0]}: {DIRECTIVE} line: {e.format_message()}") from None
        for name, value in dctx.params.items():
            if ctx.get_parameter_source(name) != click.core.ParameterSource.COMMANDLINE:
                opts[name] = value
    from gpuwarden.jobs.request import BOOLEAN, FIELDS

    body: dict[str, Any] = {
        "command": list(command),
        "cwd": os.path.abspath(opts["cwd"] or os.getcwd()),
        "env": dict(os.environ),
        "env_keep": list(opts["env_keep"]),
        # Job ids, ranges and tasks (12_7); an array's id stands for each of its tasks.
        "after": [],
        "after_any": [],
        "after_fail": [],
        # Each field with an option of its own, as the option gives it: a flag always,
        # another where it was given.
        **{
            name: value
            for name, value in opts.items()
            if name in FIELDS
            and name not in NOT_ONE_FIELD
            and (value is not None or FIELDS[name].kind == BOOLEAN)
        },
    }
    if opts.get("array") is not None:
        from gpuwarden.jobs.arrays import parse_array

        parse_array(opts["array"])  # here, before a daemon is asked (or started)
    if opts["mem"] not in (None, "auto"):
        from gpuwarden.units import parse_size_or_fraction

        try:  # here, before a daemon is asked (or started)
            parse_size_or_fraction(opts["mem"])
        except UsageError as e:
            raise UsageError(f"--mem: {e}") from None
    if opts["gpu_ids"]:
        try:
            body["gpu_ids"] = [int(x) for x in opts["gpu_ids"].split(",")]
        except ValueError:
            raise UsageError(f"invalid --gpu-ids {opts['gpu_ids']!r}") from None
    _check_launchable(command, body["cwd"])
    from gpuwarden.cli.jobrefs import resolve_ids
    from gpuwarden.jobs.arrays import parse_refs

    for kind in ("after", "after_any", "after_fail"):
        parse_refs(opts[kind])  # a bad one is an error before a daemon is asked
    client = connect()
    for kind in ("after", "after_any", "after_fail"):
        if opts[kind]:
            body[kind], missing = resolve_ids(client, opts[kind])
            if missing:
                raise SystemExit(2)
    job = client.request("POST", "/v1/jobs", body=body)
    if job.get("dropped_env"):
        warn(
            "not passed to the job (they look like credentials): "
            + ", ".join(job["dropped_env"])
            + "; keep one with --env-keep NAME"
        )
    if not job.get("created"):
        warn(f"key {body.get('key')!r} already names job {job['id']} ({job['state']})")
    if as_json:
        emit_json(job)
    else:
        click.echo(job["id"])
        if job.get("tasks") and job.get("created"):
            limit = job["array"]["limit"]
            warn(
                f"array {job['id']}: {job['tasks']} tasks (the first {job['array']['task']})"
                + ("" if limit is None else f", at most {limit} at once")
            )
        if job["state"] == "infeasible":
            warn(f"job {job['id']} can never run here: {job['reason']}")
        if job.get("group_held"):
            warn(
                f"job {job['id']} is held: {job['group_held']}; "
                f"`gpuwarden release {job['id']}` lets it run"
            )


def _check_launchable(command: Sequence[str], cwd: str) -> None:
    """Refuse at submit, as the submitter, what could never start: a missing or unusable
    working directory, a command not on PATH or not executable. The supervisor checks
    again at launch as the job's user (``launch_problem``, one rule for both)."""
    from gpuwarden.launch import launch_problem

    problem = launch_problem(command, cwd, os.environ)
    if problem is not None:
        raise UsageError(f"{problem[1]} (nothing was submitted)")


@click.command()
@_submit_options
def _directive_command(**opts: Any) -> None:  # parses #gpuwarden lines only
    pass
