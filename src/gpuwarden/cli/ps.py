"""``gpuwarden ps``: the job queue as a table cut to the terminal, chosen columns, CSV
or JSON (streamed page by page), sorted by a key and optionally refreshed (``--watch``),
with the GPUs an admin drained under the table."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.common import format_option, watch_option
from gpuwarden.cli.daemon import connect
from gpuwarden.cli.plain import emit_json
from gpuwarden.errors import UsageError

if TYPE_CHECKING:
    from gpuwarden.client.api import Client
    from gpuwarden.client.views import JobDoc


def _age(iso: str | None) -> str:
    from datetime import datetime

    from gpuwarden.units import format_duration

    if not iso:
        return ""
    return format_duration(time.time() - datetime.fromisoformat(iso).timestamp())


def _span(start: str, end: str) -> str:
    from datetime import datetime

    from gpuwarden.units import format_duration

    return format_duration(
        datetime.fromisoformat(end).timestamp() - datetime.fromisoformat(start).timestamp()
    )


PS_SORT = ("id", "submitted", "user", "mem", "state")
PS_CSV = (
    "id",
    "user",
    "name",
    "group",
    "state",
    "gpus",
    "mem",
    "peak_memory",
    "submitted_at",
    "started_at",
    "ended_at",
    "exit_code",
    "restart",
    "restarts",
    "task",
    "reason",
    "command",
)
"""``ps --format csv`` columns: the job JSON's keys and units (bytes, ISO 8601 UTC
times); gpus space-separated, command quoted as a shell would; restart a service's
policy (on-failure, always; empty for a batch job) and restarts how often it restarted;
task an array's task (12_7), empty for a job of no array."""


def _sort_key(key: str) -> Any:
    from gpuwarden.jobs.model import STATES

    if key == "submitted":
        return lambda j: (j["submitted_at"] or "", j["id"])
    if key == "user":
        return lambda j: (j["user"], j["id"])
    if key == "mem":  # a whole GPU is more than any size
        return lambda j: (j["mem"] if j["mem"] else 1 << 62, j["id"])
    if key == "state":
        return lambda j: (STATES.index(j["state"]) if j["state"] in STATES else 99, j["id"])
    return lambda j: j["id"]


class SortType(click.ParamType):  # type: ignore[type-arg]
    """``--sort KEY`` ascending, ``--sort -KEY`` descending."""

    name = "[-]KEY"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if str(value).removeprefix("-") not in PS_SORT:
            self.fail(
                f"unknown sort key {value!r} (keys: {', '.join(PS_SORT)}; -KEY: descending)",
                param,
                ctx,
            )
        return str(value)

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[Any]:
        from click.shell_completion import CompletionItem

        sign = "-" if incomplete.startswith("-") else ""
        return [CompletionItem(sign + k) for k in PS_SORT if (sign + k).startswith(incomplete)]


