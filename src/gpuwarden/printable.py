"""What gpuwarden prints for people: user-supplied text (a job's name, group, key,
command, reason, event details; a process's command line) with its control characters
made visible, so that a job named ``ESC[2J`` or ``ESC]52;...BEL`` cannot clear, retitle or
write the clipboard of another user's terminal through ``ps``, ``show`` or ``top``. JSON
output is not passed through here: it stays exact."""

from __future__ import annotations

import re

TYPE_CHECKING = False  # the served views import this: no typing at run time
if TYPE_CHECKING:
    from typing import Any

# C0 controls (tab, CR and newline included: they break a table as surely as ESC),
# DEL, C1 controls (0x9b is a one-byte CSI), the Unicode line/paragraph separators and
# the bidirectional overrides and isolates that reorder what follows them; and bytes that
# are not UTF-8 (an argv or environment value may hold any), which Python carries as
# the surrogates U+DC80-U+DCFF (surrogateescape) and no terminal can print.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\udc80-\udcff]")


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if "\udc80" <= c <= "\udcff":
        return f"\\x{ord(c) - 0xDC00:02x}"  # the byte it stands for: \xff
    return ascii(c)[1:-1]  # '\x1b' -> \x1b, '\r' -> \r, '\u202e' -> \u202e


def visible(text: Any) -> str:
    """``text`` as a str, each control character written as its escape (``\\x1b``)."""
    s = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_escape, s)


def width(text: str) -> int:
    """Columns ``text`` takes on a terminal: East Asian wide and fullwidth characters
    two, combining marks and zero-width characters none, the rest one. ``len`` counts
    code points, so a table of CJK names or emoji would not line up."""
    if text.isascii():
        return len(text)
    import unicodedata

    n = 0
    for c in text:
        if unicodedata.combining(c) or c in "\u200b\u200c\u200d\ufeff":
            continue
        n += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return n


def pad(text: str, columns: int) -> str:
    """``text`` padded with spaces to ``columns`` terminal columns (``str.ljust`` by
    display width)."""
    return text + " " * max(columns - width(text), 0)


def clip(text: str, columns: int) -> str:
    """``text`` cut to at most ``columns`` terminal columns, ending in "…" when cut."""
    return clipped(text, columns)[0]


def clipped(text: str, columns: int) -> tuple[str, int]:
    """``clip(text, columns)`` and the columns it takes, in one pass (a table sizes
    thousands of cells; ASCII, nearly all of them, goes by ``len`` and a slice)."""
    if text.isascii():
        if len(text) <= columns:
            return text, len(text)
        return text[: max(columns - 1, 0)] + "…", max(columns, 1)
    n = width(text)
    if n <= columns:
        return text, n
    out, used = [], 0
    for c in text:
        w = width(c)
        if used + w > columns - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…", used + 1
