"""``gpuwarden cluster``: gpuwarden's view of a Ray cluster."""

from __future__ import annotations

import click

from gpuwarden.cli.plain import emit_json


@click.group()
def cluster() -> None:
    """A Ray cluster's GPU memory budgets (needs gpuwarden[ray])."""


@cluster.command()
@click.option(
    "--cluster",
    "address",
    default="ray",
    show_default=True,
    help="ray (RAY_ADDRESS or the local dashboard), ray://HOST:PORT or http://...",
)
@click.option(
    "--snapshots",
    is_flag=True,
    help="Also each node's own `gpuwarden status` (run there as a Ray job).",
)
@click.option("--json", "as_json", is_flag=True)
def status(address: str, snapshots: bool, as_json: bool) -> None:
    """Per node: GPUs, GPU memory, the budgets of running gpuwarden jobs, what is free;
    with --snapshots, what each node's driver shows (used memory, processes, leaks)."""
    from gpuwarden.ray.submit import cluster_status, dashboard_address, node_snapshots
    from gpuwarden.units import format_bytes

    url = dashboard_address(address)
    nodes = cluster_status(url)
    snaps = node_snapshots(url, [n.ip for n in nodes]) if snapshots else {}
    if as_json:
        emit_json(
            {
                "cluster": url,
                "nodes": [
                    {
                        "node_id": n.node_id,
                        "ip": n.ip,
                        "gpus": n.gpus,
                        "gpu_memory": n.gpu_memory,
                        "memory": n.memory,
                        "in_use": n.in_use,
                        "free": n.free,
                        "jobs": n.jobs,
                        **({"snapshot": snaps.get(n.ip)} if snapshots else {}),
                    }
                    for n in nodes
                ],
            }
        )
        return
    click.echo(f"Ray cluster at {url}: {len(nodes)} node(s)")
    for n in nodes:
        gpu = format_bytes(n.gpu_memory) if n.gpu_memory else "not advertised"
        click.echo(
            f"  {n.ip:15} {n.node_id[:12]}  {n.gpus:g} GPU ({gpu} each)  budgets "
            f"{format_bytes(n.in_use)} of {format_bytes(n.memory)}, free "
            f"{format_bytes(n.free)}  jobs: {', '.join(n.jobs) or '-'}"
        )
        snap = snaps.get(n.ip)
        if snap is None:
            continue
        if "error" in snap:
            click.echo(f"    its gpuwarden status: {snap['error']}")
            continue
        for g in snap.get("gpus", []):
            click.echo(
                f"    GPU {g['index']} {g['name']}: {format_bytes(g['memory_used'])} of "
                f"{format_bytes(g['memory_total'])} used, {len(g['processes'])} "
                "process(es)"
            )
        if snap.get("leaks"):
            click.echo(f"    {len(snap['leaks'])} leak finding(s): gpuwarden leaks on {n.ip}")


@cluster.command()
def resources() -> None:
    """Print this node's --resources for `ray start` (its GPUs' memory, from NVML)."""
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.ray.shares import resources_flag

    backend = open_backend()
    try:
        click.echo(resources_flag([g.memory_total for g in backend.gpus()]))
    finally:
        backend.close()
