"""``gpuwarden mps``: start, stop and inspect MPS control daemons, a thin wrapper over
``nvidia-cuda-mps-control``; start and stop are dry runs unless ``--yes``.

Starting and stopping need root on a real machine, checked before anything is opened
(``require_root``). The simulated backend needs no root: it keeps the daemon's state in
its state directory, so the commands can be exercised without a GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.common import warn
from gpuwarden.cli.plain import (
    backend,
    check_gpu_indices,
    emit_json,
    require_root,
    simulated,
    simulated_backend,
)
from gpuwarden.errors import BackendUnavailable

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.mps.control import MpsConfig, MpsControl
    from gpuwarden.mps.state import MpsState


def _gpu_list(indices: list[int]) -> str:
    """``GPU 1`` or ``GPUs 0,1`` (``no GPU`` for none)."""
    if not indices:
        return "no GPU"
    return f"GPU{'s' if len(indices) > 1 else ''} {','.join(map(str, indices))}"


@click.group()
def mps() -> None:
    """Start, stop and inspect MPS control daemons (start and stop need root)."""


def _plan_lines(config: MpsConfig, control: MpsControl) -> list[str]:
    lines = [f"  {line}" for line in config.shell_lines(control.binary)]
    if config.visible_devices is not None and config.mem_limits:
        for gpu_index in sorted(config.mem_limits):
            lines.append(
                f"  # GPU {gpu_index} is device {config.ordinal(gpu_index)} "
                "for the daemon and its clients"
            )
    return lines


def _client_hint(config: MpsConfig) -> str:
    from gpuwarden.mps.state import DEFAULT_PIPE_DIR, same_dir

    parts = []
    if not same_dir(config.pipe_dir, DEFAULT_PIPE_DIR):
        parts.append(f"set CUDA_MPS_PIPE_DIRECTORY={config.pipe_dir}")
    if config.visible_devices is not None:
        n = len(config.visible_devices)
        parts.append(
            f"see the daemon's GPUs as devices 0-{n - 1}"
            if n > 1
            else "see the daemon's GPU as device 0"
        )
    return "clients: " + ("; ".join(parts) if parts else "nothing to set (default pipe dir)")


@mps.command("start")
@click.option("--gpus", metavar="LIST", help="GPUs the daemon serves, e.g. 0,1 (default: all).")
@click.option(
    "--pipe-dir",
    default=None,
    metavar="DIR",
    help="CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps).",
)
@click.option(
    "--log-dir",
    default=None,
    metavar="DIR",
    help="CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps).",
)
@click.option(
    "--mem-limit",
    "mem_limits",
    multiple=True,
    metavar="GPU=SIZE",
    help="Default pinned device memory limit per client, e.g. 0=2G (repeatable).",
)
@click.option(
    "--thread-percentage",
    type=int,
    metavar="N",
    help="Default active thread percentage per client, 1-100.",
)
@click.option("--yes", is_flag=True, help="Start it (root); without it, a dry run.")
def start(
    gpus: str | None,
    pipe_dir: str | None,
    log_dir: str | None,
    mem_limits: tuple[str, ...],
    thread_percentage: int | None,
    yes: bool,
) -> None:
    """Start an MPS control daemon with default limits. A dry run unless --yes."""
    from gpuwarden.mps.control import MpsControl
    from gpuwarden.mps.limits import (
        check_thread_percentage,
        format_mps_size,
        parse_gpu_list,
        parse_mem_limits,
    )
    from gpuwarden.mps.state import DEFAULT_LOG_DIR, DEFAULT_PIPE_DIR, MpsUnavailable

    # Input first (no machine needed), then root, then the binary, then NVML.
    limits = parse_mem_limits(mem_limits)
    if thread_percentage is not None:
        check_thread_percentage(thread_percentage)
    selected = parse_gpu_list(gpus) if gpus is not None else None
    control = MpsControl(pipe_dir or DEFAULT_PIPE_DIR, log_dir or DEFAULT_LOG_DIR)
    sim = simulated()
    if yes and not sim:
        require_root("starting the MPS control daemon")
        control.executable()
    with backend() as b:
        facts = b.gpus()
        available = [g.index for g in facts]
        check_gpu_indices(selected or (), available)
        check_gpu_indices(sorted(limits), available)
        config = control.config(selected, limits, thread_percentage)
        served = list(selected) if selected is not None else available
        for g in facts:
            if g.index in served and g.mig_mode:
                warn(
                    f"GPU {g.index} has MIG enabled: MPS then serves MIG instances, "
                    "not the whole GPU"
                )
        sim_b = simulated_backend(b)
        shown = _gpu_list(served)
        if not yes:
            click.echo(f"MPS control daemon for {shown} (dry run; add --yes to apply):")
            for line in _plan_lines(config, control):
                click.echo(line)
            click.echo(_client_hint(config))
            shared = [g.index for g in facts if g.index in served and g.compute_mode == "Default"]
            if shared:
                click.echo(
                    "hint: NVIDIA recommends compute mode Exclusive_Process on MPS GPUs "
                    f"so that only the MPS server uses them ({_gpu_list(shared)}: Default)"
                )
            if sim_b is not None:
                click.echo("(simulated backend: --yes marks MPS on these GPUs; no daemon starts)")
            else:
                try:
                    control.executable()
                except MpsUnavailable as e:
                    warn(f"{e}; --yes would fail")
                running = control.daemons()
                if running:
                    warn(
                        f"an MPS control daemon (pid {running[0].pid}) already uses pipe dir "
                        f"{control.pipe_dir}; --yes would refuse"
                    )
            return
        if sim_b is not None:
            for i in served:
                sim_b.set_mps(i, True)
            click.echo(
                f"MPS on {shown} (simulated backend: no daemon was started; "
                "on a real machine gpuwarden would run:)"
            )
            for line in _plan_lines(config, control):
                click.echo(line)
            return
        daemon = control.start(selected, limits, thread_percentage)
        click.echo(
            f"MPS control daemon started: pid {daemon.pid}, {shown}, "
            f"pipe dir {control.pipe_dir}, log dir {control.log_dir}"
        )
        for gpu_index, nbytes in sorted(limits.items()):
            click.echo(
                f"  default pinned memory limit: GPU {gpu_index} "
                f"(device {config.ordinal(gpu_index)}) {format_mps_size(nbytes)}"
            )
        if thread_percentage is not None:
            click.echo(f"  default active thread percentage: {thread_percentage}")
        click.echo(_client_hint(config))
        _render(_status_data(control.pipe_dir, b))


@mps.command("stop")
@click.option(
    "--pipe-dir",
    default=None,
    metavar="DIR",
    help="The daemon's CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps).",
)
@click.option("--yes", is_flag=True, help="Stop it (root); without it, a dry run.")
def stop(pipe_dir: str | None, yes: bool) -> None:
    """Stop an MPS control daemon (sends quit, waits for it to exit). Dry run unless --yes."""
    from gpuwarden.mps.control import MpsControl, control_shell_line
    from gpuwarden.mps.state import DEFAULT_PIPE_DIR

    control = MpsControl(pipe_dir or DEFAULT_PIPE_DIR)
    line = control_shell_line("quit", control.pipe_dir, control.binary)
    if simulated():
        with backend() as b:
            sim_b = simulated_backend(b)
            assert sim_b is not None
            on = [g.index for g in b.gpus() if g.mps]
            if not yes:
                click.echo(f"would turn MPS off on {_gpu_list(on)} (dry run; add --yes to apply)")
            else:
                for i in on:
                    sim_b.set_mps(i, False)
                click.echo(f"MPS off on {_gpu_list(on)}")
            click.echo(f"(simulated backend: no daemon; on a real machine: {line})")
        return
    if yes:
        require_root("stopping the MPS control daemon")
        control.executable()
        stopped = control.stop()
        pids = ", ".join(str(d.pid) for d in stopped) or "unknown pid"
        click.echo(f"MPS control daemon stopped ({pids}; pipe dir {control.pipe_dir})")
        return
    running = control.daemons()
    if running:
        pids = ", ".join(str(d.pid) for d in running)
        click.echo(
            f"would stop MPS control daemon {pids} (pipe dir {control.pipe_dir}) "
            "(dry run; add --yes to apply)"
        )
    else:
        click.echo(f"no MPS control daemon seen with pipe dir {control.pipe_dir} (dry run)")
    click.echo(f"equivalent: {line}")


def _status_data(pipe_dir: str | None, b: Backend | None = None) -> dict[str, Any]:
    """The ``mps status --json`` document (stable schema). Needs no root: without it,
    other users' daemons show no directories, and their pipes may refuse queries."""
    from gpuwarden.mps.control import MpsControl
    from gpuwarden.mps.limits import parse_server_list
    from gpuwarden.mps.state import (
        DEFAULT_PIPE_DIR,
        MpsError,
        MpsUnavailable,
        read_mps_state,
        same_dir,
    )

    state: MpsState = read_mps_state()
    warnings: list[str] = []
    if pipe_dir is not None:
        state = state.for_pipe_dir(pipe_dir)
        dirs = [pipe_dir]
    else:
        dirs = list(state.pipe_dirs)
        if (
            not any(same_dir(d, DEFAULT_PIPE_DIR) for d in dirs)
            and MpsControl(DEFAULT_PIPE_DIR).reachable()
        ):
            dirs.append(DEFAULT_PIPE_DIR)
    pipes = []
    for d in dirs:
        control = MpsControl(d, timeout=5.0)
        entry: dict[str, Any] = {
            "pipe_dir": control.pipe_dir,
            "reachable": control.reachable(),
            "server_list": None,
            "error": None,
        }
        if entry["reachable"]:
            try:
                answer = control.query("get_server_list")
                entry["server_list"] = parse_server_list(answer)
                if entry["server_list"] is None:
                    entry["error"] = f"unexpected answer: {answer}"
            except (MpsUnavailable, MpsError) as e:
                entry["error"] = str(e)
        pipes.append(entry)
    gpus: list[dict[str, Any]] | None = None
    name: str | None = None
    try:
        if b is None:
            with backend() as opened:
                name, facts = opened.name, opened.gpus()
                warnings += opened.warnings
        else:
            name, facts = b.name, b.gpus()
        gpus = [{"index": g.index, "uuid": g.uuid, "mps": g.mps} for g in facts]
    except BackendUnavailable as e:
        warnings.append(f"no GPU flags: {e}")
    return {
        "schema": 1,
        "backend": name,
        "daemons": [d.to_json() for d in state.daemons],
        "pipes": pipes,
        "gpus": gpus,
        "warnings": warnings,
    }


