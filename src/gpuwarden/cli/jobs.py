"""The everyday queue verbs: ps, show, logs, cancel, wait, hold, release, retry,
rm, clean. Each is a thin call to the daemon's API; ``--json`` prints what it returns."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.common import DURATION, emit_json
from gpuwarden.cli.daemon import connect
from gpuwarden.cli.jobrefs import JOB, one_job, resolve_ids
from gpuwarden.errors import UsageError

if TYPE_CHECKING:
    from gpuwarden.client.api import Client
    from gpuwarden.client.views import JobDoc

TERMINAL = ("succeeded", "failed", "cancelled", "infeasible")


def _age(iso: str | None) -> str:
    from datetime import datetime

    from gpuwarden.units import format_duration

    if not iso:
        return ""
    return format_duration(time.time() - datetime.fromisoformat(iso).timestamp())


def _span(start: str, end: str) -> str:
    from datetime import datetime

    from gpuwarden.units import format_duration

    return format_duration(datetime.fromisoformat(end).timestamp() -
                           datetime.fromisoformat(start).timestamp())


PS_SORT = ("id", "submitted", "user", "mem", "state")
PS_CSV = ("id", "user", "name", "group", "state", "gpus", "mem", "peak_memory",
          "submitted_at", "started_at", "ended_at", "exit_code", "restart", "restarts",
          "task", "reason", "command")
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

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        if str(value).removeprefix("-") not in PS_SORT:
            self.fail(f"unknown sort key {value!r} (keys: {', '.join(PS_SORT)}; "
                      "-KEY: descending)", param, ctx)
        return str(value)

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        sign = "-" if incomplete.startswith("-") else ""
        return [CompletionItem(sign + k) for k in PS_SORT if (sign + k).startswith(incomplete)]


def _ps_lines(jobs: Sequence[JobDoc], all_jobs: bool,
              columns: int | None = None) -> list[str]:
    """The ``ps`` table: one row a job whatever its name holds (control characters made
    visible), aligned by display width, the command quoted as a shell would take it.
    WAIT is the time from submission to the start (or until now), RUN the run time (so
    far, or to the end). ``columns``: cut each line to fit (a terminal's width); None:
    whole lines, for a pipe."""
    from gpuwarden.printable import clip, pad, visible, width
    from gpuwarden.units import GiB, format_bytes_short

    if not jobs:
        return ["No jobs" + ("" if all_jobs else " waiting or running (ps --all for ended)")]
    rows = [("ID", "USER", "NAME", "STATE", "GPUS", "MEM", "PEAK", "WAIT", "RUN",
             "REASON / COMMAND")]
    for j in jobs:
        started, ended = j["started_at"], j["ended_at"]
        wait = (_span(j["submitted_at"], started) if started else
                _span(j["submitted_at"], ended) if ended else _age(j["submitted_at"]))
        run = "" if not started else _span(started, ended) if ended else _age(started)
        what = j["reason"] or ((f"[{j['attach']}] " if j.get("attach") else "")
                               + shlex.join(j["command"]))
        if j.get("fair_share"):  # fair share is on: what orders equal jobs of users
            what += f"  [fair share {j['fair_share']['usage'] / GiB / 3600:.1f} GiB·h]"
        state = j["state"]
        if j.get("service"):  # a service, and its restarts so far
            state += f" svc:{j.get('restarts') or 0}"
        arr = j.get("array")
        task = arr.get("task") if arr else None  # as squeue shows them: 12_7
        rows.append((task or str(j["id"]), j["user"], j["name"] or "", state,
                     ",".join(map(str, j["gpus"])) or "-",
                     format_bytes_short(j["mem"]) if j["mem"] else "whole",
                     format_bytes_short(j["peak_memory"]) if j["peak_memory"] else "-",
                     wait, run or "-", what))
    shown = [[visible(c) for c in r] for r in rows]  # names, commands, reasons
    widths = [max(width(r[i]) for r in shown) for i in range(len(shown[0]) - 1)]
    lines = ["  ".join(pad(c, w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
             for r in shown]
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
            out.write(("" if first else ",") + json.dumps(j, separators=(",", ":"),
                                                          default=str))
            first = False
    out.write("]}\n")


def _ps_csv(jobs: Sequence[Mapping[str, Any]],
            columns: Sequence[str] = PS_CSV) -> list[list[Any]]:
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

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        cols = tuple(c.strip() for c in str(value).split(",") if c.strip())
        unknown = [c for c in cols if c not in PS_CSV]
        if unknown or not cols:
            self.fail(f"unknown column {(unknown or [value])[0]!r} (columns: "
                      f"{', '.join(PS_CSV)})", param, ctx)
        return cols

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[Any]:
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
    rows += [[visible(cell(c, v)) for c, v in zip(columns, r, strict=True)]
             for r in _ps_csv(jobs, columns)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


@click.command()
@click.option("--all", "all_jobs", is_flag=True, help="Also jobs that have ended.")
@click.option("--state", "states", multiple=True, metavar="STATE[,STATE]",
              help="Only jobs in these states, ended ones too (repeatable): queued, held, "
                   "reserved, running, succeeded, failed, cancelled, infeasible.")
@click.option("--user", help="Only this user's jobs.")
@click.option("--group", help="Only this group's jobs.")
@click.option("--array", "array", type=click.IntRange(min=1), metavar="ID",
              help="Only the tasks of this array.")
@click.option("--sort", "sort", type=SortType(), default="id", show_default=True,
              help=f"Order by {', '.join(PS_SORT)}; -KEY for descending.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]),
              default="table", show_default=True,
              help="csv: a header row, then one row a job (columns: " + ", ".join(PS_CSV)
                   + "; bytes, ISO 8601 UTC times).")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@click.option("-o", "--columns", "columns", type=ColumnsType(), default=None,
              help="Only these columns, in this order (of the CSV ones), for the table "
                   "or the CSV: e.g. -o id,state,mem,command.")
@click.option("--watch", "watch", type=DURATION, is_flag=False, flag_value=2.0, default=None,
              metavar="[INTERVAL]", help="Refresh every INTERVAL (default 2s); with "
                                         "--json, one JSON document a line.")
@click.option("--limit", "limit", type=click.IntRange(min=0), default=None,
              help=f"The latest N jobs (0: every one). Default: {PS_LATEST} in a table "
                   "with --all or --state, every job otherwise (and in JSON and CSV).")
def ps(all_jobs: bool, states: tuple[str, ...], user: str | None, group: str | None,
       array: int | None, sort: str, fmt: str, as_json: bool, columns: tuple[str, ...] | None,
       watch: float | None, limit: int | None) -> None:
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
    query = {"all": "1" if all_jobs else None, "user": user, "group": group,
             "state": ",".join(states) or None, "array": array}
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
            lines = _ps_columns_lines(jobs, columns) if columns and jobs else \
                _ps_lines(jobs, history, _terminal_columns())
            lines += _drained_lines(client)
            if watch is not None:
                clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
                lines = [clear + watch_header("ps", watch), "", *lines]
            click.echo("\n".join(lines))
            if older:
                click.echo(f"(the latest {latest} jobs: --limit N for more, --limit 0 "
                           "for every job)", err=True)
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


@click.command()
@click.argument("job", type=JOB)
@click.option("--json", "as_json", is_flag=True)
def show(job: str, as_json: bool) -> None:
    """One job (an id, or an array's task such as 12_7): its request, placement,
    declared vs peak memory, and its events."""
    from gpuwarden.render.jobtext import job_lines

    client = connect()
    j = client.job(one_job(client, job))
    if as_json:
        emit_json(j)
        return
    events = False
    for label, text in job_lines(j):
        if label == "job":
            click.echo(f"job {text}")
        elif label == "events":
            events = True
            click.echo("  events:")
        elif events:
            click.echo(f"    {text}")
        else:
            click.echo(f"  {label:<9} {text}")


@click.command()
@click.argument("job", type=JOB)
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing until the job ends (a rerun's output follows under a "
                   "'==> job J attempt N of M <==' line).")
@click.option("--stderr", "use_stderr", is_flag=True, help="The job's stderr instead.")
@click.option("--attempt", type=click.IntRange(min=1), metavar="N",
              help="The output of its Nth run (retries and requeues each run anew; "
                   "default: the latest).")
@click.option("--all", "all_attempts", is_flag=True,
              help="Every run's output in turn, each under such a line.")
def logs(job: str, follow: bool, use_stderr: bool, attempt: int | None,
         all_attempts: bool) -> None:
    """A job's stdout (or --stderr). Only its owner or an admin may read it."""
    if attempt is not None and all_attempts:
        raise UsageError("--attempt and --all: choose one")
    client = connect()
    job_id = one_job(client, job)
    out = sys.stdout.buffer
    stream = "stderr" if use_stderr else "stdout"
    # Pinned to one attempt once known, so a retry during -f never mixes two outputs.
    current, offset, header = (1 if all_attempts else attempt), 0, all_attempts
    while True:
        data, headers = client.request("GET", f"/v1/jobs/{job_id}/logs", raw=True, query={
            "stream": stream, "offset": offset, "attempt": current})
        served = int(headers.get("X-Attempt", current or 1))
        total = int(headers.get("X-Attempts", served))
        current = served
        if header:
            out.write(f"==> job {job_id} attempt {served} of {total} <==\n".encode())
            header = False
        out.write(data)
        out.flush()
        offset = int(headers.get("X-Next-Offset", offset + len(data)))
        if data:
            continue  # more may be there already
        if headers.get("X-Attempt-Ended") != "true":
            if not follow:
                return
            time.sleep(0.25)
            continue
        if served < total and (all_attempts or (follow and attempt is None)):
            current, offset, header = served + 1, 0, True  # on to the next run
            continue
        return


def about(job_id: int, message: str) -> str:
    """``message`` about job ``job_id``, naming it once: the daemon's messages often
    start with "job N" already."""
    return message if message.startswith(f"job {job_id} ") else f"job {job_id}: {message}"


def ended_line(job: dict[str, Any]) -> str:
    """How a job ended, in one line: "job 3 failed: exit code 2", "job 4 cancelled by
    alice" (its reason, when that already says the state, is not repeated)."""
    from gpuwarden.printable import visible

    head = f"job {job['id']} {job['state']}"
    reason = None if job.get("reason") is None else visible(job["reason"])
    if not reason or reason == job["state"]:
        return head
    if reason.startswith(job["state"]):
        return f"job {job['id']} {reason}"
    return f"{head}: {reason}"


def _done(verb: str, job: dict[str, Any], killed: bool = False) -> str:
    """What ``verb`` did, said once: "job 5 cancelled", "job 6: stopping (...)"."""
    jid, state = job["id"], job["state"]
    if verb == "cancel" and state not in TERMINAL and killed:
        return f"job {jid}: stopping (SIGKILL)"
    if verb == "cancel" and state not in TERMINAL:
        return f"job {jid}: stopping (SIGTERM, then SIGKILL after its grace period)"
    if verb == "unreserve":
        return f"job {jid}: its memory reservation is cleared"
    if verb in ("release", "retry"):
        return f"job {jid} {'released' if verb == 'release' else 'queued again'}"
    return f"job {jid} {state}"


def _each(verb: str, specs: Sequence[str], as_json: bool,
          query: dict[str, Any] | None = None) -> None:
    from gpuwarden.client.api import DaemonUnavailable
    from gpuwarden.errors import GpuwardenError

    client = connect()
    ids, failed = resolve_ids(client, specs)
    results: list[Any] = []
    for job_id in ids:
        try:
            results.append(client.request("POST", f"/v1/jobs/{job_id}/{verb}", query=query))
            if not as_json:
                click.echo(_done(verb, results[-1], killed=query is not None))
        except DaemonUnavailable:
            raise
        except GpuwardenError as e:  # this job: not found, not allowed, not in that state
            failed = True
            click.echo(f"gpuwarden: error: {about(job_id, str(e))}", err=True)
    if as_json:
        emit_json({"jobs": results})
    if failed:
        raise SystemExit(2)


@click.command()
@click.argument("ids", nargs=-1)
@click.option("--group", help="Every waiting or running job of this group (yours).")
@click.option("--kill", is_flag=True,
              help="SIGKILL a running job's tree at once, with no grace period (also "
                   "one already stopping).")
@click.option("--json", "as_json", is_flag=True)
def cancel(ids: tuple[str, ...], group: str | None, kill: bool, as_json: bool) -> None:
    """Cancel jobs (ids, ranges like 3-7, or --group): a running job's whole process tree
    gets SIGTERM, then SIGKILL after the grace period (--kill: SIGKILL at once)."""
    from gpuwarden.jobs.arrays import parse_refs

    if not parse_refs(ids) and not group:
        raise UsageError("name job ids, ranges, array tasks (12_7) or --group")
    body: dict[str, Any] = {"refs": list(ids), "kill": kill}
    if group:
        body["group"] = group
    out = connect().request("POST", "/v1/cancel", body=body)  # one request, for any number
    if not out["jobs"] and not out["errors"] and not out["missing"]:
        raise UsageError(f"no waiting or running job of yours in group {group!r}")
    if as_json:
        emit_json(out)
    else:
        for job in out["jobs"]:
            click.echo(_done("cancel", job, killed=kill))
    for e in out["errors"]:
        click.echo(f"gpuwarden: error: {about(e['id'], e['error'])}", err=True)
    if out["missing"]:
        ints = [m for m in out["missing"] if isinstance(m, int)]
        named = ([_ranges(ints)] if ints else []) + \
            [m for m in out["missing"] if not isinstance(m, int)]
        click.echo(f"gpuwarden: error: no job {','.join(named)}", err=True)
    if out["errors"] or out["missing"]:
        raise SystemExit(2)


def _ranges(ids: Sequence[int]) -> str:
    """3,5-9,12: sorted ids with their runs folded, as ``cancel`` takes them."""
    parts: list[str] = []
    run: list[int] = []
    for i in [*sorted(ids), None]:
        if run and i is not None and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [] if i is None else [i]
    return ",".join(parts)


def _simple(verb: str, doc: str) -> click.Command:
    @click.command(verb, help=doc)
    @click.argument("ids", nargs=-1, required=True)
    @click.option("--json", "as_json", is_flag=True)
    def cmd(ids: tuple[str, ...], as_json: bool) -> None:
        _each(verb, ids, as_json)
    return cmd


hold = _simple("hold", "Keep queued jobs from starting.")
release = _simple("release", "Let held jobs start.")
retry = _simple("retry", "Queue failed, cancelled or infeasible jobs again.")
unreserve = _simple("unreserve", "Admins: clear the GPU memory ended jobs still hold because "
                                 "it was not verified back (a leak).")


@click.command()
@click.argument("ids", nargs=-1, required=True)
@click.option("--timeout", type=DURATION, help="Give up after this long (exit 124).")
@click.option("--json", "as_json", is_flag=True)
def wait(ids: tuple[str, ...], timeout: float | None, as_json: bool) -> None:
    """Wait for jobs to end; exit with the job's exit code (the first failure's, for
    several)."""
    client = connect()
    deadline = None if timeout is None else time.monotonic() + timeout
    done: list[dict[str, Any]] = []
    targets, missing = resolve_ids(client, ids)
    if missing:
        raise SystemExit(2)
    for job_id in targets:
        while True:  # asks at least once: a job that has ended is not a timeout
            left = 30.0 if deadline is None else max(min(30.0, deadline - time.monotonic()), 0)
            job = client.request("GET", f"/v1/jobs/{job_id}/wait", query={"timeout": left},
                                 timeout=left + 30)
            if job["state"] in TERMINAL:
                done.append(job)
                break
            if deadline is not None and time.monotonic() >= deadline:
                if as_json:
                    emit_json({"jobs": done, "timed_out": True})
                raise SystemExit(124)
    if as_json:
        emit_json({"jobs": done})
    else:
        for job in done:
            said = job.get("oom_end") or job.get("declared_vs_peak")
            if said:
                click.echo(f"job {job['id']} {job['state']}: {said}", err=True)
    for job in done:
        if job["state"] != "succeeded":
            code = job["exit_code"] if job["exit_code"] not in (None, 0) else 1
            if not as_json:
                click.echo(ended_line(job), err=True)
            raise SystemExit(code)


@click.command()
@click.argument("ids", nargs=-1, required=True)
def rm(ids: tuple[str, ...]) -> None:
    """Remove ended jobs and their logs. A job that is waiting or running is refused:
    cancel it first."""
    client = connect()
    targets, missing = resolve_ids(client, ids)
    for job_id in targets:
        client.request("DELETE", f"/v1/jobs/{job_id}")
        click.echo(f"job {job_id} removed")
    if missing:
        raise SystemExit(2)


@click.command()
@click.option("--older-than", type=DURATION, required=True,
              help="Remove your ended jobs older than this (e.g. 7d).")
@click.option("--json", "as_json", is_flag=True)
def clean(older_than: float, as_json: bool) -> None:
    """Remove ended jobs (yours; all for an admin) older than a duration."""
    out = connect().request("POST", "/v1/clean", body={"older_than": older_than})
    if as_json:
        emit_json(out)
    else:
        click.echo(f"removed {out['removed']} job(s)")
