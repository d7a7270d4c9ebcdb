"""``status``'s and ``leaks``'s screens, drawn from their ``--json`` documents: the same
whether this process took the snapshot or the daemon served it (``cli/fast.py``). Plain
lines styled by ``render/ink.py``: the standard library only, neither rich nor a backend,
so that a served ``status`` costs little more than the interpreter's start-up."""

from __future__ import annotations

from gpuwarden.printable import clip, clipped, visible
from gpuwarden.printable import width as width_of
from gpuwarden.render.ink import Ink

TYPE_CHECKING = False  # a served status imports neither typing nor collections.abc
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any


def _bar(used: int, total: int, width: int = 10) -> str:
    filled = round(width * used / total) if total else 0
    return "█" * filled + "░" * (width - filled)


_MODE_SHORT = {
    "Default": "Default",
    "Exclusive_Process": "Excl",
    "Exclusive_Thread": "ExclT",
    "Prohibited": "Prohib",
}


_STATE_SHORT = {
    "running": "running",
    "dead": "dead",
    "other_namespace": "other-ns",
    "garbage": "garbage",
    "zombie": "zombie",
    "orphan": "orphan",
}


def _flags(persistence: bool | None, mps: bool | None, mig: bool | None) -> str:
    """Compact settings column: P persistence on, M MPS serving, G MIG enabled."""
    return "".join(c for c, on in (("P", persistence), ("M", mps), ("G", mig)) if on) or "-"


def _table(
    head: list[str],
    body: list[list[str]],
    right: set[int],
    width: int,
    ink: Ink,
    *,
    gap: int = 2,
    most: tuple[int, ...] = (),
    clip_last: bool = False,
    style: Callable[[int, str], str | None] | None = None,
) -> list[str]:
    """Aligned columns ``gap`` spaces apart behind a one-space margin, a rule under the bold
    header; column ``i`` at most ``most[i]`` wide. When too wide for ``width``, the widest
    columns give way a column at a time (their cells cut with "…"), or with
    ``clip_last`` the last column alone (a command line). A rich Table costs ~0.5 ms a
    row: too slow for a box with thousands of GPU processes, and importing rich costs
    more than drawing the screen. ``style(column, value)`` styles a body cell."""
    cols = len(head)
    columns: list[Sequence[str]] = list(zip(*body, strict=True)) or [()] * cols
    ascii_ = ["".join(c).isascii() for c in columns]  # a column at a time: C speed
    need = [
        max(width_of(head[i]), *(map(len, c) if ascii_[i] else map(width_of, c)))
        for i, c in enumerate(columns)
    ]
    widths = [min(w, most[i]) if i < len(most) else w for i, w in enumerate(need)]
    over = 1 + sum(widths) + gap * (cols - 1) - width
    if over > 0 and clip_last:
        widths[-1] = max(widths[-1] - over, 10)
    while over > 0 and not clip_last and max(widths) > 1:
        widest = max(range(cols), key=lambda i: widths[i])
        widths[widest] -= 1
        over -= 1
    last = cols - 1
    sep = " " * gap

    def cell(value: str, i: int) -> str:
        """``value`` cut to column ``i`` and padded to its width (the last: cut only)."""
        v, n = clipped(value, widths[i])
        if i == last:
            return v
        return " " * (widths[i] - n) + v if i in right else v + " " * (widths[i] - n)

    def line(cells: Iterable[str]) -> str:
        return " " + sep.join(cells).rstrip()

    rule = " " + "─" * min(sum(widths) + gap * (cols - 1), width - 1)
    head_line = ink(line([cell(h, i) for i, h in enumerate(head)]), "bold")
    if style is not None and ink.colour:  # a cell at a time, each styled as it says
        return [
            head_line,
            rule,
            *(line([ink(cell(v, i), style(i, v)) for i, v in enumerate(r)]) for r in body),
        ]
    # A column at a time, the rows then joined by one str.format each (thousands of GPU
    # processes): a column of ASCII cells that all fit is padded by the format itself.
    specs: list[str] = []
    prepared: list[Sequence[str]] = []
    for i, column in enumerate(columns):
        if i != last and ascii_[i] and need[i] <= widths[i]:
            specs.append(f"{{:{'>' if i in right else '<'}{widths[i]}}}")
            prepared.append(column)
        else:
            specs.append("{}")
            prepared.append([cell(v, i) for v in column])
    fmt = " " + sep.join(specs)
    return [head_line, rule, *(fmt.format(*r).rstrip() for r in zip(*prepared, strict=True))]


