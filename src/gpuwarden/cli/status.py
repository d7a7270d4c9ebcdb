"""``gpuwarden status``: every GPU and GPU process, one screen, like nvidia-smi should."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import click

from gpuwarden.cli.common import format_option, watch_header, watch_option
from gpuwarden.cli.plain import backend, check_gpu_indices
from gpuwarden.cli.statusonce import print_once, render, snapshot_now
from gpuwarden.errors import UsageError

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.observe.snapshot import Snapshot


def _watch_json(
    b: Backend,
    snap: Snapshot,
    interval: float,
    gpus: tuple[int, ...],
    user: str | None,
    pid: int | None,
) -> NoReturn:
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
        snap = snapshot_now(b)
        history = [*history[-2:], snap]  # leaks must persist over 3 samples


GPU_CSV = (
    "index",
    "uuid",
    "name",
    "memory_total",
    "memory_used",
    "memory_free",
    "memory_reserved",
    "utilization",
    "temperature",
    "power_watts",
    "power_limit_watts",
    "compute_mode",
    "persistence_mode",
    "mig_mode",
    "mps",
    "numa_node",
    "cpus",
    "pci_bus_id",
    "ecc_uncorrected",
    "retired_pages",
    "nvlink_peers",
    "mig_instances",
)
PROCESS_CSV = (
    "gpu",
    "pid",
    "user",
    "command",
    "memory",
    "container",
    "state",
    "sm_utilization",
    "elapsed",
    "start_time",
    "kinds",
    "job",
    "mig",
)
"""``status --format csv`` columns: the ``status --json`` keys, in its units (bytes,
seconds, percent, degrees C, watts); lists space-separated (``mig_instances``: the
instances' MIG- UUIDs), unknown values empty."""


def _csv(doc: dict[str, Any], processes: bool) -> None:
    from gpuwarden.cli.common import emit_csv

    if processes:
        emit_csv(
            PROCESS_CSV,
            [
                [g["index"], *(p[c] for c in PROCESS_CSV[1:])]
                for g in doc["gpus"]
                for p in g["processes"]
            ],
        )
    else:
        emit_csv(
            GPU_CSV,
            [
                [[m["uuid"] for m in g[c]] if c == "mig_instances" else g[c] for c in GPU_CSV]
                for g in doc["gpus"]
            ],
        )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@format_option(
    "csv: a header row, then one row a GPU (with --processes: a GPU "
    "process); columns are the --json keys, in its units."
)
@click.option("--processes", is_flag=True, help="With --format csv: one row a process.")
@watch_option(
    "Refresh every INTERVAL (default 2s; e.g. 1, 500ms); with --json, one JSON document a line."
)
@click.option("--gpu", "gpus", type=int, multiple=True, help="Only this GPU (repeatable).")
@click.option("--user", help="Only processes of this user.")
@click.option("--pid", type=int, help="Only this process.")
@click.option(
    "--fresh",
    is_flag=True,
    help="Take a snapshot now, not the running daemon's latest (which a table "
    "says the age of, and --json gives as daemon.age).",
)
def status(
    as_json: bool,
    fmt: str,
    processes: bool,
    watch: float | None,
    gpus: tuple[int, ...],
    user: str | None,
    pid: int | None,
    fresh: bool,
) -> None:
    """Every GPU (memory, utilization, mode, MPS, NUMA) and every GPU process.

    With a daemon running, a one-shot status is its snapshot of the last second or so
    (its age in a footer); --fresh, --watch and CSV take their own."""
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
        snap = snapshot_now(b)
        check_gpu_indices(gpus, [g.index for g in snap.gpus])
        if fmt == "json" and watch is not None:
            _watch_json(b, snap, watch, gpus, user, pid)
        if fmt == "csv":
            doc = snapshot_json(snap, find_leaks([snap]), gpus=gpus, user=user, pid=pid)
            _csv(doc, processes)
            return
        if watch is None:
            print_once(snap, fmt == "json", gpus, user, pid)
            return
        from gpuwarden.render.ink import for_stream, rows
        from gpuwarden.render.statusview import emit

        ink, width = for_stream(sys.stdout)
        history = [snap]
        terminal = sys.stdout.isatty()
        while True:
            screen = [
                ink(watch_header("status", watch), "bold"),
                *render(snap, find_leaks(history), gpus, user, pid, ink, width),
            ]
            if terminal:  # redrawn in place, cut to the terminal's height, as watch(1) does
                height = rows(sys.stdout)
                if len(screen) > height - 1:
                    screen = [
                        *screen[: height - 2],
                        ink(f"… {len(screen) - height + 2} more lines", "dim"),
                    ]
                # home, each line over the last screen's, the rest erased: no flicker
                sys.stdout.write(
                    "\x1b[H" + "".join(f"{line}\x1b[K\n" for line in screen) + "\x1b[J"
                )
            else:
                emit(screen)  # piped: every screen in turn
            sys.stdout.flush()
            time.sleep(watch)
            snap = snapshot_now(b)
            history = [*history[-2:], snap]  # leaks must persist over 3 samples
