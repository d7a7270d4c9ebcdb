"""``gpuwarden doctor``: findings with evidence and the command that fixes each one."""

from __future__ import annotations

import importlib
import sys
import time
from typing import TYPE_CHECKING

import click

from gpuwarden.cli.common import DURATION, backend, check_gpu_indices, emit_json, warn

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gpuwarden.gpus.mps import MpsState
    from gpuwarden.observe.doctor import Finding

EXIT_CRITICAL = 1

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_MARK = {"critical": "✗", "warning": "!", "info": "i"}


def _mps_state() -> MpsState | None:
    """MPS daemons, when this build can read them; None (rules skipped) otherwise."""
    from gpuwarden.gpus.mps import MpsState

    try:
        reader = getattr(importlib.import_module("gpuwarden.gpus.mps"), "read_mps_state", None)
    except ImportError:
        return None
    if reader is None:
        return None
    try:
        state = reader()
    except (OSError, TypeError, ValueError) as e:
        warn(f"could not read the MPS daemons: {e}")
        return None
    return state if isinstance(state, MpsState) else None


def render(findings: list[Finding]) -> RenderableType:
    """Grouped by severity; evidence and fix wrap under their label on 80 columns."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from gpuwarden.observe.doctor import SEVERITIES, summarize

    if not findings:
        return Text("No problems found", style="green")
    parts: list[RenderableType] = []
    for sev in SEVERITIES:
        group = [f for f in findings if f.severity == sev]
        if not group:
            continue
        if parts:
            parts.append(Text(""))
        parts.append(Text(f"{sev.capitalize()} ({len(group)})", style=_STYLE[sev]))
        for f in group:
            where = "machine" if f.gpu is None else f"GPU {f.gpu}"
            head = Text(f"{_MARK[sev]} ", style=_STYLE[sev])
            head.append(f"{where} · {f.rule}", style="bold")
            if f.pid is not None:
                head.append(f" · pid {f.pid}")
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True, width=4)
            grid.add_column(ratio=1, overflow="fold")
            grid.add_row("", Text(f.evidence))
            grid.add_row(Text("fix:", style="dim"), Text(f.remedy, style="green"))
            parts += [head, grid]
    counts = summarize(findings)
    parts += [Text(""), Text(", ".join(f"{n} {s}" for s, n in counts.items()), style="bold")]
    return Group(*parts)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option("--gpu", "gpus", type=int, multiple=True,
              help="Only findings on this GPU, plus machine-wide ones (repeatable).")
@click.option("--samples", type=click.IntRange(min=1), default=3, show_default=True,
              help="Snapshots to take; a leak must show in all of them (no one-off blips).")
@click.option("--interval", type=DURATION, default=0.5, show_default=True,
              help="Time between samples (e.g. 500ms, 2s).")
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
    from gpuwarden.observe.doctor import diagnose, summarize
    from gpuwarden.observe.leaks import find_leaks
    from gpuwarden.observe.snapshot import take_snapshot

    with backend() as b:
        snaps = [take_snapshot(b)]
        check_gpu_indices(gpus, [g.index for g in snaps[0].gpus])
        for _ in range(samples - 1):
            time.sleep(interval)
            snaps.append(take_snapshot(b))
    snap = snaps[-1]
    findings = [f for f in diagnose(snap, find_leaks(snaps), _mps_state())
                if not gpus or f.gpu is None or f.gpu in gpus]
    if as_json:
        for w in snap.warnings:
            warn(w)
        emit_json({"findings": [f.to_json() for f in findings],
                   "summary": summarize(findings)})
    else:
        from rich.console import Console
        from rich.text import Text

        console = Console()
        console.print(render(findings))
        for w in snap.warnings:
            console.print(Text(f"warning: {w}", style="yellow"))
    if any(f.severity == "critical" for f in findings):
        sys.stdout.flush()
        # SystemExit, not ctx.exit(): in click's non-standalone mode an Exit is turned into
        # a return value, which `python -m gpuwarden` would drop.
        sys.exit(EXIT_CRITICAL)
