"""The textual app behind ``gpuwarden top``: GPU memory bars, a table of processes and
daemon jobs, and the keys that open details, doctor findings and a cancel's question
(the pages are ``tui/screens.py``, the drawing ``tui/draw.py``).

Snapshots are taken in a worker thread with the one backend the app was given, so the UI
never waits on NVML or /proc; the table is rebuilt only when its rows changed."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, ClassVar, cast

from rich.console import Group, RenderableType
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Static

from gpuwarden.errors import GpuwardenError
from gpuwarden.tui import draw, model
from gpuwarden.tui import table as cells
from gpuwarden.tui.model import Observation, Row
from gpuwarden.tui.screens import ConfirmScreen, PromptScreen, TextScreen

if TYPE_CHECKING:
    from gpuwarden.client.api import Client
    from gpuwarden.client.views import JobDoc
    from gpuwarden.gpus.backend import Backend
    from gpuwarden.observe.snapshot import Snapshot

DOCTOR_SAMPLES, DOCTOR_INTERVAL = 3, 0.5  # as `gpuwarden doctor` samples by default
_HISTORY = 3  # snapshots a leak must persist over, as in `status --watch`


class RowTable(DataTable[Text]):
    """The process and job table; Enter (or a click) on a row opens its details."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Info", show=True),
    ]


