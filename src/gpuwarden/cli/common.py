"""Helpers shared by the verbs: parse common options, write CSV, warn. What needs no
click (the backend, JSON, GPU indices) is in ``cli/plain.py``, the glance at the daemon
in ``client/glance.py``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

from gpuwarden.errors import UsageError
from gpuwarden.units import parse_duration, parse_size


def emit_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``--format csv``: a header row of stable column names (the JSON keys, in the
    JSON's units), then the rows; lists space-separated, None empty, booleans as
    true/false, as scripts that read ``nvidia-smi --format=csv`` expect."""
    import csv

    def cell(v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return " ".join(str(x) for x in v)
        return v

    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(columns)
    w.writerows([cell(v) for v in r] for r in rows)


def watch_header(verb: str, interval: float) -> str:
    """The first line of a ``--watch`` screen: what refreshes, how often, and when this
    screen was taken (as watch(1) shows it)."""
    from datetime import datetime

    return f"gpuwarden {verb} · every {interval:g}s · {datetime.now():%Y-%m-%d %H:%M:%S}"


def warn(message: str) -> None:
    click.echo(f"gpuwarden: warning: {message}", err=True)


class SizeType(click.ParamType):  # type: ignore[type-arg]
    """A size option (14G, 512MiB); errors become one clear line."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            n = parse_size(value)
        except UsageError as e:
            self.fail(str(e), param, ctx)
        if n <= 0:
            self.fail(f"size must be positive, got {value!r}", param, ctx)
        return n


class DurationType(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(value)
        except UsageError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeType()
DURATION = DurationType()


def format_option(help: str | None = None) -> Callable[[Any], Any]:
    """``--format table|csv|json`` (the ``fmt`` parameter), as ``ps``, ``status`` and
    ``report`` take it; ``help`` says what a CSV row is."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "csv", "json"]),
        default="table",
        show_default=True,
        help=help,
    )


def watch_option(help: str) -> Callable[[Any], Any]:
    """``--watch [INTERVAL]`` (the ``watch`` parameter, None without it; 2 s when given
    alone), as ``ps`` and ``status`` take it."""
    return click.option(
        "--watch",
        "watch",
        type=DURATION,
        is_flag=False,
        flag_value=2.0,
        default=None,
        metavar="[INTERVAL]",
        help=help,
    )
