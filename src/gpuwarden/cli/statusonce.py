"""One ``status`` screen or document from a snapshot taken here: what ``status`` prints
without ``--watch`` or CSV. It needs no click, so ``cli/main.py`` runs it for a plain
``status`` when no daemon serves one (``cli/fast.py`` parsed the options), and the click
command runs the same code for the rest."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.observe.leaks import Leak
    from gpuwarden.observe.snapshot import Snapshot
    from gpuwarden.render.ink import Ink


def render(
    snap: Snapshot,
    leaks: list[Leak],
    gpus: tuple[int, ...],
    user: str | None,
    pid: int | None,
    ink: Ink,
    width: int,
) -> list[str]:
    """The screen's lines for ``width`` columns (``statusview.WIDE`` or more add UUIDs
    and power). Drawn from the ``--json`` document (``render/statusview.py``), as a
    daemon serves it."""
    from gpuwarden.observe.jsonview import snapshot_json
    from gpuwarden.render.statusview import render_doc

    doc = snapshot_json(snap, leaks, gpus=gpus, user=user, pid=pid)
    return render_doc(doc, matching=bool(user or pid), width=width, ink=ink)


def snapshot_now(b: Backend) -> Snapshot:
    """A snapshot with each process's job as the daemon knows it, when one answers."""
    from gpuwarden.client.glance import daemon_job_pids
    from gpuwarden.observe.snapshot import take_snapshot, with_daemon_jobs

    return with_daemon_jobs(take_snapshot(b), daemon_job_pids())


def print_once(
    snap: Snapshot, as_json: bool, gpus: tuple[int, ...], user: str | None, pid: int | None
) -> None:
    """``snap`` as ``status --json`` or the table (with the drained GPUs under it);
    ``gpus`` already checked against it."""
    from gpuwarden.cli.plain import emit_json
    from gpuwarden.client.glance import daemon_drains
    from gpuwarden.observe.leaks import find_leaks

    if as_json:
        from gpuwarden.observe.jsonview import snapshot_json

        emit_json(snapshot_json(snap, find_leaks([snap]), gpus=gpus, user=user, pid=pid))
        return
    from gpuwarden.render.ink import for_stream
    from gpuwarden.render.statusview import drain_lines, emit

    ink, width = for_stream(sys.stdout)
    emit(
        [
            *render(snap, find_leaks([snap]), gpus, user, pid, ink, width),
            *(ink(line, "yellow") for line in drain_lines(daemon_drains())),
        ]
    )


def status_once(as_json: bool, gpus: tuple[int, ...], user: str | None, pid: int | None) -> None:
    """Open the backend, take one snapshot, print it."""
    from gpuwarden.cli.plain import backend, check_gpu_indices

    with backend() as b:
        snap = snapshot_now(b)
        check_gpu_indices(gpus, [g.index for g in snap.gpus])
        print_once(snap, as_json, gpus, user, pid)
