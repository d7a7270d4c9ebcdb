"""``gpuwarden gpu``: the compute mode (a thin wrapper over NVML, a dry run unless
``--yes``) and drains (asked of the daemon). ``gpuwarden mps``: ``cli/mps.py``.

Changing settings needs root on a real machine; the root check runs before NVML is
opened so a non-root user gets the refusal, not an NVML error. The simulated backend
needs no root: it stores the change in its state directory so the commands can be
exercised without a GPU."""

from __future__ import annotations

import contextlib
import os
import pwd

import click

from gpuwarden.cli.common import warn
from gpuwarden.cli.plain import (
    backend,
    check_gpu_indices,
    emit_json,
    require_root,
    simulated_backend,
)

# What people type -> NVML's name -> nvidia-smi's name.
MODES = {"default": "Default", "exclusive": "Exclusive_Process", "prohibited": "Prohibited"}
_SMI_MODES = {
    "Default": "DEFAULT",
    "Exclusive_Process": "EXCLUSIVE_PROCESS",
    "Prohibited": "PROHIBITED",
}
_EFFECT = {
    "Exclusive_Process": "only one process at a time will get a CUDA context there",
    "Prohibited": "no new process will get a CUDA context there",
}


def _me() -> set[str]:
    """The invoking user, also behind sudo: their own processes are not 'other users'."""
    names = {os.environ.get("SUDO_USER", "")}
    with contextlib.suppress(KeyError):
        names.add(pwd.getpwuid(os.geteuid()).pw_name)
    names.discard("")
    return names


# -- gpu mode -------------------------------------------------------------------


@click.group()
def gpu() -> None:
    """GPU settings (root): compute mode; drain and undrain (admins, the daemon)."""


@gpu.command("mode")
@click.argument("index", type=int)
@click.argument("mode", type=click.Choice(list(MODES), case_sensitive=False), metavar="MODE")
@click.option("--yes", is_flag=True, help="Apply the change (root); without it, a dry run.")
def mode(index: int, mode: str, yes: bool) -> None:
    """Set a GPU's compute mode (a dry run unless --yes).

    MODE is default (processes share the GPU), exclusive (one process at a time) or
    prohibited (no new process)."""
    from gpuwarden.observe.snapshot import take_snapshot

    target = MODES[mode.lower()]
    if yes:
        require_root("changing the compute mode")
    with backend() as b:
        snap = take_snapshot(b, holders=False, detail=False)
        check_gpu_indices([index], [g.index for g in snap.gpus])
        view = snap.gpu(index)
        assert view is not None
        current = view.facts.compute_mode
        smi = f"nvidia-smi -i {index} -c {_SMI_MODES[target]}"
        if current == target:
            click.echo(f"GPU {index}: compute mode is already {target}; nothing to change")
            return
        others = sorted(view.users - _me())
        if target in _EFFECT and others:
            warn(
                f"GPU {index} has processes of other users ({', '.join(others)}); they keep "
                f"running, but under {target} {_EFFECT[target]}"
            )
        change = f"GPU {index}: compute mode {current or 'unknown'} -> {target}"
        if not yes:
            click.echo(f"{change} (dry run; add --yes to apply)")
            click.echo(f"equivalent: {smi}")
            return
        b.set_compute_mode(index, target)
        after = next((g.compute_mode for g in b.gpus() if g.index == index), None)
        click.echo(f"GPU {index}: compute mode {current or 'unknown'} -> {after or 'unknown'}")
        if simulated_backend(b) is not None:
            click.echo(f"(simulated backend; on a real machine: {smi})")
        elif after != target:
            warn(f"GPU {index} reads back compute mode {after or 'unknown'}, not {target}")
        if view.facts.persistence_mode is False:
            warn(
                f"persistence mode is off on GPU {index}: the driver may reset the compute "
                "mode when the GPU is next idle (nvidia-smi -pm 1 keeps it)"
            )


# -- gpu drain ------------------------------------------------------------------


@gpu.command("drain")
@click.argument("index", type=click.IntRange(min=0))
@click.option("--reason", help="Why (shown in status, ps and the wait reason of jobs).")
def drain(index: int, reason: str | None) -> None:
    """Admins: no new job is placed on GPU INDEX; its running jobs finish (the daemon)."""
    from gpuwarden.cli.daemon import connect

    connect().request(
        "POST", f"/v1/gpus/{index}/drain", body={} if reason is None else {"reason": reason}
    )
    click.echo(f"GPU {index} drained: no new job is placed there; running jobs finish")


@gpu.command("undrain")
@click.argument("index", type=click.IntRange(min=0))
def undrain(index: int) -> None:
    """Admins: let the daemon place jobs on GPU INDEX again."""
    from gpuwarden.cli.daemon import connect

    connect().request("POST", f"/v1/gpus/{index}/undrain")
    click.echo(f"GPU {index} undrained: jobs may be placed there again")


@gpu.command("drains")
@click.option("--json", "as_json", is_flag=True)
def drains(as_json: bool) -> None:
    """The GPUs drained in the daemon (anyone may look)."""
    from gpuwarden.cli.daemon import connect

    out = connect().request("GET", "/v1/drains")
    if as_json:
        emit_json(out)
        return
    from gpuwarden.render.statusview import drain_lines

    for line in drain_lines(out["drains"]) or ["no GPU is drained"]:
        click.echo(line)
