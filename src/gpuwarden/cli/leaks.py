"""``gpuwarden leaks`` and ``gpuwarden reap``: find what holds GPU memory for nobody, and
take it back — with proof, in bytes and seconds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.common import DURATION, SIZE
from gpuwarden.cli.plain import backend, check_gpu_indices, emit_json
from gpuwarden.printable import visible

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.gpus.sim import SimBackend
    from gpuwarden.observe.leaks import Leak
    from gpuwarden.observe.reap import ReapAction

_sampling = [
    click.option(
        "--samples",
        type=click.IntRange(1, 100),
        default=3,
        show_default=True,
        help="Consecutive samples a leak must appear in.",
    ),
    click.option(
        "--interval", type=DURATION, default=0.5, show_default=True, help="Time between samples."
    ),
    click.option(
        "--threshold",
        type=SIZE,
        default=None,
        help="Smallest unaccounted memory worth reporting (default 64MiB).",
    ),
]


def _with_sampling(f: Any) -> Any:
    for opt in reversed(_sampling):
        f = opt(f)
    return f


def _find(
    b: Backend, samples: int, interval: float, threshold: int | None, gpus: tuple[int, ...]
) -> tuple[Any, list[Leak]]:
    from gpuwarden.observe.leaks import DEFAULT_THRESHOLD, find_leaks
    from gpuwarden.observe.sampling import sample_suspects

    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    snaps = sample_suspects(b, samples, interval, threshold)
    check_gpu_indices(gpus, [g.index for g in snaps[-1].gpus])
    found = find_leaks(snaps, threshold)
    if gpus:
        found = [lk for lk in found if lk.gpu in gpus or lk.gpu is None]
    return snaps[-1], found


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--gpu", "gpus", type=int, multiple=True, help="Only this GPU (repeatable).")
@_with_sampling
def leaks(
    as_json: bool, gpus: tuple[int, ...], samples: int, interval: float, threshold: int | None
) -> None:
    """Leaked GPU memory, hidden holders and pids nobody owns, each with evidence.

    Kinds: unaccounted (memory no process accounts for), hidden_holder (holds
    /dev/nvidiaN but the driver lists it nowhere), monitor (only control files:
    harmless), other_namespace, dead_pid, garbage_pid, zombie, orphan.

    \b
    Exit status (as doctor's, so cron or a monitor can alert on it):
      0  no leak (monitors alone are no leak)
      1  at least one leak
      2  bad usage; 3 no GPU backend (one line on stderr)
    """
    with backend() as b:
        _, found = _find(b, samples, interval, threshold, gpus)
    if as_json:
        emit_json({"leaks": [lk.to_json() for lk in found]})
        _exit_if_leaks(found)
        return
    import sys

    from gpuwarden.render.ink import for_stream
    from gpuwarden.render.statusview import emit, leak_lines

    ink, width = for_stream(sys.stdout)
    emit(leak_lines([lk.to_json() for lk in found], width, ink))
    _exit_if_leaks(found)


EXIT_LEAKS = 1


def _exit_if_leaks(found: list[Leak]) -> None:
    """Exit 1 when a leak other than a monitor was found: a cron job or a monitor alerts
    on the status, as on doctor's. SystemExit, not ctx.exit(): click's non-standalone
    mode would turn an Exit into a return value."""
    import sys

    if any(lk.kind != "monitor" for lk in found):
        sys.stdout.flush()
        sys.exit(EXIT_LEAKS)


def _used(b: Backend) -> dict[int, int]:
    return {g.index: g.memory_used for g in b.gpus()}


_SETTLE = 1.0  # seconds a GPU's use must stay put after its holders are gone


def _alive(pid: int, start_time: float | None) -> bool:
    """Is this very process (pid and start time, procs/identity.py) still running (a
    zombie is not)? One we may not look into is not waited for."""
    import psutil

    from gpuwarden.procs.identity import identify

    p = identify(pid, start_time)
    try:
        return p is not None and bool(p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _daemon_processes() -> dict[str, Any] | None:
    """The daemon's view of its running jobs' processes (/v1/job-pids), when one answers;
    None otherwise. Never starts a daemon."""
    from gpuwarden.client.api import Client
    from gpuwarden.client.paths import resolve_paths
    from gpuwarden.errors import GpuwardenError

    try:
        socket = resolve_paths().socket
        if not socket.exists():
            return None
        answer = Client(str(socket), timeout=10.0).request("GET", "/v1/job-pids")
    except (GpuwardenError, OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _simulated(b: Backend) -> SimBackend | None:
    """The simulated backend, whose scenario pids are never signalled: their reaping is
    modelled (``SimBackend.reap_declared``); None on a real one."""
    from gpuwarden.gpus.sim import SimBackend

    return b if isinstance(b, SimBackend) else None


def _verify(
    b: Backend,
    acted: list[ReapAction],
    before: dict[int, int],
    timeout: float,
    started: float,
    declared: Callable[[int], bool] | None = None,
) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Poll until every signalled pid has left the driver's lists and the expected bytes are
    back, or ``timeout`` passes. Returns per-GPU results and the pids still listed. A
    ``declared`` (simulated) pid is alive only while the simulated driver lists it."""
    expected: dict[int, int] = {}
    for a in acted:
        if a.expect_bytes is not None and len(a.gpus) == 1:
            expected[a.gpus[0]] = expected.get(a.gpus[0], 0) + a.expect_bytes
    watched = {a.pid for a in acted if a.pid is not None}
    starts = {a.pid: a.start_time for a in acted if a.pid is not None}
    deadline = started + timeout
    freed_at: dict[int, float] = {}
    settled_since: dict[int, tuple[int, float]] = {}  # GPU -> (bytes used, since when)
    while True:
        now = time.monotonic()
        listed = {p.pid for p in b.processes()}
        alive = {
            pid
            for pid in watched
            if pid in listed
            or (not (declared is not None and declared(pid)) and _alive(pid, starts[pid]))
        }
        used = _used(b)
        for gpu in {g for a in acted for g in a.gpus}:
            if gpu in freed_at or alive:
                continue
            if gpu in expected:
                if before.get(gpu, 0) - used.get(gpu, 0) >= expected[gpu]:
                    freed_at[gpu] = now
                continue
            # Nothing known to come back (a holder that allocated nothing): settled once
            # its processes are gone and the GPU's use stays put past the driver's lag.
            seen = settled_since.get(gpu)
            if seen is None or seen[0] != used.get(gpu, 0):
                settled_since[gpu] = (used.get(gpu, 0), now)
            elif now - seen[1] >= _SETTLE:
                freed_at[gpu] = now
        still = sorted(watched & listed)
        gpus = {g for a in acted for g in a.gpus}
        if (not alive and gpus <= set(freed_at)) or now >= deadline:
            break
        time.sleep(0.2)
    results = {
        gpu: {
            "gpu": gpu,
            "bytes": before.get(gpu, 0) - used.get(gpu, 0),
            "seconds": round(freed_at[gpu] - started, 3) if gpu in freed_at else None,
            "expected": expected.get(gpu),
        }
        for gpu in sorted({g for a in acted for g in a.gpus})
    }
    return results, still


@click.command()
@click.option("--yes", is_flag=True, help="Act. Without it, reap only says what it would do.")
@click.option(
    "--pid",
    "pids",
    type=int,
    multiple=True,
    help="Only this pid (repeatable); also allows reaping a computing process.",
)
@click.option("--gpu", "gpus", type=int, multiple=True, help="Only leaks on this GPU.")
@click.option(
    "--grace",
    type=DURATION,
    default=5.0,
    show_default=True,
    help="Time between SIGTERM and SIGKILL.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=30.0,
    show_default=True,
    help="How long to wait for the memory to come back.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_with_sampling
def reap(
    yes: bool,
    pids: tuple[int, ...],
    gpus: tuple[int, ...],
    grace: float,
    timeout: float,
    as_json: bool,
    samples: int,
    interval: float,
    threshold: int | None,
) -> None:
    """Kill what leaks GPU memory, then poll until the memory is back.

    Dry run by default. Kills hidden holders and orphans (SIGTERM, grace, SIGKILL), asks
    a zombie's parent to reap it; never another user's process unless run as root, never
    a running job's process nor one the driver shows computing unless named with --pid.
    Reports the bytes reclaimed and seconds taken, or what is still held and the command
    to run next."""
    from gpuwarden.observe.reap import NONE, SIGNAL_PARENT, TERMINATE, job_processes, plan_reap
    from gpuwarden.procs.terminate import signal_parent, terminate

    with backend() as b:
        snap, found = _find(b, samples, interval, threshold, gpus)
        candidates = {lk.pid for lk in found if lk.pid is not None}
        managed = job_processes(candidates, b.process_source().info, _daemon_processes())
        plan = plan_reap(found, snap, caller_uid=os.geteuid(), named=pids, managed=managed)
        outcome: dict[str, Any] = {
            "dry_run": not yes,
            "actions": [a.to_json() for a in plan],
            "reclaimed": [],
            "still_held": [],
            "next_steps": [],
        }
        acted = [a for a in plan if a.action != NONE]
        if yes and acted:
            before = _used(b)
            started = time.monotonic()
            sim = _simulated(b)
            declared = None if sim is None else sim.declared
            for a, row in zip(plan, outcome["actions"], strict=True):
                if a.action == NONE or a.pid is None:
                    continue
                if sim is not None and sim.declared(a.pid):
                    sim.reap_declared(a.pid)
                    row["result"] = (
                        "terminated" if a.action == TERMINATE else "reaped"
                    ) + " (simulated)"
                    outcome["simulated"] = True
                elif a.action == TERMINATE:
                    row["result"] = terminate(a.pid, a.start_time, grace)
                elif a.action == SIGNAL_PARENT and a.target is not None:
                    row["result"] = signal_parent(a.target, a.pid, child_start=a.start_time)
            results, still = _verify(b, acted, before, timeout, started, declared)
            outcome["reclaimed"] = list(results.values())
            outcome["still_held"] = still
        held = set(outcome["still_held"])
        outcome["next_steps"] = sorted(
            {a.next_step for a in plan if a.next_step and (a.action == NONE or a.pid in held)}
        )
    if as_json:
        emit_json(outcome)
    else:
        _render(plan, outcome, yes)
    if yes and outcome["still_held"]:
        raise SystemExit(1)


_SIMULATED = (
    "Simulated backend: the scenario's processes were not signalled; their reaping "
    "is modelled for this run only (the scenario file is unchanged)."
)


def _render(plan: list[ReapAction], outcome: dict[str, Any], yes: bool) -> None:
    from rich.console import Console
    from rich.markup import escape

    from gpuwarden.units import format_bytes

    console = Console(highlight=False)
    if not plan:
        console.print("[green]Nothing to reap[/green]: no leaks found.")
        return
    verb = {"terminate": "kill", "signal_parent": "signal parent of", "none": "leave"}
    for a, row in zip(plan, outcome["actions"], strict=True):
        target = f"pid {a.pid}" if a.pid is not None else "memory"
        where = ",".join(map(str, a.gpus)) or "-"
        result = f" -> {row['result']}" if "result" in row else ""
        style = "yellow" if a.action == "none" else "bold"
        console.print(
            f"[{style}]{verb[a.action]} {target}[/{style}] (GPU {where}, {a.kind}"
            f"{', ' + escape(a.user) if a.user else ''}): "
            f"{escape(visible(a.reason))}{result}"
        )
    if not yes and any(a.action != "none" for a in plan):
        console.print("\nDry run. Run [bold]gpuwarden reap --yes[/bold] to act.")
    if outcome.get("simulated"):
        console.print(_SIMULATED)
    for r in outcome["reclaimed"]:
        secs = "not yet" if r["seconds"] is None else f"in {r['seconds']:.1f}s"
        if r["expected"] is None and r["seconds"] is not None and r["bytes"] <= 0:
            console.print(f"GPU {r['gpu']}: reaped processes gone {secs}; they held no GPU memory")
        else:
            console.print(f"GPU {r['gpu']}: reclaimed {format_bytes(r['bytes'])} {secs}")
    if outcome["still_held"]:
        console.print(
            f"[red]Still listed by the driver:[/red] pids "
            f"{', '.join(map(str, outcome['still_held']))}"
        )
    if outcome["next_steps"]:
        console.print("\nNext steps:")
        for step in outcome["next_steps"]:
            console.print(f"  {escape(visible(step))}")
