"""``gpuwarden doctor``: findings with evidence and the command that fixes each one."""

from __future__ import annotations

import sys
import time

import click

from gpuwarden.cli.common import DURATION, warn
from gpuwarden.cli.plain import backend, check_gpu_indices, emit_json

EXIT_CRITICAL = 1


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option(
    "--gpu",
    "gpus",
    type=int,
    multiple=True,
    help="Only findings on this GPU, plus machine-wide ones (repeatable).",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Snapshots to take; a leak must show in all of them (no one-off blips).",
)
@click.option(
    "--interval",
    type=DURATION,
    default=0.5,
    show_default=True,
    help="Time between samples (e.g. 500ms, 2s).",
)
def doctor(as_json: bool, gpus: tuple[int, ...], samples: int, interval: float) -> None:
    """Diagnose the machine: each finding has a severity, the evidence and the exact
    command that fixes it.

    \b
    Exit status:
      0  no critical finding (warnings and info may be present)
      1  at least one critical finding, so cron or a monitor can alert on it

    Errors (an unknown --gpu, no backend) print one line on stderr and exit
    non-zero as well: 2 for bad usage, 3 when no GPU backend can be opened.
    """
    from gpuwarden.cli.statusonce import snapshot_now
    from gpuwarden.observe.doctor import diagnose, mps_state, report
    from gpuwarden.observe.leaks import find_leaks

    with backend() as b:
        snaps = [snapshot_now(b)]  # which processes are jobs' (shared_default_mode)
        check_gpu_indices(gpus, [g.index for g in snaps[0].gpus])
        for _ in range(samples - 1):
            time.sleep(interval)
            snaps.append(snapshot_now(b))
    snap = snaps[-1]
    findings = [
        f
        for f in diagnose(snap, find_leaks(snaps), mps_state(warn))
        if not gpus or f.gpu is None or f.gpu in gpus
    ]
    if as_json:
        for w in snap.warnings:
            warn(w)
        emit_json(report(findings))
    else:
        from rich.console import Console
        from rich.text import Text

        from gpuwarden.render.doctor import render

        console = Console()
        console.print(render(report(findings)))
        for w in snap.warnings:
            console.print(Text(f"warning: {w}", style="yellow"))
    if any(f.severity == "critical" for f in findings):
        sys.stdout.flush()
        # SystemExit, not ctx.exit(): in click's non-standalone mode an Exit is turned into
        # a return value, which `python -m gpuwarden` would drop.
        sys.exit(EXIT_CRITICAL)
