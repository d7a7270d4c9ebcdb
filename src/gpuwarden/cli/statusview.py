"""``status``'s tables, drawn from its ``--json`` document: the same whether this
process took the snapshot or the daemon served it (``cli/fast.py``). Imports rich and
the standard library only, no backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuwarden.printable import visible

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text


def _bar(used: int, total: int, width: int = 10) -> str:
    filled = round(width * used / total) if total else 0
    return "█" * filled + "░" * (width - filled)


_MODE_SHORT = {"Default": "Default", "Exclusive_Process": "Excl", "Exclusive_Thread": "ExclT",
               "Prohibited": "Prohib"}


_STATE_SHORT = {"running": "running", "dead": "dead", "other_namespace": "other-ns",
                "garbage": "garbage", "zombie": "zombie", "orphan": "orphan"}


def _flags(persistence: bool | None, mps: bool | None, mig: bool | None) -> str:
    """Compact settings column: P persistence on, M MPS serving, G MIG enabled."""
    return "".join(c for c, on in (("P", persistence), ("M", mps), ("G", mig)) if on) or "-"


_PROC_COLS = ("GPU", "PID", "User", "Container", "Mem", "SM", "Time", "State", "Command")
_PROC_MAX = (5, 10, 10, 16, 6, 4, 6, 8)  # widest each fixed column may grow
_RIGHT = {0, 1, 4, 5}


def _process_table(rows: list[tuple[str, ...]], width: int) -> Text:
    """The process list as aligned plain text: a rich Table costs ~0.5 ms a row, too slow
    for a box with thousands of GPU processes. States other than running are red."""
    from rich.cells import cell_len
    from rich.text import Text

    widths = [min(max(len(c), *(len(r[i]) for r in rows)) if rows else len(c), _PROC_MAX[i])
              for i, c in enumerate(_PROC_COLS[:-1])]
    cmd_width = max(width - sum(widths) - len(widths) - 1, 10)

    def cell(i: int, value: str) -> str:
        if i == len(widths):
            return value if len(value) <= cmd_width else value[: cmd_width - 1] + "…"
        w = widths[i]
        v = value if len(value) <= w else value[: w - 1] + "…"
        return v.rjust(w) if i in _RIGHT else v.ljust(w)

    out = Text("Processes\n", style="italic")
    out.append(" " + " ".join(cell(i, c) for i, c in enumerate(_PROC_COLS)).rstrip() + "\n",
               style="bold")
    out.append(" " + "─" * (min(width, sum(widths) + len(widths) + cmd_width) - 1) + "\n")
    state_col = len(widths) - 1
    for r in rows:
        head = " " + " ".join(cell(i, r[i]) for i in range(state_col)) + " "
        out.append(head)
        state = cell(state_col, r[state_col])
        out.append(state, style=None if r[state_col] == "running" else "red")
        out.append(" " + cell(len(widths), r[-1]) + "\n")
    out.rstrip()
    if all((line.isascii() and len(line) <= width) or cell_len(line) <= width
           for line in out.plain.split("\n")):
        out.no_wrap = True  # every line fits: rich's word wrap would cost more than the rest
    return out


def render_doc(doc: dict[str, Any], *, matching: bool = False, wide: bool = False,
               width: int = 80) -> RenderableType:
    """``status --json``'s document (its filters applied) as tables sized for an
    80-column terminal; ``wide`` adds UUIDs and power. ``matching``: a user or pid
    filter chose the processes."""
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from gpuwarden.units import format_bytes, format_bytes_short, format_duration

    def na(v: object, suffix: str = "") -> str:
        return "n/a" if v is None else f"{v}{suffix}"

    gt = Table(title=f"GPUs · {doc['backend']} · driver {doc['driver_version'] or 'n/a'}",
               title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    cols = ["GPU", "Name", "Memory"]
    if wide:
        cols += [""]
    cols += ["Util", "Temp"]
    if wide:
        cols += ["Power", "UUID"]
    cols += ["Mode", "Flags", "NUMA:CPUs"]
    for col in cols:
        gt.add_column(col, no_wrap=True, overflow="ellipsis",
                      justify="right" if col in ("Util", "Temp", "GPU") else "left")
    shown = doc["gpus"]
    for f in shown:
        row = [f"{f['index']}", escape(f["name"].removeprefix("NVIDIA ")),
               f"{format_bytes_short(f['memory_used'])}/{format_bytes_short(f['memory_total'])}"]
        if wide:
            row.append(_bar(f["memory_used"], f["memory_total"]))
        row += [na(f["utilization"], "%"), na(f["temperature"], "C")]
        if wide:
            watts, limit = f["power_watts"], f["power_limit_watts"]
            power = ("n/a" if watts is None else
                     f"{watts:.0f}W" + ("" if limit is None else f"/{limit:.0f}W"))
            row += [power, f["uuid"]]
        numa = "?" if f["numa_node"] is None else str(f["numa_node"])
        mode = f["compute_mode"]
        row += [_MODE_SHORT.get(mode or "", mode or "n/a"),
                _flags(f["persistence_mode"], f["mps"], f["mig_mode"]),
                f"{numa}:{f['cpus'] or 'unknown'}"]
        gt.add_row(*row)
        for m in f.get("mig_instances", []):  # each MIG instance: a device of its own
            mrow = [f"{f['index']}/{m['gi_id']}", escape(f"└ MIG {m['profile']}"),
                    f"{format_bytes_short(m['memory_used'])}/"
                    f"{format_bytes_short(m['memory_total'])}"]
            if wide:
                mrow.append(_bar(m["memory_used"], m["memory_total"]))
            mrow += ["", ""]
            if wide:
                mrow += ["", m["uuid"]]
            mrow += ["", "", ""]
            gt.add_row(*mrow)
    gt.caption = "Flags: P persistence mode, M MPS server, G MIG enabled"
    gt.caption_justify = "left"
    rows: list[tuple[str, ...]] = []
    for g in shown:
        for p in g["processes"]:
            mig = {m["uuid"]: m["gi_id"] for m in g.get("mig_instances", [])}.get(p.get("mig"))
            rows.append((str(g["index"]) if mig is None else f"{g['index']}/{mig}",
                         str(p["pid"]), p["user"] or "?", p["container"] or "",
                         format_bytes_short(p["memory"]), na(p["sm_utilization"], "%"),
                         format_duration(p["elapsed"]), _STATE_SHORT[p["state"]],
                         visible(p["command"] or "?")))  # another user's command line
    count = len(rows)
    pt = _process_table(rows, width)
    parts: list[RenderableType] = [gt]
    migs = [(f["index"], m) for f in shown for m in f.get("mig_instances", [])]
    if migs and not wide:  # a wide table has their UUIDs in its UUID column
        lines = Text("MIG instances (GPU/GI; CUDA_VISIBLE_DEVICES names the UUID)\n",
                     style="italic")
        for index, m in migs:
            lines.append(f" {index}/{m['gi_id']} {m['profile']} {m['uuid']} "
                         f"{len(m['processes'])} process(es)\n")
        lines.rstrip()
        parts.append(lines)
    parts.append(pt if count else Text("No GPU processes" + (" match" if matching else ""),
                                       style="dim"))
    relevant = [lk for lk in doc["leaks"] if lk["kind"] != "monitor"]  # GPUs: filtered
    if relevant:
        parts.append(Text(""))
        parts.append(Text("Leaks (see `gpuwarden leaks`, reclaim with `gpuwarden reap`):",
                          style="bold"))
        for lk in relevant:
            where = "-" if lk["gpu"] is None else str(lk["gpu"])
            parts.append(Text(f"  GPU {where} {lk['kind']} {format_bytes(lk['memory'])}: "
                              f"{visible(lk['evidence'])}", style="red"))
    for warning in doc["warnings"]:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    return Group(*parts)


def drain_lines(drains: list[dict[str, Any]]) -> list[str]:
    """``GPU 1 drained by root (ECC errors)``: one line per drained GPU (status, ps)."""
    return [f"GPU {d['gpu']} drained by {visible(d['by'])}"
            + (f" ({visible(d['reason'])})" if d.get("reason") else "")
            + ": no new placement there" for d in drains]


def print_leaks(console: Console, found: list[dict[str, Any]]) -> None:
    """``gpuwarden leaks``'s report of ``leaks --json``'s leaks."""
    from rich.markup import escape

    from gpuwarden.units import format_bytes

    real = [lk for lk in found if lk["kind"] != "monitor"]
    if not real:
        console.print("[green]No leaks[/green]: every byte in use belongs to a live process.")
    for lk in found:
        style = "dim" if lk["kind"] == "monitor" else "bold red"
        where = "-" if lk["gpu"] is None else str(lk["gpu"])
        pid = "" if lk["pid"] is None else f" pid {lk['pid']}"
        console.print(f"[{style}]GPU {where} {lk['kind']}{pid}[/{style}] "
                      f"{format_bytes(lk['memory']) if lk['memory'] is not None else ''}")
        console.print(f"  {escape(visible(lk['evidence']))}", highlight=False)
    if real:
        console.print("\nReclaim with [bold]gpuwarden reap[/bold] (dry run) and "
                      "[bold]gpuwarden reap --yes[/bold].")