_PROC_COLS = ["GPU", "PID", "User", "Container", "Mem", "SM", "Time", "State", "Command"]
_PROC_MAX = (5, 10, 10, 16, 6, 4, 6, 8)  # widest each fixed column may grow
_PROC_RIGHT = {0, 1, 4, 5}


def _wrapped(text: str, width: int, indent: str, hang: str) -> list[str]:
    """``text`` wrapped to ``width`` columns, its first line indented by ``indent`` and
    the rest by ``hang``."""
    import textwrap

    return textwrap.wrap(
        text,
        width=max(width, len(hang) + 10),
        initial_indent=indent,
        subsequent_indent=hang,
        break_on_hyphens=False,
    ) or [indent]


WIDE = 150  # columns from which the GPU table adds memory bars, power and UUIDs


def render_doc(
    doc: dict[str, Any], *, matching: bool = False, width: int = 80, ink: Ink | None = None
) -> list[str]:
    """``status --json``'s document (its filters applied) as the lines of its screen,
    sized for ``width`` columns (``WIDE`` or more: with UUIDs and power). ``matching``:
    a user or pid filter chose the processes."""
    from gpuwarden.units import format_bytes, format_bytes_short, format_duration

    ink = ink or Ink(False)
    wide = width >= WIDE

    def na(v: object, suffix: str = "") -> str:
        return "n/a" if v is None else f"{v}{suffix}"

    cols = ["GPU", "Name", "Memory"]
    if wide:
        cols += [""]
    cols += ["Util", "Temp"]
    if wide:
        cols += ["Power", "UUID"]
    cols += ["Mode", "Flags", "NUMA:CPUs"]
    gpu_right = {i for i, c in enumerate(cols) if c in ("Util", "Temp", "GPU")}
    shown = doc["gpus"]
    body: list[list[str]] = []
    for f in shown:
        row = [
            f"{f['index']}",
            visible(f["name"].removeprefix("NVIDIA ")),
            f"{format_bytes_short(f['memory_used'])}/{format_bytes_short(f['memory_total'])}",
        ]
        if wide:
            row.append(_bar(f["memory_used"], f["memory_total"]))
        row += [na(f["utilization"], "%"), na(f["temperature"], "C")]
        if wide:
            watts, limit = f["power_watts"], f["power_limit_watts"]
            power = (
                "n/a"
                if watts is None
                else f"{watts:.0f}W" + ("" if limit is None else f"/{limit:.0f}W")
            )
            row += [power, f["uuid"]]
        numa = "?" if f["numa_node"] is None else str(f["numa_node"])
        mode = f["compute_mode"]
        row += [
            _MODE_SHORT.get(mode or "", mode or "n/a"),
            _flags(f["persistence_mode"], f["mps"], f["mig_mode"]),
            f"{numa}:{f['cpus'] or 'unknown'}",
        ]
        body.append(row)
        for m in f.get("mig_instances", []):  # each MIG instance: a device of its own
            mrow = [
                f"{f['index']}/{m['gi_id']}",
                visible(f"└ MIG {m['profile']}"),
                f"{format_bytes_short(m['memory_used'])}/{format_bytes_short(m['memory_total'])}",
            ]
            if wide:
                mrow.append(_bar(m["memory_used"], m["memory_total"]))
            mrow += ["", ""]
            if wide:
                mrow += ["", m["uuid"]]
            mrow += ["", "", ""]
            body.append(mrow)
    title = f"GPUs · {doc['backend']} · driver {doc['driver_version'] or 'n/a'}"
    out = [
        ink(clip(visible(title), width), "italic"),
        *_table(cols, body, gpu_right, width, ink),
        ink(clip("Flags: P persistence mode, M MPS server, G MIG enabled", width), "dim"),
    ]
    migs = [(f["index"], m) for f in shown for m in f.get("mig_instances", [])]
    if migs and not wide:  # a wide table has their UUIDs in its UUID column
        out.append(ink("MIG instances (GPU/GI; CUDA_VISIBLE_DEVICES names the UUID)", "italic"))
        out += [
            clip(
                f" {index}/{m['gi_id']} {m['profile']} {m['uuid']} "
                f"{len(m['processes'])} process(es)",
                width,
            )
            for index, m in migs
        ]
    procs: list[list[str]] = []
    for g in shown:
        mig_of = {m["uuid"]: m["gi_id"] for m in g.get("mig_instances", [])}
        for p in g["processes"]:
            mig = mig_of.get(p.get("mig"))
            procs.append(
                [
                    str(g["index"]) if mig is None else f"{g['index']}/{mig}",
                    str(p["pid"]),
                    visible(p["user"] or "?"),
                    visible(p["container"] or ""),
                    format_bytes_short(p["memory"]),
                    na(p["sm_utilization"], "%"),
                    format_duration(p["elapsed"]),
                    _STATE_SHORT[p["state"]],
                    visible(p["command"] or "?"),
                ]
            )  # another user's command line
    if procs:
        out += ["", ink("Processes", "italic")]
        out += _table(
            _PROC_COLS,
            procs,
            _PROC_RIGHT,
            width,
            ink,
            gap=1,
            most=_PROC_MAX,
            clip_last=True,  # the fixed columns' widest: the command keeps room
            style=lambda i, v: "red" if i == 7 and v != "running" else None,
        )
    else:
        out += ["", ink("No GPU processes" + (" match" if matching else ""), "dim")]
    relevant = [lk for lk in doc["leaks"] if lk["kind"] != "monitor"]  # GPUs: filtered
    if relevant:
        out.append("")
        out += [
            ink(x, "bold")
            for x in _wrapped(
                "Leaks (see `gpuwarden leaks`, reclaim with `gpuwarden reap`):", width, "", ""
            )
        ]
        for lk in relevant:
            where = "-" if lk["gpu"] is None else str(lk["gpu"])
            out += [
                ink(x, "red")
                for x in _wrapped(
                    f"GPU {where} {lk['kind']} {format_bytes(lk['memory'])}: "
                    f"{visible(lk['evidence'])}",
                    width,
                    "  ",
                    "    ",
                )
            ]
    for warning in doc["warnings"]:
        out += [ink(x, "yellow") for x in _wrapped(f"warning: {visible(warning)}", width, "", "  ")]
    return out


