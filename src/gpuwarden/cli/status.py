"""``gpuwarden status``: every GPU and GPU process, one screen, like nvidia-smi should."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import click

from gpuwarden.cli.common import (
    DURATION,
    backend,
    check_gpu_indices,
    emit_json,
    watch_header,
)
from gpuwarden.errors import UsageError
from gpuwarden.printable import visible

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from gpuwarden.gpus.backend import Backend
    from gpuwarden.observe.leaks import Leak
    from gpuwarden.observe.snapshot import Snapshot


def _bar(used: int, total: int, width: int = 10) -> str:
    filled = round(width * used / total) if total else 0
    return "█" * filled + "░" * (width - filled)


_MODE_SHORT = {"Default": "Default", "Exclusive_Process": "Excl", "Exclusive_Thread": "ExclT",
               "Prohibited": "Prohib"}


_STATE_SHORT = {"running": "running", "dead": "dead", "other_namespace": "other-ns",
                "garbage": "garbage", "zombie": "zombie", "orphan": "orphan"}


def _flags(persistence: bool | None, mps: bool | None, mig: bool | None) -> str:
    """Compact settings column: P persistence on, M MPS serving, G MIG enabled."""
    return "".join(c for c, on in (("P", persistence), ("M", mps), ("G", mig)) if on) or "-"


_PROC_COLS = ("GPU", "PID", "User", "Container", "Mem", "SM", "Time", "State", "Command")
_PROC_MAX = (3, 10, 10, 16, 6, 4, 6, 8)  # widest each fixed column may grow
_RIGHT = {0, 1, 4, 5}


def _process_table(rows: list[tuple[str, ...]], width: int) -> Text:
    """The process list as aligned plain text: a rich Table costs ~0.5 ms a row, too slow
    for a box with thousands of GPU processes. States other than running are red."""
    from rich.text import Text

    widths = [min(max(len(c), *(len(r[i]) for r in rows)) if rows else len(c), _PROC_MAX[i])
              for i, c in enumerate(_PROC_COLS[:-1])]
    cmd_width = max(width - sum(widths) - len(widths) - 1, 10)

    def cell(i: int, value: str) -> str:
        if i == len(widths):
            return value if len(value) <= cmd_width else value[: cmd_width - 1] + "…"
        w = widths[i]
        v = value if len(value) <= w else value[: w - 1] + "…"
        return v.rjust(w) if i in _RIGHT else v.ljust(w)

    out = Text("Processes\n", style="italic")
    out.append(" " + " ".join(cell(i, c) for i, c in enumerate(_PROC_COLS)).rstrip() + "\n",
               style="bold")
    out.append(" " + "─" * (min(width, sum(widths) + len(widths) + cmd_width) - 1) + "\n")
    state_col = len(widths) - 1
    for r in rows:
        head = " " + " ".join(cell(i, r[i]) for i in range(state_col)) + " "
        out.append(head)
        state = cell(state_col, r[state_col])
        out.append(state, style=None if r[state_col] == "running" else "red")
        out.append(" " + cell(len(widths), r[-1]) + "\n")
    out.rstrip()
    return out


def render(snap: Snapshot, leaks: list[Leak], gpus: tuple[int, ...], user: str | None,
           pid: int | None, *, wide: bool = False, width: int = 80) -> RenderableType:
    """Tables sized for an 80-column terminal; ``wide`` adds UUIDs, power and PCI ids."""
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from gpuwarden.units import format_bytes, format_bytes_short, format_duration

    def na(v: object, suffix: str = "") -> str:
        return "n/a" if v is None else f"{v}{suffix}"

    gt = Table(title=f"GPUs · {snap.backend} · driver {snap.driver_version or 'n/a'}",
               title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    cols = ["GPU", "Name", "Memory"]
    if wide:
        cols += [""]
    cols += ["Util", "Temp"]
    if wide:
        cols += ["Power", "UUID"]
    cols += ["Mode", "Flags", "NUMA:CPUs"]
    for col in cols:
        gt.add_column(col, no_wrap=True, overflow="ellipsis",
                      justify="right" if col in ("Util", "Temp", "GPU") else "left")
    shown = [g for g in snap.gpus if not gpus or g.index in gpus]
    for g in shown:
        f = g.facts
        row = [f"{f.index}", escape(f.name.removeprefix("NVIDIA ")),
               f"{format_bytes_short(f.memory_used)}/{format_bytes_short(f.memory_total)}"]
        if wide:
            row.append(_bar(f.memory_used, f.memory_total))
        row += [na(f.utilization, "%"), na(f.temperature, "C")]
        if wide:
            power = ("n/a" if f.power_watts is None else
                     f"{f.power_watts:.0f}W" + ("" if f.power_limit_watts is None
                                                else f"/{f.power_limit_watts:.0f}W"))
            row += [power, f.uuid]
        numa = "?" if f.numa_node is None else str(f.numa_node)
        row += [_MODE_SHORT.get(f.compute_mode or "", f.compute_mode or "n/a"),
                _flags(f.persistence_mode, f.mps, f.mig_mode), f"{numa}:{f.cpus or 'unknown'}"]
        gt.add_row(*row)
    gt.caption = "Flags: P persistence mode, M MPS server, G MIG enabled"
    gt.caption_justify = "left"
    rows: list[tuple[str, ...]] = []
    for g in shown:
        for p in g.processes:
            if (user and p.user != user) or (pid and p.pid != pid):
                continue
            rows.append((str(g.index), str(p.pid), p.user or "?", p.container or "",
                         format_bytes_short(p.memory), na(p.gpu.sm_utilization, "%"),
                         format_duration(p.elapsed), _STATE_SHORT[p.state],
                         visible(p.command or "?")))  # another user's command line
    count = len(rows)
    pt = _process_table(rows, width)
    parts: list[RenderableType] = [gt]
    parts.append(pt if count else Text("No GPU processes" + (" match" if user or pid else ""),
                                       style="dim"))
    relevant = [lk for lk in leaks if lk.kind != "monitor" and (not gpus or lk.gpu in gpus)]
    if relevant:
        parts.append(Text(""))
        parts.append(Text("Leaks (see `gpuwarden leaks`, reclaim with `gpuwarden reap`):",
                          style="bold"))
        for lk in relevant:
            where = "-" if lk.gpu is None else str(lk.gpu)
            parts.append(Text(f"  GPU {where} {lk.kind} {format_bytes(lk.memory)}: "
                              f"{visible(lk.evidence)}", style="red"))
    for warning in snap.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    return Group(*parts)


def _snapshot(b: Backend) -> Snapshot:
    """A snapshot with each process's job as the daemon knows it, when one answers."""
    from gpuwarden.cli.common import daemon_job_pids
    from gpuwarden.observe.snapshot import take_snapshot, with_daemon_jobs

    return with_daemon_jobs(take_snapshot(b), daemon_job_pids())


