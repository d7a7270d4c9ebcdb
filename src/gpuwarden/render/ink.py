"""Styled lines for a terminal, without rich: SGR codes when the output is a colour
terminal, plain text when piped. For the views people run in ``watch -n 1`` (``status``,
``leaks``), where importing rich costs more than drawing the whole screen; the rules for
colour and width are rich's, so these views look as the rest of the CLI does."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # importing typing costs a served status ~3 ms
if TYPE_CHECKING:
    from typing import IO

_SGR = {"bold": "1", "dim": "2", "italic": "3", "red": "31", "green": "32", "yellow": "33"}


def wants_colour(stream: IO[str]) -> bool:
    """As rich decides: ``NO_COLOR`` set turns colour off, ``FORCE_COLOR`` on, a dumb
    terminal off; otherwise colour exactly when ``stream`` is a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM", "").lower() in ("dumb", "unknown"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _size(stream: IO[str], env: str, axis: int, default: int) -> int:
    """``env`` when it holds a positive number, else the terminal's, else ``default``."""
    value = os.environ.get(env, "")
    if value.isascii() and value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return os.get_terminal_size(stream.fileno())[axis] or default
    except (AttributeError, ValueError, OSError):
        return default


def columns(stream: IO[str]) -> int:
    """The width to draw for, as rich takes it: ``COLUMNS``, else the terminal's, else 80."""
    return _size(stream, "COLUMNS", 0, 80)


def rows(stream: IO[str]) -> int:
    """The terminal's height: ``LINES``, else the terminal's, else 25."""
    return _size(stream, "LINES", 1, 25)


class Ink:
    """``ink(text, "bold red")``: ``text`` in that style, or as it is without colour.
    Styles are applied to text already sized (``printable.width`` counts no codes)."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, style: str | None = None) -> str:
        if not self.colour or not style or not text:
            return text
        return f"\x1b[{';'.join(_SGR[s] for s in style.split())}m{text}\x1b[0m"


def for_stream(stream: IO[str]) -> tuple[Ink, int]:
    """The ink and width to draw ``stream``'s screen with."""
    return Ink(wants_colour(stream)), columns(stream)
