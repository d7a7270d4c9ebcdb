"""``gpuwarden top`` driven headless at 80x24 through textual's pilot, on the simulated
backend: the GPU lines, sorting and filtering, details, doctor, and a daemon's jobs as
rows that can be cancelled."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.helpers.paths import EXAMPLES, SRC
from tests.integration.daemon_fixture import PY, Daemon

textual = pytest.importorskip("textual")

from textual.pilot import Pilot  # noqa: E402

from gpuwarden.gpus.backend import Backend, open_backend  # noqa: E402
from gpuwarden.tui.app import TopApp  # noqa: E402
from gpuwarden.tui.screens import ConfirmScreen, PromptScreen, TextScreen  # noqa: E402

SIZE = (80, 24)


def plain(renderable: Any, width: int = 100) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    text = console.export_text()
    console.file.close()
    return text


async def until(pilot: Pilot[Any], pred: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.05)


def table_lines(app: TopApp) -> list[str]:
    """The table as shown: one string per row, cells joined as they are drawn."""
    from textual.widgets import DataTable

    table: DataTable[Any] = app.query_one(DataTable)
    return ["".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]


def pids(app: TopApp) -> list[str]:
    return [line.split()[1] for line in table_lines(app)]


def run(app: TopApp, script: Any) -> None:
    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.refreshes >= 1)
            await pilot.pause(0.05)
            await script(pilot)

    asyncio.run(main())


def test_gpu_lines_show_the_scenarios_numbers(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        lines = app.gpu_text().plain.splitlines()
        assert len(lines) == 4 and all(len(ln) <= 80 for ln in lines)
        assert lines[1].startswith(" 1 A100-SXM4-40GB [")
        # GPU 1: 2 GiB container + 512 MiB garbage pid + 300 MiB charged to nobody.
        assert "2.8G/40.0G" in lines[1] and "leak 812M" in lines[1] and "N0" in lines[1]
        assert "▒" in lines[1] and "▓" in lines[1]  # leaked and foreign segments
        assert "38.0G/40.0G" in lines[3] and "N1" in lines[3] and "leak" not in lines[3]
        assert "leak 4.0G" in lines[2]  # the orphan and the zombie
        assert "10%" in lines[0]
        header = str(app.query_one("#header").render())
        assert "no daemon" in header and "4 GPUs" in header
        svg = app.export_screenshot()
        assert "812M" in svg and "python&#160;eval.py" in svg
        assert pids(app)[:2] == ["34567", "34568"]  # by memory, largest first

    run(app, script)


def test_sort_and_filters_change_the_rows(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        every = pids(app)
        assert len(every) == 7 and every[0] == "34567"
        await pilot.press("s")
        assert app.sort == "pid"
        assert pids(app) == ["88", "12345", "23456", "23457", "34567", "34568", "4294967295"]
        await pilot.press("s")
        assert app.sort == "user"
        users = [line.split()[2] for line in table_lines(app)]
        assert users == ["bob", "bob", "dave", "erin", "?", "?", "?"]  # unknown last
        await pilot.press("g")
        assert app.gpu_filter == 0 and pids(app) == ["12345"]
        assert app.gpu_text().plain.splitlines()[0].startswith("▶0")
        await pilot.press("g")
        assert app.gpu_filter == 1 and sorted(pids(app)) == ["4294967295", "88"]
        await pilot.press("g", "g", "g")  # 2, 3, then every GPU again
        assert app.gpu_filter is None and len(pids(app)) == 7
        await pilot.press("u")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*"bob", "enter")
        assert app.user_filter == "bob"
        assert sorted(pids(app)) == ["23456", "23457"]
        assert all(line.split()[2] == "bob" for line in table_lines(app))
        assert "user bob" in str(app.query_one("#header").render())
        await pilot.press("u", "backspace", "backspace", "backspace", "enter")
        assert app.user_filter is None and len(pids(app)) == 7

    run(app, script)


def test_enter_opens_the_details_of_a_process(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        at = pids(app).index("23457")
        for _ in range(at):
            await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert isinstance(app.screen, TextScreen)
        text = plain(app.screen.body)
        assert "23457" in text and "zombie" in text and "[python] <defunct>" in text
        assert "parent" in text and "23400" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, TextScreen)
        # `c` on a process that is no job asks nothing and says why.
        await pilot.press("c")
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("not a gpuwarden job" in m for m in app.messages)

    run(app, script)


def test_d_shows_doctor_findings_with_their_fix(leaky: Backend) -> None:
    app = TopApp(leaky, interval=60)

    async def script(pilot: Pilot[Any]) -> None:
        await pilot.press("d")
        assert isinstance(app.screen, TextScreen)
        screen = app.screen
        await until(pilot, lambda: "sampling" not in plain(screen.body), timeout=20)
        text = plain(screen.body)
        assert "residual_memory" in text and "garbage_pid" in text
        assert "nvidia-smi -i 1 -pm 1" in text and "fix:" in text
        await pilot.press("q")  # closes the page, not the app
        assert not isinstance(app.screen, TextScreen) and app.is_running

    run(app, script)


def sim_job(mem: str, seconds: float) -> list[str]:
    return [PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds)]


def test_daemon_jobs_are_rows_and_c_cancels(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in ("GPUWARDEN_HOME", "GPUWARDEN_SIM", "GPUWARDEN_SIM_STATE"):
        monkeypatch.setenv(k, daemon.env[k])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    running = daemon.submit("--mem", "4G", "--name", "tui", cmd=sim_job("3G", 120))
    daemon.wait_state(running, "running")
    waiting = daemon.submit("--mem", "2G", "--after", str(running), cmd=sim_job("1G", 1))
    backend = open_backend()
    app = TopApp(backend, interval=0.2)

    def job_row(jid: int) -> str | None:
        return next((line for line in table_lines(app) if line.split()[3:4] == [str(jid)]), None)

    async def script(pilot: Pilot[Any]) -> None:
        await until(
            pilot,
            lambda: job_row(running) is not None and job_row(running).split()[1] != "-",
            timeout=30,
        )  # type: ignore[union-attr]
        row = job_row(running)
        assert row is not None
        cells = row.split()
        assert cells[2] == daemon.job(running)["user"]
        assert cells[4] == "burst" and cells[5] == "3.5G/4.0G" and cells[6] == "running"
        queued = job_row(waiting)
        assert queued is not None
        assert queued.split()[:2] == ["-", "-"] and "queued" in queued.split()
        assert "-/2.0G" in queued
        assert "2 jobs" in str(app.query_one("#header").render())
        # The job's memory is its own segment of GPU 0's bar, coloured by the job.
        assert "█" in app.gpu_text().plain.splitlines()[int(cells[0])]
        # Enter: the daemon's `show` data, events included.
        at = [line.split()[3:4] for line in table_lines(app)].index([str(running)])
        app.query_one("#rows").move_cursor(row=at)  # type: ignore[attr-defined]
        await pilot.press("enter")
        assert isinstance(app.screen, TextScreen)
        screen = app.screen
        await until(pilot, lambda: "loading" not in plain(screen.body))
        text = plain(screen.body)
        assert f"{running}  running" in text and "placed" in text and "started" in text
        assert "reserved 4096MiB" in text
        await pilot.press("escape")
        # c, then confirm: the request goes to the daemon, which cancels the job.
        app.query_one("#rows").move_cursor(row=at)  # type: ignore[attr-defined]
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        assert str(running) in app.screen.question
        await pilot.press("y")
        job = await asyncio.to_thread(daemon.wait_state, running, "cancelled")
        assert job["state"] == "cancelled"
        await until(pilot, lambda: any(m.startswith(f"job {running}:") for m in app.messages))
        await until(pilot, lambda: job_row(running) is None, timeout=30)

    try:
        run(app, script)
    finally:
        backend.close()


def test_top_on_a_non_tty_is_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    env = {
        "GPUWARDEN_SIM": str(EXAMPLES / "idle-2gpu.json"),
        "GPUWARDEN_SIM_STATE": str(tmp_path / "sim"),
        "PYTHONPATH": str(SRC),
        "PATH": "/usr/bin:/bin",
    }
    r = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "top"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "gpuwarden: error: top needs an interactive terminal; in scripts use "
        "`gpuwarden status --json` or `gpuwarden ps --json`"
    ]
    assert "Traceback" not in r.stderr and r.stdout == ""
    bad = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "top", "--interval", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--interval" in bad.stderr


def test_help_does_not_import_textual(tmp_path: Path) -> None:
    code = (
        "import sys; from gpuwarden.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('textual' in sys.modules)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "top" in r.stdout and "Live view of GPUs" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "False"