def _watch_json(b: Backend, snap: Snapshot, interval: float, gpus: tuple[int, ...],
                user: str | None, pid: int | None) -> NoReturn:
    """``--json --watch``: one compact document a line per refresh (JSON Lines), for
    scripts that read the stream; it runs until interrupted."""
    import json
    import sys

    from gpuwarden.observe.jsonview import snapshot_json
    from gpuwarden.observe.leaks import find_leaks

    history = [snap]
    while True:
        doc = snapshot_json(snap, find_leaks(history), gpus=gpus, user=user, pid=pid)
        sys.stdout.write(json.dumps(doc, separators=(",", ":"), default=str) + "\n")
        sys.stdout.flush()
        time.sleep(interval)
        snap = _snapshot(b)
        history = [*history[-2:], snap]  # leaks must persist over 3 samples


GPU_CSV = ("index", "uuid", "name", "memory_total", "memory_used", "memory_free",
           "memory_reserved", "utilization", "temperature", "power_watts",
           "power_limit_watts", "compute_mode", "persistence_mode", "mig_mode", "mps",
           "numa_node", "cpus", "pci_bus_id", "ecc_uncorrected", "retired_pages",
           "nvlink_peers")
PROCESS_CSV = ("gpu", "pid", "user", "command", "memory", "container", "state",
               "sm_utilization", "elapsed", "start_time", "kinds", "job")
