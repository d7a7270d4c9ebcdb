"""Jobs as the command line names them: the JOB argument (an id, or an array's task such
as ``12_7``) and the ids that references name, asked of the daemon. Shared by the verbs
that take jobs, ``submit``'s ``--after`` options and ``edit``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.errors import UsageError

if TYPE_CHECKING:
    from gpuwarden.client.api import Client


def resolve_ids(client: Client, specs: Sequence[str]) -> tuple[list[int], bool]:
    """The job ids that ``specs`` name (an array's id: each of its tasks; ``12_7``: one
    task), asked of the daemon, and whether any named nothing (each said on stderr)."""
    from gpuwarden.jobs.arrays import parse_refs

    parse_refs(specs)  # a bad one is an error before the daemon is asked
    out = client.request("POST", "/v1/resolve", body={"refs": list(specs)})
    for ref in out["missing"]:
        click.echo(f"gpuwarden: error: no job {ref}", err=True)
    return out["ids"], bool(out["missing"])


class JobRef(click.ParamType):  # type: ignore[type-arg]
    """One job: its id, or an array's task as ``12_7``."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from gpuwarden.jobs.arrays import parse_refs

        text = str(value)
        try:
            refs = parse_refs([text])
        except UsageError as e:
            self.fail(str(e), param, ctx)
        if len(refs) != 1 or "," in text:
            self.fail(f"{text!r} is not one job (an id, or a task such as 12_7)", param, ctx)
        return text


JOB = JobRef()


def one_job(client: Client, ref: str) -> int:
    """The job id of a JOB argument: ``12_7`` asked of the daemon; an id as it is (an
    array's id names its first task here)."""
    if "_" not in ref:
        return int(ref)
    ids, missing = resolve_ids(client, [ref])
    if missing or not ids:
        raise SystemExit(2)
    return ids[0]