def _render(data: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()

    def na(v: object) -> str:
        return "?" if v is None else escape(str(v))

    if data["daemons"]:
        t = Table(
            title="MPS daemons",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            padding=(0, 1, 0, 0),
        )
        for col in ("PID", "Kind", "User", "Pipe dir", "Devices", "Mem limit", "Threads"):
            t.add_column(
                col, no_wrap=True, overflow="fold", justify="right" if col == "PID" else "left"
            )
        for d in data["daemons"]:
            devices = (
                "all"
                if d["pipe_dir"] is not None and d["visible_devices"] is None
                else na(d["visible_devices"])
            )
            limit = (
                "-"
                if d["pipe_dir"] is not None and d["pinned_mem_limit"] is None
                else na(d["pinned_mem_limit"])
            )
            threads = (
                "-"
                if d["pipe_dir"] is not None and d["active_thread_percentage"] is None
                else na(d["active_thread_percentage"])
            )
            t.add_row(
                str(d["pid"]), d["kind"], na(d["user"]), na(d["pipe_dir"]), devices, limit, threads
            )
        console.print(t)
    else:
        console.print("No MPS control daemon or server runs here.")
    for p in data["pipes"]:
        if p["server_list"] is not None:
            servers = ", ".join(map(str, p["server_list"])) or "none"
            console.print(f"{escape(p['pipe_dir'])}: servers {servers}")
        elif p["error"]:
            console.print(f"{escape(p['pipe_dir'])}: {escape(p['error'])}", style="yellow")
        else:
            console.print(f"{escape(p['pipe_dir'])}: control pipe not reachable", style="yellow")
    if data["gpus"] is not None:
        on = [int(g["index"]) for g in data["gpus"] if g["mps"]]
        console.print(f"MPS serving ({data['backend']}): {_gpu_list(on)}")
    for w in data["warnings"]:
        console.print(f"warning: {escape(w)}", style="yellow")


@mps.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option(
    "--pipe-dir",
    default=None,
    metavar="DIR",
    help="Only the daemon with this pipe directory (default: every one found).",
)
def status(as_json: bool, pipe_dir: str | None) -> None:
    """List MPS control daemons and servers.

    Shows pid, user, pipe dir, GPUs and limits of each, and the servers a reachable
    control daemon reports. Needs no root (without it, others' settings show as ?)."""
    data = _status_data(pipe_dir)
    if as_json:
        emit_json(data)
    else:
        _render(data)
