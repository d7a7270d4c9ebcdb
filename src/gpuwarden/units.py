"""Sizes, fractions and durations: parsed in one place, bytes and seconds inside."""

from __future__ import annotations

import math
import re

from gpuwarden.errors import UsageError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

# Decimal-looking suffixes (G, GB) mean binary units too: that is what nvidia-smi,
# PyTorch and every GPU user mean by "14G".
_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KiB,
    "kib": KiB,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "t": TiB,
    "tb": TiB,
    "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_FRACTION_RE = re.compile(r"^\s*(\d*\.\d+)\s*$")


def parse_size(
    text: str | int | float, *, total: int | None = None, bare_bytes: bool = False
) -> int:
    """Parse ``14G``, ``512MiB``, ``4096B`` or, when ``total`` is given, a fraction such as
    ``0.5`` of it. Returns bytes; raises UsageError on bad input. A number without a unit
    is an error (``--mem 20`` meant 20G, not 20 bytes) unless ``bare_bytes``: for values
    a program wrote (environment variables), never for what people type. An int is bytes."""
    if isinstance(text, bool):
        raise UsageError(f"invalid size {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"invalid size {text}: must not be negative")
        return text
    if isinstance(text, float):
        text = repr(text)
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(
            f"invalid size {text!r}: use a number with a unit such as 14G, 512MiB or 0.5"
        )
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _UNITS:
        raise UsageError(f"invalid size {text!r}: unknown unit {m.group(2)!r} (use K, M, G, T)")
    if unit == "" and "." in m.group(1):
        if total is None:
            raise UsageError(f"invalid size {text!r}: a fraction needs a known total")
        if not 0 < number <= 1:
            raise UsageError(f"invalid size {text!r}: a fraction must be in (0, 1]")
        return int(total * number)
    if m.group(2) == "" and not bare_bytes:
        n = m.group(1)
        whole = " or 1.0 for all of it" if total is not None else ""
        raise UsageError(
            f"invalid size {text.strip()!r}: give a unit, e.g. {n}G or {n}MiB "
            f"({n}B for bytes{whole})"
        )
    value = number * _UNITS[unit]
    if not math.isfinite(value):
        raise UsageError(f"invalid size {text!r}")
    return int(value)


def parse_size_or_fraction(text: str) -> tuple[int | None, float | None]:
    """A memory request as people give it: (bytes, None) for a size such as ``20G``,
    (None, fraction) for a share of a GPU such as ``0.5``. Zero is refused."""
    if _FRACTION_RE.match(text):
        parse_size(text, total=1 << 40)  # validates the range (0, 1]
        return None, float(text)
    n = parse_size(text)
    if n <= 0:
        raise UsageError(f"invalid size {text!r}: must be positive")
    return n, None


def format_bytes(n: int | None) -> str:
    """Render bytes for people: MiB below 10 GiB, GiB above (as nvidia-smi users expect)."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < MiB:
        return f"{sign}{n / KiB:.0f}KiB" if n >= KiB else f"{sign}{n}B"
    if n < 10 * GiB:
        return f"{sign}{n / MiB:.0f}MiB"
    return f"{sign}{n / GiB:.1f}GiB"


def format_bytes_short(n: int | None) -> str:
    """Narrow form for tables: 130M, 9.5G, 80G."""
    if n is None:
        return "n/a"
    if n < GiB:
        return f"{n / MiB:.0f}M"
    g = n / GiB
    return f"{g:.1f}G" if g < 100 else f"{g:.0f}G"


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Longer than any wait makes sense; past it, sleeps and deadlines overflow the platform's
# time_t instead of failing in one line.
MAX_DURATION = 100 * 365 * 86400.0


def parse_duration(text: str | float | int) -> float:
    """Parse ``90``, ``1.5s``, ``10m``, ``2h30m`` or ``500ms`` into seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"invalid duration {text}: must not be negative")
        return _bounded(float(text), text)
    s = str(text).strip()
    pos, total, matched = 0, 0.0, False
    while pos < len(s):
        m = _DURATION_RE.match(s, pos)
        if not m or m.end() == pos:
            raise UsageError(f"invalid duration {text!r}: use e.g. 30s, 10m, 2h30m")
        total += float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
        pos, matched = m.end(), True
    if not matched:
        raise UsageError(f"invalid duration {text!r}: use e.g. 30s, 10m, 2h30m")
    return _bounded(total, text)


def _bounded(seconds: float, text: object) -> float:
    if not math.isfinite(seconds):
        raise UsageError(f"invalid duration {text!r}: it must be finite")
    if seconds > MAX_DURATION:
        raise UsageError(f"invalid duration {text!r}: longer than 100 years")
    return seconds


def bounded_duration(
    raw: object,
    label: str,
    *,
    positive: bool = False,
    most: float = MAX_DURATION,
    example: str = "30s",
) -> float:
    """A duration someone supplied (a TOML or JSON number of seconds, or text like 30s)
    as seconds from 0 (above 0 when ``positive``) to ``most``, or one UsageError line
    naming ``label``. Every setting, flag and request field that takes a duration comes
    through here, so all refuse alike."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise UsageError(f"{label} must be a duration like {example} or a number of seconds")
    try:
        value = parse_duration(raw)
    except UsageError as e:
        raise UsageError(f"{label}: {e}") from None
    if positive and value <= 0:
        raise UsageError(f"{label} must be positive")
    if value > most:
        raise UsageError(f"{label} must be at most {format_duration(most)}")
    return value


def bounded_size(
    raw: object,
    label: str,
    *,
    positive: bool = False,
    most: int | None = None,
    example: str = "512MiB",
) -> int:
    """A size someone supplied (a number of bytes, or text like 14G) as bytes from 0
    (above 0 when ``positive``) to ``most``, or one UsageError line naming ``label``:
    the size counterpart of ``bounded_duration``."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise UsageError(f"{label} must be a size like {example} or a number of bytes")
    try:
        value = parse_size(raw)
    except UsageError as e:
        raise UsageError(f"{label}: {e}") from None
    if value < 0 or (positive and value == 0):
        raise UsageError(f"{label} must be positive")
    if most is not None and value > most:
        raise UsageError(f"{label} must be at most {format_bytes(most)}")
    return value


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9402`` for IPv6, ``:9402`` for every address)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"invalid listen address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9402"
        )
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def format_duration(seconds: float | None) -> str:
    """Render an elapsed time compactly: 45s, 12m03s, 3h05m, 2d04h."""
    if seconds is None:
        return "n/a"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
