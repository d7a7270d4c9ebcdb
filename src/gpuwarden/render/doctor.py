"""``doctor``'s findings as people read them, drawn from its ``--json`` document, so
``gpuwarden doctor`` and the doctor page of ``top`` say the same thing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import RenderableType

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_MARK = {"critical": "✗", "warning": "!", "info": "i"}


def render(report: Mapping[str, Any]) -> RenderableType:
    """Grouped by severity, most urgent first (the summary's order); evidence and fix
    wrap under their label on 80 columns."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    findings, counts = report["findings"], report["summary"]
    if not findings:
        return Text("No problems found", style="green")
    parts: list[RenderableType] = []
    for sev in counts:
        group = [f for f in findings if f["severity"] == sev]
        if not group:
            continue
        style = _STYLE.get(sev, "bold")
        if parts:
            parts.append(Text(""))
        parts.append(Text(f"{sev.capitalize()} ({len(group)})", style=style))
        for f in group:
            where = "machine" if f["gpu"] is None else f"GPU {f['gpu']}"
            head = Text(f"{_MARK.get(sev, '-')} ", style=style)
            head.append(f"{where} · {f['rule']}", style="bold")
            if f["pid"] is not None:
                head.append(f" · pid {f['pid']}")
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True, width=4)
            grid.add_column(ratio=1, overflow="fold")
            grid.add_row("", Text(f["evidence"]))
            grid.add_row(Text("fix:", style="dim"), Text(f["remedy"], style="green"))
            parts += [head, grid]
    parts += [Text(""), Text(", ".join(f"{n} {s}" for s, n in counts.items()), style="bold")]
    return Group(*parts)
