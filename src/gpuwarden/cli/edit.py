"""``gpuwarden edit``: change a queued or held job's request (POST /v1/jobs/ID/edit)."""

from __future__ import annotations

from typing import Any

import click

from gpuwarden.cli.common import DURATION
from gpuwarden.cli.jobrefs import JOB
from gpuwarden.cli.plain import emit_json
from gpuwarden.jobs.request import FIELDS

# Bounds are left to the daemon, which says them as submit does; the text and the
# choices are the table's (jobs/request.py).
_PRIORITY = FIELDS["priority"]


@click.command()
@click.argument("job", type=JOB)
@click.option("--mem", help="Memory per GPU (14G, or a fraction such as 0.5 of a GPU).")
@click.option("--mem-limit", help="How far a burstable job may grow past --mem.")
@click.option(
    "--priority", type=int, help=f"Higher starts first ({_PRIORITY.lo} to {_PRIORITY.hi})."
)
@click.option("--qos", type=click.Choice(FIELDS["qos"].choices))
@click.option("--gpus", type=int, help="How many GPUs.")
@click.option("--timeout", type=DURATION, help="Kill the job after this long (2h, 30m).")
@click.option("--name", help="Its name.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
def edit(job: str, as_json: bool, **opts: Any) -> None:
    """Change a queued or held job (yours, or any as an admin): the same checks as submit
    (bounds, [limits], whether it could ever run here); it keeps its place in the queue."""
    from gpuwarden.cli.daemon import connect
    from gpuwarden.cli.jobrefs import one_job
    from gpuwarden.errors import UsageError

    body = {k: v for k, v in opts.items() if v is not None}
    if not body:
        raise UsageError(
            "name what to change: --mem, --mem-limit, --priority, --qos, "
            "--gpus, --timeout or --name"
        )
    client = connect()
    job_id = one_job(client, job)
    edited = client.request("POST", f"/v1/jobs/{job_id}/edit", body=body)
    if as_json:
        emit_json(edited)
        return
    edits = [e for e in edited["events"] if e["kind"] == "edited"]
    click.echo(
        f"job {job_id} edited {edits[-1]['detail']}" if edits else f"job {job_id}: nothing changed"
    )
