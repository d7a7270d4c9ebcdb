"""``gpuwarden report``: accounting of the ended jobs per user, group or key (the
daemon's GET /v1/report)."""

from __future__ import annotations

from typing import Any

import click

from gpuwarden.cli.common import DURATION, emit_csv, format_option
from gpuwarden.cli.plain import emit_json


def _wait(seconds: float | None) -> str:
    from gpuwarden.units import format_duration

    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 60 else format_duration(seconds)


@click.command()
@click.option(
    "--since",
    type=DURATION,
    default=None,
    metavar="DURATION",
    help="Jobs that ended in this last period (7d, 12h); default: every ended "
    "job the daemon keeps.",
)
@click.option(
    "--by",
    "by",
    type=click.Choice(["user", "group", "key"]),
    default="user",
    show_default=True,
    help="One row per user, per job group or per job key.",
)
@format_option()
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
def report(since: float | None, by: str, fmt: str, as_json: bool) -> None:
    """Accounting of ended jobs: jobs, GPU-hours, memory reserved vs used (GiB-h: budget
    x run time vs peak x run time), OOMs, preemptions, queue wait p50/p95."""
    from gpuwarden.cli.daemon import connect
    from gpuwarden.daemon.accounting import COLUMNS

    query: dict[str, Any] = {"by": by}
    if since is not None:
        query["since"] = f"{since}s"
    out = connect().request("GET", "/v1/report", query=query)
    if as_json or fmt == "json":
        emit_json(out)
        return
    rows = out["rows"]
    if fmt == "csv":
        emit_csv((by, *COLUMNS), ([r[by], *(r[c] for c in COLUMNS)] for r in rows))
        return
    from gpuwarden.printable import visible

    head = (
        by.upper(),
        "JOBS",
        "OK",
        "FAIL",
        "GPU-H",
        "RESERVED GiB-h",
        "USED GiB-h",
        "USED%",
        "OOMS",
        "PREEMPT",
        "WAIT P50",
        "WAIT P95",
    )
    lines = [head]
    for r in rows:
        used = (
            f"{100 * r['used_gib_hours'] / r['reserved_gib_hours']:.0f}%"
            if r["reserved_gib_hours"]
            else "-"
        )
        lines.append(
            (
                visible(str(r[by])),
                str(r["jobs"]),
                str(r["succeeded"]),
                str(r["failed"]),
                f"{r['gpu_hours']:.2f}",
                f"{r['reserved_gib_hours']:.2f}",
                f"{r['used_gib_hours']:.2f}",
                used,
                str(r["ooms"]),
                str(r["preemptions"]),
                _wait(r["wait_p50"]),
                _wait(r["wait_p95"]),
            )
        )
    if not rows:
        click.echo("no job ended in that period")
        return
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
