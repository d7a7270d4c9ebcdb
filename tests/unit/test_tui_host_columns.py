"""Host %CPU and RSS per process in ``top``: %CPU from the CPU seconds between two
snapshots of the same process (pid and start time), RSS as /proc says."""

from __future__ import annotations

import os

from gpuwarden.observe.snapshot import Snapshot
from gpuwarden.procs.live import LiveProcesses
from gpuwarden.tui import model, table
from tests.helpers.builders import GiB, gpu, proc, snapshot


def _snap(cpu: float | None, at: float, start: float = 1010.0) -> Snapshot:
    return snapshot(
        [(gpu(0, used=GiB), [proc(10, cpu_time=cpu, rss=2 * GiB, start_time=start)])], taken_at=at
    )


def test_cpu_percent_is_cpu_seconds_over_wall_seconds_of_the_same_process() -> None:
    before, now = _snap(10.0, 2000.0), _snap(11.5, 2003.0)
    [row] = model.build_rows(now, None, before)
    assert row.cpu == 50.0 and row.rss == 2 * GiB
    layout = table.table_layout([row], 100)
    titles = [h.strip() for h in table.header_cells(layout)]
    assert titles[-3:] == ["%CPU", "RSS", "COMMAND"]
    cells = [c.strip() for c in table.row_cells(row, layout)]
    assert cells[-3:-1] == ["50", "2.0G"]
    # No earlier sample, or another process that reused the pid: no figure, not a guess.
    assert model.build_rows(now, None)[0].cpu is None
    reused = _snap(11.5, 2003.0, start=1500.0)
    assert model.build_rows(reused, None, before)[0].cpu is None
    unknown = model.build_rows(reused, None)[0]
    assert table.row_cells(unknown, layout)[-3].strip() == "-"


def test_live_processes_carry_rss_and_cpu_time() -> None:
    sum(range(200_000))  # some CPU time of our own
    info = LiveProcesses().info(os.getpid())
    assert info.rss is not None and info.rss > 1 << 20
    assert info.cpu_time is not None and info.cpu_time > 0
