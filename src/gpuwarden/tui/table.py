"""The process table of ``gpuwarden top`` as plain text cells: which columns, how wide
for the rows at hand and the terminal's width, and each row's cells cut to fit.
``tui/draw.py`` styles the cells; the rows are ``tui/model.py``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.tui.model import Row
from gpuwarden.units import format_bytes_short

_QOS_SHORT = {"guaranteed": "guar", "burstable": "burst", "besteffort": "best"}
# Process states as `gpuwarden status` shows them.
_STATE_SHORT = {"other_namespace": "other-ns"}


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    right: bool


_COLS = (
    ("GPU", 7, True),
    ("PID", 10, True),
    ("USER", 10, False),
    ("JOB", 6, True),
    ("QOS", 5, False),
    ("MEM/BUDGET", 13, True),
    ("STATE", 9, False),
    ("%CPU", 5, True),
    ("RSS", 6, True),
)
_MIN_COMMAND = 8


def _cells(r: Row) -> tuple[str, ...]:
    gpus = ",".join(map(str, r.gpus)) or "-"
    mem = "-" if r.memory is None else format_bytes_short(r.memory)
    budget = (
        ""
        if r.job is None
        else ("/whole" if r.budget is None else f"/{format_bytes_short(r.budget)}")
    )
    qos = "" if r.qos is None else _QOS_SHORT.get(r.qos, r.qos)
    cpu = "-" if r.cpu is None else f"{r.cpu:.0f}" if r.cpu >= 10 else f"{r.cpu:.1f}"
    return (
        gpus,
        "-" if r.pid is None else str(r.pid),
        r.user or "?",
        "" if r.job is None else str(r.job),
        qos,
        mem + budget if r.job is not None or r.memory is not None else "-",
        _STATE_SHORT.get(r.state, r.state),
        cpu,
        "-" if r.rss is None else format_bytes_short(r.rss),
    )


def table_layout(rows: Sequence[Row], width: int) -> list[Column]:
    """Column widths that fit ``width``: each fixed column as wide as its widest cell (up
    to a cap), the command taking the rest. Every column but the last includes a
    one-cell gap on its right."""
    cells = [_cells(r) for r in rows]
    cols = []
    for i, (title, cap, right) in enumerate(_COLS):
        w = max([len(title), *(len(c[i]) for c in cells)])
        cols.append(Column(title, min(w, cap) + 1, right))
    rest = max(width - sum(c.width for c in cols), _MIN_COMMAND)
    cols.append(Column("COMMAND", rest, False))
    return cols


def _fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        text = text[: max(width - 1, 0)] + "…" if width > 0 else ""
    return text.rjust(width) if right else text.ljust(width)


def row_cells(r: Row, layout: Sequence[Column]) -> tuple[str, ...]:
    """The row's cells, each exactly its column's width (a trailing gap included)."""
    values = (*_cells(r), r.command)
    out = []
    for i, (v, c) in enumerate(zip(values, layout, strict=True)):
        last = i == len(layout) - 1
        inner = c.width if last else c.width - 1
        out.append(_fit(v, inner, c.right) + ("" if last else " "))
    return tuple(out)


def header_cells(layout: Sequence[Column]) -> tuple[str, ...]:
    return tuple(
        _fit(c.title, c.width if i == len(layout) - 1 else c.width - 1, c.right)
        + ("" if i == len(layout) - 1 else " ")
        for i, c in enumerate(layout)
    )