class TopApp(App[None]):
    """Live GPUs, processes and jobs; see the footer for the keys."""

    TITLE = "gpuwarden top"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #header { height: 1; background: $panel; }
    #gpus { height: auto; max-height: 50%; }
    #rows { height: 1fr; scrollbar-size-vertical: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("u", "filter_user", "User"),
        Binding("g", "cycle_gpu", "GPU"),
        Binding("i", "details", "Info", show=False),
        Binding("c", "cancel_job", "Cancel"),
        Binding("d", "doctor", "Doctor"),
        Binding("r", "refresh", "Refresh"),
        Binding("question_mark", "keys", "Keys"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self, backend: Backend, *, interval: float = 2.0, client: Client | None = None
    ) -> None:
        super().__init__()
        self.backend = backend
        self.interval = interval
        if client is None:
            from gpuwarden.client.api import Client
            from gpuwarden.client.paths import resolve_paths

            client = Client(str(resolve_paths().socket), timeout=5.0)
        self.client = client
        self.sort = model.SORTS[0]
        self.user_filter: str | None = None
        self.gpu_filter: int | None = None
        self.observation: Observation | None = None
        self.shown: list[Row] = []  # the table's rows, in order
        self.messages: list[str] = []  # everything said with notify, for tests and logs
        self.refreshes = 0
        self._top_history: list[Snapshot] = []
        self._top_lock = threading.Lock()
        self._top_layout: list[cells.Column] | None = None
        self._top_ready = False  # widgets composed and mounted

    # -- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="gpus")
        yield RowTable(id="rows", cursor_type="row", cell_padding=0, zebra_stripes=False)
        yield Footer()

    def on_mount(self) -> None:
        self._top_ready = True
        self.query_one(DataTable).focus()
        self._render_header()
        self.action_refresh()
        self.set_interval(self.interval, self.action_refresh)

    def on_resize(self) -> None:
        self._render_all()

    # -- collecting -----------------------------------------------------------------------

    def action_refresh(self) -> None:
        self._collect()

    @work(thread=True, group="refresh")
    def _collect(self) -> None:
        """Snapshot + leaks + the daemon's queue, off the UI thread. A refresh asked while
        one runs is dropped: the running one is as fresh."""
        if not self._top_lock.acquire(blocking=False):
            return
        try:
            obs = self._observe()
        finally:
            self._top_lock.release()
        self.call_from_thread(self._apply, obs)

    def _observe(self) -> Observation:
        from gpuwarden.observe.leaks import find_leaks
        from gpuwarden.observe.snapshot import take_snapshot

        try:
            # Hidden holders need a scan of every process's open files: left to doctor.
            snap = take_snapshot(self.backend, holders=False)
        except (GpuwardenError, OSError) as e:
            return Observation(snapshot=None, error=str(e))
        self._top_history = [*self._top_history[-(_HISTORY - 1) :], snap]
        leaks = tuple(find_leaks(self._top_history))
        jobs, daemon = self._jobs()
        previous = self._top_history[-2] if len(self._top_history) > 1 else None
        rows = tuple(model.build_rows(snap, jobs, previous))
        return Observation(snapshot=snap, leaks=leaks, jobs=jobs, daemon=daemon, rows=rows)

    def _jobs(self) -> tuple[tuple[JobDoc, ...] | None, str | None]:
        from gpuwarden.client.api import DaemonUnavailable

        try:
            answer = self.client.request("GET", "/v1/jobs")  # its shape checked below
        except DaemonUnavailable:
            return None, "no daemon"
        except GpuwardenError as e:
            return None, f"daemon: {e}"
        jobs = answer.get("jobs") if isinstance(answer, dict) else None
        if not isinstance(jobs, list):
            return None, "daemon: unexpected answer"
        return tuple(cast("JobDoc", j) for j in jobs if isinstance(j, dict)), None

    def _apply(self, obs: Observation) -> None:
        self.observation = obs
        self.refreshes += 1
        self._render_all()

    # -- rendering ------------------------------------------------------------------------

    def _render_all(self) -> None:
        if not self._top_ready:
            return
        self._render_header()
        self._render_gpus()
        self._render_table()

    def _render_header(self) -> None:
        """One line: what is shown, the filters and the bar legend (``draw.header_line``)."""
        self.query_one("#header", Static).update(
            draw.header_line(
                self.observation, self.sort, self.user_filter, self.gpu_filter, self.size.width
            )
        )

    def gpu_text(self) -> Text:
        """The GPU panel as one Text (a line per GPU)."""
        return draw.gpu_panel(self.observation, self.size.width, self.gpu_filter)

    def _render_gpus(self) -> None:
        self.query_one("#gpus", Static).update(self.gpu_text())

    def _render_table(self) -> None:
        obs = self.observation
        table: DataTable[Text] = self.query_one(DataTable)
        all_rows = [] if obs is None else list(obs.rows)
        rows = model.sort_rows(
            model.filter_rows(all_rows, user=self.user_filter, gpu=self.gpu_filter), self.sort
        )
        layout = cells.table_layout(rows, max(self.size.width - 1, 20))
        if layout != self._top_layout:
            table.clear(columns=True)
            for col, title in zip(layout, cells.header_cells(layout), strict=True):
                table.add_column(Text(title, style="bold"), width=col.width, key=col.title)
            self._top_layout = layout
            self.shown = []
        elif rows == self.shown and table.row_count == len(rows):
            return  # nothing changed: leave the table (and its cursor) alone
        selected = self.selected()
        table.clear()
        for r in rows:
            table.add_row(*draw.styled_cells(r, layout), key=r.key)
        self.shown = rows
        if selected is not None:
            for i, r in enumerate(rows):
                if r.key == selected.key:
                    table.move_cursor(row=i, animate=False)
                    break

    # -- the selected row -----------------------------------------------------------------

    def selected(self) -> Row | None:
        table: DataTable[Text] = self.query_one(DataTable)
        i = table.cursor_row
        if not self.shown or i < 0 or i >= len(self.shown):
            return None
        return self.shown[i]

    def say(self, message: str, severity: str = "information") -> None:
        self.messages.append(message)
        if severity == "error":
            self.notify(message, severity="error", timeout=8)
        elif severity == "warning":
            self.notify(message, severity="warning")
        else:
            self.notify(message)

    # -- keys -----------------------------------------------------------------------------

    def action_cycle_sort(self) -> None:
        self.sort = model.SORTS[(model.SORTS.index(self.sort) + 1) % len(model.SORTS)]
        self._render_header()
        self._render_table()

    def action_cycle_gpu(self) -> None:
        obs = self.observation
        indices = (
            [] if obs is None or obs.snapshot is None else [g.index for g in obs.snapshot.gpus]
        )
        cycle: list[int | None] = [None, *indices]
        try:
            at = cycle.index(self.gpu_filter)
        except ValueError:
            at = 0
        self.gpu_filter = cycle[(at + 1) % len(cycle)]
        self._render_all()

    def action_filter_user(self) -> None:
        def done(value: str | None) -> None:
            if value is None:
                return
            self.user_filter = value or None
            self._render_all()

        self.push_screen(
            PromptScreen("Only the processes and jobs of user:", self.user_filter or ""), done
        )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_details()

    def action_details(self) -> None:
        row = self.selected()
        obs = self.observation
        if row is None or obs is None or obs.snapshot is None:
            self.say("no row selected", "warning")
            return
        parts: list[RenderableType] = []
        if row.pid is not None:
            parts.append(draw.pairs(model.process_details(obs.snapshot, row.gpus[0], row.pid)))
        if row.job is None:
            title = f"process {row.pid} on GPU {row.gpus[0]}"
            self.push_screen(TextScreen(title, Group(*parts)))
            return
        title = f"job {row.job}" + ("" if row.pid is None else f" · process {row.pid}")
        screen = TextScreen(title, Group(*parts, Text("loading the job…", style="dim")))
        self.push_screen(screen)
        self._load_job(screen, row.job, parts)

    @work(thread=True, group="details")
    def _load_job(self, screen: TextScreen, job: int, parts: list[RenderableType]) -> None:
        try:
            j = self.client.job(job)
            body: RenderableType = draw.pairs(model.job_details(j))
        except GpuwardenError as e:
            body = Text(f"job {job}: {e}", style="red")
        rule = [Text("")] if parts else []
        self.call_from_thread(screen.set_body, Group(*parts, *rule, body))

    def action_cancel_job(self) -> None:
        row = self.selected()
        if row is None or row.job is None:
            self.say("not a gpuwarden job: select a job's row to cancel it", "warning")
            return
        job = row.job

        def done(yes: bool | None) -> None:
            if yes:
                self._send_cancel(job)

        what = row.command if len(row.command) <= 40 else row.command[:39] + "…"
        self.push_screen(ConfirmScreen(f"Cancel job {job} of {row.user or '?'}?\n{what}"), done)

    @work(thread=True, group="cancel")
    def _send_cancel(self, job: int) -> None:
        """Only the request: the daemon decides (owner, root or admin) and says why not."""
        try:
            answer = self.client.request("POST", f"/v1/jobs/{job}/cancel")
            state = answer.get("state") if isinstance(answer, dict) else None
            self.call_from_thread(self.say, f"job {job}: {state or 'cancel sent'}")
        except GpuwardenError as e:
            self.call_from_thread(self.say, f"job {job}: {e}", "error")
        self.call_from_thread(self.action_refresh)

    def action_keys(self) -> None:
        self.push_screen(TextScreen("gpuwarden top: keys", draw.keys_help(self.BINDINGS)))

    def action_doctor(self) -> None:
        screen = TextScreen(
            "doctor findings (as `gpuwarden doctor`)",
            Text(f"sampling {DOCTOR_SAMPLES} snapshots…", style="dim"),
        )
        self.push_screen(screen)
        self._diagnose(screen)

    @work(thread=True, group="doctor")
    def _diagnose(self, screen: TextScreen) -> None:
        from gpuwarden.client.glance import daemon_job_pids
        from gpuwarden.observe.doctor import diagnose, mps_state, report
        from gpuwarden.observe.leaks import find_leaks
        from gpuwarden.observe.snapshot import take_snapshot, with_daemon_jobs
        from gpuwarden.render.doctor import render

        snaps: list[Snapshot] = []
        try:
            for n in range(DOCTOR_SAMPLES):
                if n:
                    time.sleep(DOCTOR_INTERVAL)
                with self._top_lock:
                    snap = take_snapshot(self.backend)
                # which processes are jobs' (shared_default_mode), as `gpuwarden doctor`
                snaps.append(with_daemon_jobs(snap, daemon_job_pids()))
            mps = mps_state(lambda m: self.call_from_thread(self.say, m, "warning"))
            findings = diagnose(snaps[-1], find_leaks(snaps), mps)
            body = render(report(findings))
        except (GpuwardenError, OSError) as e:
            body = Text(f"doctor failed: {e}", style="red")
        self.call_from_thread(screen.set_body, body)
