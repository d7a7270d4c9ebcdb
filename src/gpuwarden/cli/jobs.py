"""The verbs on jobs already queued: show, logs, cancel, wait, hold, release, retry,
unreserve, rm, clean. Each is a thin call to the daemon's API; ``--json`` prints what
it returns."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from gpuwarden.cli.common import DURATION
from gpuwarden.cli.daemon import connect
from gpuwarden.cli.jobrefs import JOB, one_job, resolve_ids
from gpuwarden.cli.plain import emit_json
from gpuwarden.errors import UsageError

TERMINAL = ("succeeded", "failed", "cancelled", "infeasible")


@click.command()
@click.argument("job", type=JOB)
@click.option("--json", "as_json", is_flag=True)
def show(job: str, as_json: bool) -> None:
    """One job (an id, or an array's task such as 12_7): its request, placement,
    declared vs peak memory, and its events."""
    from gpuwarden.jobs.request import OPTION_DEFAULTS
    from gpuwarden.render.jobtext import job_lines

    client = connect()
    j = client.job(one_job(client, job))
    if as_json:
        emit_json(j)
        return
    events = False
    for label, text in job_lines(j, OPTION_DEFAULTS):
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
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing until the job ends (a rerun's output follows under a "
    "'==> job J attempt N of M <==' line).",
)
@click.option("--stderr", "use_stderr", is_flag=True, help="The job's stderr instead.")
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    metavar="N",
    help="The output of its Nth run (retries and requeues each run anew; default: the latest).",
)
@click.option(
    "--all",
    "all_attempts",
    is_flag=True,
    help="Every run's output in turn, each under such a line.",
)
def logs(job: str, follow: bool, use_stderr: bool, attempt: int | None, all_attempts: bool) -> None:
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
        data, headers = client.request(
            "GET",
            f"/v1/jobs/{job_id}/logs",
            raw=True,
            query={"stream": stream, "offset": offset, "attempt": current},
        )
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


def _each(
    verb: str, specs: Sequence[str], as_json: bool, query: dict[str, Any] | None = None
) -> None:
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
@click.option(
    "--kill",
    is_flag=True,
    help="SIGKILL a running job's tree at once, with no grace period (also one already stopping).",
)
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
        named = ([_ranges(ints)] if ints else []) + [
            m for m in out["missing"] if not isinstance(m, int)
        ]
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
unreserve = _simple(
    "unreserve",
    "Admins: clear the GPU memory ended jobs still hold because it was not verified back (a leak).",
)


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
            job = client.request(
                "GET", f"/v1/jobs/{job_id}/wait", query={"timeout": left}, timeout=left + 30
            )
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
@click.option(
    "--older-than",
    type=DURATION,
    required=True,
    help="Remove your ended jobs older than this (e.g. 7d).",
)
@click.option("--json", "as_json", is_flag=True)
def clean(older_than: float, as_json: bool) -> None:
    """Remove ended jobs (yours; all for an admin) older than a duration."""
    out = connect().request("POST", "/v1/clean", body={"older_than": older_than})
    if as_json:
        emit_json(out)
    else:
        click.echo(f"removed {out['removed']} job(s)")
