"""``top`` as nvitop users expect it: ``?`` lists the keys, the bar legend stays when a
filter is on, and each process shows its host %CPU and RSS."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("textual")

from textual.pilot import Pilot

from gpuwarden.gpus.backend import Backend
from gpuwarden.tui.app import TopApp
from gpuwarden.tui.screens import TextScreen
from tests.integration.test_top import plain, run, table_lines, until


def test_question_mark_lists_every_key_the_legend_and_the_columns(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, TextScreen)
        text = plain(app.screen.body, width=120)
        for key in ("s ", "u ", "g ", "c ", "d ", "r ", "? ", "q ", "enter"):
            assert f"\n{key}" in "\n" + text, (key, text)
        assert "only one user" in text and "cancel the selected job" in text
        assert "▒leak" in text and "%CPU" in text and "host memory resident" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, TextScreen) and app.is_running

    run(app, script)


def test_the_legend_stays_beside_the_filters_at_80_columns(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        await pilot.press("g", "g")  # GPU 1
        await pilot.press("u", *"root", "enter")
        header = str(app.query_one("#header").render())
        assert "user root" in header and "gpu 1" in header, header
        assert header.rstrip().endswith("█job ▓other ▒leak ·free"), header
        assert len(header.rstrip()) <= 80

    run(app, script)


def test_processes_show_host_cpu_and_rss_columns(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        from textual.widgets import DataTable

        table: DataTable[Any] = app.query_one(DataTable)
        titles = [str(c.label).strip() for c in table.columns.values()]
        assert titles[-3:] == ["%CPU", "RSS", "COMMAND"], titles
        # The scenario's figures (rss, a steady cpu_percent), the CPU% from two looks.
        await pilot.press("r")
        await until(pilot, lambda: app.refreshes >= 2)
        rows = {line.split()[1]: line.split() for line in table_lines(app)}
        assert rows["34568"][-3] == "11.0G" and rows["34567"][-3] == "6.4G"
        cpu = {r.pid: r.cpu for r in app.shown}
        assert cpu[34568] is not None and 250 <= cpu[34568] <= 370, cpu  # 310, give or
        assert cpu[34567] is not None and 80 <= cpu[34567] <= 120, cpu  # take the clock
        assert cpu[12345] is None  # dead: nothing on the host
        assert next(r.rss for r in app.shown if r.pid == 12345) is None

    run(app, script)