def _ps_lines(jobs: Sequence[JobDoc], all_jobs: bool, columns: int | None = None) -> list[str]:
    """The ``ps`` table: one row a job whatever its name holds (control characters made
    visible), aligned by display width, the command quoted as a shell would take it.
    WAIT is the time from submission to the start (or until now), RUN the run time (so
    far, or to the end). ``columns``: cut each line to fit (a terminal's width); None:
    whole lines, for a pipe."""
    from gpuwarden.printable import clip, pad, visible, width
    from gpuwarden.units import GiB, format_bytes_short

    if not jobs:
        return ["No jobs" + ("" if all_jobs else " waiting or running (ps --all for ended)")]
    rows = [
        ("ID", "USER", "NAME", "STATE", "GPUS", "MEM", "PEAK", "WAIT", "RUN", "REASON / COMMAND")
    ]
    for j in jobs:
        started, ended = j["started_at"], j["ended_at"]
        wait = (
            _span(j["submitted_at"], started)
            if started
            else _span(j["submitted_at"], ended)
            if ended
            else _age(j["submitted_at"])
        )
        run = "" if not started else _span(started, ended) if ended else _age(started)
        what = j["reason"] or (
            (f"[{j['attach']}] " if j.get("attach") else "") + shlex.join(j["command"])
        )
        if j.get("fair_share"):  # fair share is on: what orders equal jobs of users
            what += f"  [fair share {j['fair_share']['usage'] / GiB / 3600:.1f} GiB·h]"
        state = j["state"]
        if j.get("service"):  # a service, and its restarts so far
            state += f" svc:{j.get('restarts') or 0}"
        arr = j.get("array")
        task = arr.get("task") if arr else None  # as squeue shows them: 12_7
        rows.append(
            (
                task or str(j["id"]),
                j["user"],
                j["name"] or "",
                state,
                ",".join(map(str, j["gpus"])) or "-",
                format_bytes_short(j["mem"]) if j["mem"] else "whole",
                format_bytes_short(j["peak_memory"]) if j["peak_memory"] else "-",
                wait,
                run or "-",
                what,
            )
        )
    shown = [[visible(c) for c in r] for r in rows]  # names, commands, reasons
    widths = [max(width(r[i]) for r in shown) for i in range(len(shown[0]) - 1)]
    lines = [
        "  ".join(pad(c, w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in shown
    ]
    return lines if columns is None else [clip(line, columns) for line in lines]


def _terminal_columns() -> int | None:
    """The terminal's width when printing to one (lines are cut to fit, as ps does),
    else None: a pipe or a file gets whole lines."""
    import shutil

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


PS_LATEST = 100  # jobs ps shows with --all (or --state) unless --limit says


def _stream_json(pages: Iterator[list[JobDoc]]) -> None:
    """``{"jobs": [...]}`` of every job, written page by page: a listing of 100,000
    jobs starts at once and never sits whole in memory (indented for a terminal)."""
    import json

    if sys.stdout.isatty():
        emit_json({"jobs": [j for page in pages for j in page]})
        return
    out = sys.stdout
    out.write('{"jobs":[')
    first = True
    for page in pages:
        for j in page:
            out.write(("" if first else ",") + json.dumps(j, separators=(",", ":"), default=str))
            first = False
    out.write("]}\n")


def _ps_csv(jobs: Sequence[Mapping[str, Any]], columns: Sequence[str] = PS_CSV) -> list[list[Any]]:
    def cell(j: Mapping[str, Any], c: str) -> Any:
        if c == "command":
            return shlex.join(j["command"])
        if c == "restart":
            return (j.get("service") or {}).get("restart")
        if c == "task":
            return (j.get("array") or {}).get("task")
        return j.get(c)

    return [[cell(j, c) for c in columns] for j in jobs]


class ColumnsType(click.ParamType):  # type: ignore[type-arg]
    """``-o id,state,mem``: some of the CSV columns, in this order."""

    name = "COL[,COL]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        cols = tuple(c.strip() for c in str(value).split(",") if c.strip())
        unknown = [c for c in cols if c not in PS_CSV]
        if unknown or not cols:
            self.fail(
                f"unknown column {(unknown or [value])[0]!r} (columns: {', '.join(PS_CSV)})",
                param,
                ctx,
            )
        return cols

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[Any]:
        from click.shell_completion import CompletionItem

        done, _, last = incomplete.rpartition(",")
        head = done + "," if done else ""
        return [CompletionItem(head + c) for c in PS_CSV if c.startswith(last)]


def _ps_columns_lines(jobs: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """``ps -o``: the chosen columns as a table, sizes short, times as stored."""
    from gpuwarden.printable import visible
    from gpuwarden.units import format_bytes_short

    def cell(c: str, v: Any) -> str:
        if c in ("mem", "peak_memory"):
            return format_bytes_short(v) if v else ("whole" if c == "mem" else "-")
        if c == "gpus":
            return ",".join(map(str, v)) or "-"
        return "" if v is None else str(v)

    rows = [[c.upper() for c in columns]]
    rows += [
        [visible(cell(c, v)) for c, v in zip(columns, r, strict=True)]
        for r in _ps_csv(jobs, columns)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]


@click.command()
@click.option("--all", "all_jobs", is_flag=True, help="Also jobs that have ended.")
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE[,STATE]",
    help="Only jobs in these states, ended ones too (repeatable): queued, held, "
    "reserved, running, succeeded, failed, cancelled, infeasible.",
)
@click.option("--user", help="Only this user's jobs.")
@click.option("--group", help="Only this group's jobs.")
@click.option(
    "--array",
    "array",
    type=click.IntRange(min=1),
    metavar="ID",
    help="Only the tasks of this array.",
)
@click.option(
    "--sort",
    "sort",
    type=SortType(),
    default="id",
    show_default=True,
    help=f"Order by {', '.join(PS_SORT)}; -KEY for descending.",
)
@format_option(
    "csv: a header row, then one row a job (columns: "
    + ", ".join(PS_CSV)
    + "; bytes, ISO 8601 UTC times)."
)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@click.option(
    "-o",
    "--columns",
    "columns",
    type=ColumnsType(),
    default=None,
    help="Only these columns, in this order (of the CSV ones), for the table "
    "or the CSV: e.g. -o id,state,mem,command.",
)
@watch_option("Refresh every INTERVAL (default 2s); with --json, one JSON document a line.")
@click.option(
    "--limit",
    "limit",
    type=click.IntRange(min=0),
    default=None,
    help=f"The latest N jobs (0: every one). Default: {PS_LATEST} in a table "
    "with --all or --state, every job otherwise (and in JSON and CSV).",
)
def ps(
    all_jobs: bool,
    states: tuple[str, ...],
    user: str | None,
    group: str | None,
    array: int | None,
    sort: str,
    fmt: str,
    as_json: bool,
    columns: tuple[str, ...] | None,
    watch: float | None,
    limit: int | None,
) -> None:
    """The queue: everyone's waiting and running jobs (--all: ended ones too)."""
    from gpuwarden.cli.common import emit_csv, watch_header

    fmt = "json" if as_json else fmt
    if watch is not None and watch <= 0:
        raise click.BadParameter("must be positive", param_hint="'--watch'")
    if watch is not None and fmt == "csv":
        raise UsageError("--watch prints a table or JSON lines, not CSV")
    if columns and fmt == "json":
        raise UsageError("-o chooses the columns of the table or the CSV; JSON has them all")
    client = connect()
    query = {
        "all": "1" if all_jobs else None,
        "user": user,
        "group": group,
        "state": ",".join(states) or None,
        "array": array,
    }
    history = all_jobs or bool(states)
    latest = limit if limit is not None else PS_LATEST if history and fmt == "table" else 0
    if fmt == "json" and watch is None and not latest and sort == "id":
        _stream_json(client.job_pages(query))  # every job, as the pages come
        return
    while True:
        if latest:
            jobs, older = client.latest_jobs(query, latest)
        else:
            jobs, older = client.all_jobs(query), False
        jobs.sort(key=_sort_key(sort.removeprefix("-")), reverse=sort.startswith("-"))
        if fmt == "csv":
            emit_csv(columns or PS_CSV, _ps_csv(jobs, columns or PS_CSV))
            return
        if fmt == "json" and watch is not None:
            import json

            click.echo(json.dumps({"jobs": jobs}, separators=(",", ":"), default=str))
        elif fmt == "json":
            emit_json({"jobs": jobs})
            return
        else:
            lines = (
                _ps_columns_lines(jobs, columns)
                if columns and jobs
                else _ps_lines(jobs, history, _terminal_columns())
            )
            lines += _drained_lines(client)
            if watch is not None:
                clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
                lines = [clear + watch_header("ps", watch), "", *lines]
            click.echo("\n".join(lines))
            if older:
                click.echo(
                    f"(the latest {latest} jobs: --limit N for more, --limit 0 for every job)",
                    err=True,
                )
        if watch is None:
            return
        sys.stdout.flush()
        time.sleep(watch)


def _drained_lines(client: Client) -> list[str]:
    """A line per GPU an admin drained (``gpu drain``), under the table."""
    from gpuwarden.render.statusview import drain_lines

    try:
        drains = client.request("GET", "/v1/drains")["drains"]
    except UsageError:  # a daemon from before drains
        return []
    return drain_lines(drains)
