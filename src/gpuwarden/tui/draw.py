"""How ``gpuwarden top`` draws the model's values (``tui/model.py``) as rich text: the
colours of bar segments, jobs and states, the header line that gives way on a narrow
terminal, the GPU panel, a row's cells and the keys page. Functions of values and a
width, with no widget, so the app (``tui/app.py``) only places what they return."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.binding import Binding, BindingType

from gpuwarden.tui import model, table
from gpuwarden.tui.model import FOREIGN, FREE, LEAKED, Observation, Row

_STYLES = {
    FOREIGN: "grey62",
    LEAKED: "bold red",
    FREE: "grey35",
    "dim": "dim",
    "bold": "bold",
    "mark": "bold yellow",
    "": "",
}
_JOB_STATE_STYLE = {"running": "green", "queued": "yellow", "held": "yellow", "reserved": "cyan"}


def style_of(key: str) -> str:
    if key.startswith("job:"):
        return model.job_color(int(key[4:]))
    return _STYLES.get(key, "")


def legend() -> Text:
    t = Text()
    t.append(model.BAR_CHARS[model.JOB], "green")
    t.append("job ")
    t.append(model.BAR_CHARS[FOREIGN], style_of(FOREIGN))
    t.append("other ")
    t.append(model.BAR_CHARS[LEAKED], style_of(LEAKED))
    t.append("leak ")
    t.append(model.BAR_CHARS[FREE], style_of(FREE))
    t.append("free")
    return t


COLUMNS = (
    ("GPU", "the GPU index (a job: its GPUs)"),
    ("PID", "the process id (- for a job with no process on a GPU yet)"),
    ("USER", "its user"),
    ("JOB", "its gpuwarden job"),
    ("QOS", "the job's class: guar(anteed), burst(able), best(effort)"),
    ("MEM/BUDGET", "GPU memory it holds / what its job may hold per GPU"),
    ("STATE", "the process's state, or its job's"),
    ("%CPU", "host CPU since the last refresh (100: one core)"),
    ("RSS", "host memory resident"),
    ("COMMAND", "its command line"),
)


def keys_help(bindings: Sequence[BindingType]) -> RenderableType:
    """What ``?`` shows: every key, the memory bar legend and the columns, since the
    footer has room for only some of them."""
    keys = [
        ("enter / i", "the selected row's details (a job's, as `gpuwarden show`)"),
        ("↑ ↓ PgUp PgDn", "move in the table"),
    ]
    for b in bindings:
        if isinstance(b, Binding) and b.action != "details":
            shown = "?" if b.key == "question_mark" else b.key
            keys.append((shown, _KEY_HELP.get(b.action, b.description)))
    bar = Text("memory bars: ")
    bar.append_text(legend())
    return Group(pairs(keys), Text(""), bar, Text(""), pairs(list(COLUMNS)))


_KEY_HELP = {
    "cycle_sort": "sort by memory, pid, user or GPU (next)",
    "filter_user": "only one user's processes and jobs (empty: everyone)",
    "cycle_gpu": "only one GPU (next; then all)",
    "cancel_job": "cancel the selected job (asks first; the daemon decides)",
    "doctor": "doctor findings with their fixes",
    "refresh": "refresh now",
    "keys": "this page",
    "quit": "quit",
}


def pairs(items: Sequence[tuple[str, str]]) -> Table:
    """Two columns, the keys bold and the values folded: a row's details, the keys page."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for k, v in items:
        grid.add_row(k, Text(v))
    return grid


def header_line(
    obs: Observation | None, sort: str, user_filter: str | None, gpu_filter: int | None, width: int
) -> Text:
    """One line: what is shown, the filters and the bar legend. Where the width is
    short, the backend, the GPU count, the sort and the job count give way (in that
    order), so the filters and the legend stay."""
    parts: list[tuple[str, str, int]] = [(" gpuwarden", "bold", 0)]  # text, style, rank
    if obs is None:
        parts.append((" · starting…", "", 0))
    elif obs.error:
        parts.append((f" · {obs.error}", "bold red", 0))
    else:
        snap = obs.snapshot
        assert snap is not None
        parts += [(f" · {snap.backend}", "", 1), (f" · {len(snap.gpus)} GPUs", "", 2)]
        if obs.jobs is None:
            parts.append((f" · {obs.daemon or 'no daemon'}", "yellow", 4))
        else:
            n = len(obs.jobs)
            parts.append((f" · {n} job{'' if n == 1 else 's'}", "", 4))
    parts.append((f" · sort {sort}", "", 3))
    if user_filter:
        parts.append((f" · user {user_filter}", "bold cyan", 0))
    if gpu_filter is not None:
        parts.append((f" · gpu {gpu_filter}", "bold cyan", 0))
    lg = legend()
    room = width - lg.cell_len - 1  # the legend stays while the filters fit beside it
    for rank in (1, 2, 3, 4):
        if sum(len(t) for t, _, _ in parts) <= room:
            break
        parts = [p for p in parts if p[2] != rank]
    left = Text()
    for text, style, _ in parts:
        left.append(text, style)
    if left.cell_len <= room:
        left.append(" " * (room - left.cell_len))
        left.append_text(lg)
    left.truncate(width, overflow="ellipsis")
    return left


def gpu_panel(obs: Observation | None, width: int, gpu_filter: int | None) -> Text:
    """The GPU panel as one Text (a line per GPU)."""
    if obs is None or obs.snapshot is None:
        return Text("")
    lines = model.gpu_lines(obs.snapshot, obs.leaks)
    out = Text(no_wrap=True, overflow="ellipsis")
    if not lines:
        out.append("no GPUs", style="dim")
    for i, pieces in enumerate(model.render_gpu_lines(lines, width, gpu_filter)):
        if i:
            out.append("\n")
        for text, key in pieces:
            out.append(text, style_of(key))
    return out


def styled_cells(r: Row, layout: Sequence[table.Column]) -> list[Text]:
    """A table row's cells: the job in its colour, memory over budget in red, the state
    in its job state's colour (a process not running in red)."""
    cells = [Text(c) for c in table.row_cells(r, layout)]
    if r.job is not None:
        cells[3].stylize(f"bold {model.job_color(r.job)}")
    if r.over_budget:
        cells[5].stylize("bold red")
    if r.kind == model.QUEUED_JOB or r.job is not None:
        cells[6].stylize(_JOB_STATE_STYLE.get(r.state, "red"))
    elif r.state != "running":
        cells[6].stylize("red")
    return cells
