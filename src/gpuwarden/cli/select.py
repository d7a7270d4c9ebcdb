"""``gpuwarden select`` and ``gpuwarden exec``: the best GPUs for a memory request,
printed as CUDA_VISIBLE_DEVICES, or given to a command with a memory cap, CPU affinity
and NUMA binding. Both share one policy (observe/select.py); ``exec`` also leases what
it picked (leases.py) so that two started together do not pick the same GPU."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.common import DURATION, warn
from gpuwarden.cli.plain import backend, emit_json
from gpuwarden.errors import NothingFits, UsageError
from gpuwarden.leases import DEFAULT_TIMEOUT
from gpuwarden.units import parse_size_or_fraction

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.leases import LeaseStore
    from gpuwarden.observe.snapshot import Snapshot
    from gpuwarden.sched.select import Candidate, Choice, Rejection, Request

_MEM_HELP = (
    "Memory needed on each GPU: a size (20G, 512MiB) or a fraction of the GPU's total (0.5)."
)


def parse_mem(text: str) -> tuple[int | None, float | None]:
    """``--mem``: (bytes, None) for a size, (None, fraction) for a fraction like 0.5."""
    try:
        return parse_size_or_fraction(text)
    except UsageError as e:
        raise UsageError(f"--mem: {e}") from None


def make_request(
    mem: str, count: int, max_util: int | None, same_numa: bool, mig: str | None = None
) -> Request:
    from gpuwarden.gpus.model import MIG_PROFILE
    from gpuwarden.sched.select import Request

    memory, fraction = parse_mem(mem)
    if mig is not None and not MIG_PROFILE.match(mig):
        raise UsageError(f"--mig: {mig!r} is not a MIG profile such as 1g.10gb or 3g.40gb")
    return Request(
        memory=memory,
        fraction=fraction,
        count=count,
        max_util=max_util,
        same_numa=same_numa,
        user=_me(),
        mig=mig,
    )


def _me() -> str | None:
    """The caller's user name: their own processes on a GPU are no other user's."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


def _store(b: Backend) -> LeaseStore:
    from gpuwarden.leases import LeaseStore, lease_dir

    sim_state = None
    if b.name == "sim":
        from gpuwarden.gpus.sim import SimBackend

        if isinstance(b, SimBackend):
            sim_state = b.registry.root
    root, shared = lease_dir(sim_state)
    return LeaseStore(root, shared=shared)


def choose(
    b: Backend, request: Request, *, lease: tuple[int, float, float] | None = None
) -> tuple[Choice | Rejection, Snapshot]:
    """Snapshot, account outstanding leases, choose; with ``lease`` = (pid, start time,
    timeout) also lease the chosen GPUs to that process, all under the store's lock."""
    from gpuwarden.leases import LeaseError, new_lease
    from gpuwarden.observe.snapshot import take_snapshot
    from gpuwarden.sched.select import Choice, choose_gpus

    store = _store(b)
    if lease is None and not store.root.is_dir():
        snap = take_snapshot(b, holders=False, detail=False)
        return choose_gpus(snap.gpus, request), snap
    try:
        with store.locked():
            snap = take_snapshot(b, holders=False, detail=False)
            acc = store.prune(snap.gpus, now=snap.taken_at)
            result = choose_gpus(snap.gpus, request, acc.outstanding)
            if lease is not None and isinstance(result, Choice):
                pid, start_time, timeout = lease
                try:
                    for c in result.gpus:
                        store.add(
                            new_lease(
                                c.uuid,
                                c.need,
                                pid=pid,
                                start_time=start_time,
                                now=snap.taken_at,
                                timeout=timeout,
                            )
                        )
                except LeaseError as e:
                    warn(f"{e}; a concurrent exec may pick the same GPU")
            return result, snap
    except LeaseError as e:
        warn(f"{e}; choosing without leases")
        snap = take_snapshot(b, holders=False, detail=False)
        return choose_gpus(snap.gpus, request), snap


def _candidate_json(c: Candidate) -> dict[str, Any]:
    return {
        "index": c.index,
        "uuid": c.uuid,
        "numa_node": c.numa_node,
        "memory_total": c.total,
        "need": c.need,
        "free": c.free,
        "leased": c.leased,
        "utilization": c.utilization,
        "users": sorted(c.users),
        "qualifies": c.qualifies,
        "reason": c.reason,
        "mig": c.mig,
        "gi_id": c.gi_id,
    }