"""``status --format csv`` columns: the ``status --json`` keys, in its units (bytes,
seconds, percent, degrees C, watts); lists space-separated, unknown values empty."""


def _csv(doc: dict[str, Any], processes: bool) -> None:
    from gpuwarden.cli.common import emit_csv

    if processes:
        emit_csv(PROCESS_CSV, [[g["index"], *(p[c] for c in PROCESS_CSV[1:])]
                               for g in doc["gpus"] for p in g["processes"]])
    else:
        emit_csv(GPU_CSV, [[g[c] for c in GPU_CSV] for g in doc["gpus"]])


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]),
              default="table", show_default=True,
              help="csv: a header row, then one row a GPU (with --processes: a GPU "
                   "process); columns are the --json keys, in its units.")
@click.option("--processes", is_flag=True, help="With --format csv: one row a process.")
@click.option("--watch", "watch", type=DURATION, is_flag=False, flag_value=2.0, default=None,
              metavar="[INTERVAL]", help="Refresh every INTERVAL (default 2s; e.g. 1, "
                                         "500ms); with --json, one JSON document a line.")
@click.option("--gpu", "gpus", type=int, multiple=True, help="Only this GPU (repeatable).")
@click.option("--user", help="Only processes of this user.")
@click.option("--pid", type=int, help="Only this process.")
def status(as_json: bool, fmt: str, processes: bool, watch: float | None,
           gpus: tuple[int, ...], user: str | None, pid: int | None) -> None:
    """Every GPU (memory, utilization, mode, MPS, NUMA) and every GPU process."""
    from gpuwarden.observe.jsonview import snapshot_json
    from gpuwarden.observe.leaks import find_leaks

    fmt = "json" if as_json else fmt
    if watch is not None and watch <= 0:
        raise click.BadParameter("must be positive", param_hint="'--watch'")
    if processes and fmt != "csv":
        raise UsageError("--processes goes with --format csv")
    if watch is not None and fmt == "csv":
        raise UsageError("--watch prints a table or JSON lines, not CSV")
    with backend() as b:
        snap = _snapshot(b)
        check_gpu_indices(gpus, [g.index for g in snap.gpus])
        if fmt == "json" and watch is not None:
            _watch_json(b, snap, watch, gpus, user, pid)
        if fmt != "table":
            doc = snapshot_json(snap, find_leaks([snap]), gpus=gpus, user=user, pid=pid)
            if fmt == "csv":
                _csv(doc, processes)
            else:
                emit_json(doc)
            return
        from rich.console import Console, Group
        from rich.text import Text

        console = Console()
        wide, width = console.width >= 150, console.width
        if watch is None:
            console.print(render(snap, find_leaks([snap]), gpus, user, pid, wide=wide,
                                 width=width))
            from gpuwarden.cli.common import daemon_drains
            from gpuwarden.cli.settings import drain_lines

            for line in drain_lines(daemon_drains()):
                console.print(Text(line, style="yellow"))
            return
        from rich.live import Live

        history = [snap]

        def screen() -> RenderableType:
            return Group(Text(watch_header("status", watch), style="bold"),
                         render(snap, find_leaks(history), gpus, user, pid, wide=wide,
                                width=width))

        if not console.is_terminal:  # piped: every screen in turn (Live shows only the last)
            while True:
                console.print(screen())
                sys.stdout.flush()
                time.sleep(watch)
                snap = _snapshot(b)
                history = [*history[-2:], snap]
        with Live(screen(), console=console, screen=False, auto_refresh=False) as live:
            while True:
                time.sleep(watch)
                snap = _snapshot(b)
                history = [*history[-2:], snap]  # leaks must persist over 3 samples
                live.update(screen(), refresh=True)
