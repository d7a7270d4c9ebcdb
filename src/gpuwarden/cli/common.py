"""Helpers shared by the verbs: open the backend, write JSON, parse common options."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.errors import UsageError
from gpuwarden.units import parse_duration, parse_size

if TYPE_CHECKING:
    from gpuwarden.gpus.backend import Backend


@contextmanager
def backend() -> Iterator[Backend]:
    from gpuwarden.gpus.backend import open_backend

    b = open_backend()
    try:
        yield b
    finally:
        b.close()


def emit_json(data: Any) -> None:
    """Indented for a terminal; compact (and several times faster, through the C
    encoder) when piped to a program."""
    if sys.stdout.isatty():
        sys.stdout.write(json.dumps(data, indent=2, default=str))
    else:
        sys.stdout.write(json.dumps(data, separators=(",", ":"), default=str))
    sys.stdout.write("\n")


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


DAEMON_GLANCE = 1.0  # seconds a view waits for the daemon's answer before doing without


def _glance(path: str) -> Any:
    """The daemon's answer to GET ``path`` when one answers at once; None when none does
    (no socket: the HTTP client is not even imported, a standalone view's start-up).
    Never starts a daemon, never fails a view."""
    from gpuwarden.client.paths import resolve_paths
    from gpuwarden.errors import GpuwardenError

    try:
        sock = resolve_paths().socket
        if not sock.exists():
            return None
        from gpuwarden.client.api import Client

        return Client(str(sock), timeout=DAEMON_GLANCE).request("GET", path)
    except (GpuwardenError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def daemon_job_pids() -> dict[int, int] | None:
    """pid -> job id of the running jobs, from the daemon (one request); None when none
    answers."""
    answer = _glance("/v1/job-pids")
    try:
        return {int(pid): int(job) for pid, job in answer["pids"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def daemon_drains() -> list[dict[str, Any]]:
    """The GPUs an admin drained (``gpu drain``), from the daemon; none when none answers."""
    answer = _glance("/v1/drains")
    try:
        return [dict(d) for d in answer["drains"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


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

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(value)
        except UsageError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeType()
DURATION = DurationType()


def check_gpu_indices(requested: tuple[int, ...] | list[int], available: list[int]) -> None:
    unknown = [i for i in requested if i not in available]
    if unknown:
        have = ", ".join(str(i) for i in available) or "none"
        raise UsageError(f"no GPU with index {', '.join(map(str, unknown))} (GPUs here: {have})")