def _result_json(request: Request, result: Choice | Rejection, use_uuid: bool) -> dict[str, Any]:
    from gpuwarden.sched.select import Choice

    chosen = result.gpus if isinstance(result, Choice) else ()
    return {
        "cuda_visible_devices": (
            result.cuda_visible_devices(uuid=use_uuid) if isinstance(result, Choice) else None
        ),
        "gpus": [c.index for c in chosen],
        "uuids": [c.uuid for c in chosen],
        "request": {
            "memory": request.memory,
            "fraction": request.fraction,
            "count": request.count,
            "max_util": request.max_util,
            "same_numa": request.same_numa,
            "mig": request.mig,
        },
        "reason": None if isinstance(result, Choice) else result.reason,
        "considered": [_candidate_json(c) for c in result.considered],
    }


def _decided(result: Choice | Rejection) -> Choice:
    """The choice, or the rejection as a one-line error: exit 2 when the request can
    never fit here, 1 when nothing fits right now."""
    from gpuwarden.sched.select import Choice

    if isinstance(result, Choice):
        return result
    if result.impossible:
        raise UsageError(result.reason)
    raise NothingFits(result.reason)


def _request_options(f: Any) -> Any:
    f = click.option(
        "--same-numa", is_flag=True, help="All GPUs on one NUMA node (otherwise only preferred)."
    )(f)
    f = click.option(
        "--max-util",
        type=click.IntRange(0, 100),
        metavar="PERCENT",
        help="Skip GPUs busier than this (utilization %).",
    )(f)
    f = click.option(
        "--count", type=click.IntRange(min=1), default=1, show_default=True, help="How many GPUs."
    )(f)
    f = click.option("--mem", required=True, metavar="SIZE|FRACTION", help=_MEM_HELP)(f)
    f = click.option(
        "--mig",
        metavar="PROFILE",
        help="A MIG instance of this profile (e.g. 3g.40gb); on a GPU in MIG "
        "mode each instance is a place of its own.",
    )(f)
    return f


@click.command()
@_request_options
@click.option("--uuid", "use_uuid", is_flag=True, help="Print GPU UUIDs instead of indices.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
def select(
    mem: str,
    mig: str | None,
    count: int,
    max_util: int | None,
    same_numa: bool,
    use_uuid: bool,
    as_json: bool,
) -> None:
    """Print CUDA_VISIBLE_DEVICES for the best GPUs with --mem free on each.

    Exit 1 with the reason when nothing fits now; 2 when it never can here."""
    request = make_request(mem, count, max_util, same_numa, mig)
    with backend() as b:
        result, _ = choose(b, request)
    if as_json:
        emit_json(_result_json(request, result, use_uuid))
    choice = _decided(result)
    if not as_json:
        click.echo(choice.cuda_visible_devices(uuid=use_uuid))


@click.command("exec", context_settings={"allow_interspersed_args": False})
@_request_options
@click.option("--no-cap", is_flag=True, help="Do not cap PyTorch's memory at --mem.")
@click.option("--no-bind", is_flag=True, help="Do not bind CPUs and memory to the GPUs' NUMA node.")
@click.option(
    "--lease-timeout",
    type=DURATION,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="How long the picked memory stays reserved if the job never uses it.",
)
@click.option("-v", "--verbose", is_flag=True, help="Say on stderr what was chosen and bound.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(
    mem: str,
    mig: str | None,
    count: int,
    max_util: int | None,
    same_numa: bool,
    no_cap: bool,
    no_bind: bool,
    lease_timeout: float,
    verbose: bool,
    command: Sequence[str],
) -> None:
    """Run COMMAND on the best GPUs: CUDA_VISIBLE_DEVICES set, PyTorch capped at --mem,
    CPUs and memory bound to the GPUs' NUMA node. The command replaces gpuwarden (same
    pid, its exit code)."""
    import psutil

    from gpuwarden.gpus.visible import devices
    from gpuwarden.launch import (
        apply_affinity,
        exec_plan,
        plan_launch,
        probe_host,
        resolve_command,
    )

    if lease_timeout <= 0:
        raise UsageError("--lease-timeout must be positive")
    request = make_request(mem, count, max_util, same_numa, mig)
    env = dict(os.environ)
    resolve_command(command, env)  # before anything is leased
    me = psutil.Process()
    with backend() as b:
        result, snap = choose(b, request, lease=(me.pid, me.create_time(), lease_timeout))
    choice = _decided(result)
    by_uuid = {d.uuid: d for d in devices([g.facts for g in snap.gpus])}
    facts = [by_uuid[c.uuid] for c in choice.gpus]  # a MIG instance: its own device
    plan = plan_launch(
        command,
        facts,
        base_env=env,
        host=probe_host(env),
        mem_limit=None if no_cap else min(c.need for c in choice.gpus),
        bind=not no_bind,
    )
    problem = apply_affinity(plan.cpus)
    if problem:
        warn(problem)
    if verbose:
        click.echo(f"gpuwarden: {plan.describe()}", err=True)
        for note in plan.notes:
            click.echo(f"gpuwarden: {note}", err=True)
    exec_plan(plan)