def drain_lines(drains: list[dict[str, Any]]) -> list[str]:
    """``GPU 1 drained by root (ECC errors)``: one line per drained GPU (status, ps)."""
    return [
        f"GPU {d['gpu']} drained by {visible(d['by'])}"
        + (f" ({visible(d['reason'])})" if d.get("reason") else "")
        + ": no new placement there"
        for d in drains
    ]


def leak_lines(found: list[dict[str, Any]], width: int = 80, ink: Ink | None = None) -> list[str]:
    """``gpuwarden leaks``'s report of ``leaks --json``'s leaks."""
    from gpuwarden.units import format_bytes

    ink = ink or Ink(False)
    real = [lk for lk in found if lk["kind"] != "monitor"]
    out = (
        []
        if real
        else [ink("No leaks", "green") + ": every byte in use belongs to a live process."]
    )
    for lk in found:
        where = "-" if lk["gpu"] is None else str(lk["gpu"])
        pid = "" if lk["pid"] is None else f" pid {lk['pid']}"
        mem = "" if lk["memory"] is None else f" {format_bytes(lk['memory'])}"
        out.append(
            ink(f"GPU {where} {lk['kind']}{pid}", "dim" if lk["kind"] == "monitor" else "bold red")
            + mem
        )
        out += _wrapped(visible(lk["evidence"]), width, "  ", "  ")
    if real:
        out += [
            "",
            *_wrapped(
                "Reclaim with `gpuwarden reap` (a dry run), then `gpuwarden reap --yes`.",
                width,
                "",
                "",
            ),
        ]
    return out


def emit(lines: list[str]) -> None:
    """Write a screen's lines to stdout."""
    import sys

    sys.stdout.write("".join(line + "\n" for line in lines))
