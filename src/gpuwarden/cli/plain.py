"""What the CLI's verbs share that needs no click: the backend, JSON out, GPU indices,
the root check of the settings commands. A one-shot ``status``
that no daemon answered (``cli/statusonce.py``) runs on these without importing click,
which costs more than the rest of its start."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from gpuwarden.gpus.backend import Backend
    from gpuwarden.gpus.sim import SimBackend


FD_TABLES_FILE = "fd-tables.json"


@contextmanager
def backend() -> Iterator[Backend]:
    """The machine's backend for one command. Its device-file scans reuse the fd tables
    this user's last command left (``procs/holders.fd_tables_from``): ``watch -n 1
    gpuwarden status`` on a machine of thousands of processes reads only the fd tables
    that changed."""
    from gpuwarden.client.paths import user_cache_dir
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.procs.holders import fd_tables_from

    def where() -> Path | None:  # asked at the first scan: other commands make no folder
        cache = user_cache_dir()
        return None if cache is None else cache / FD_TABLES_FILE

    with fd_tables_from(where):
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


def check_gpu_indices(requested: tuple[int, ...] | list[int], available: list[int]) -> None:
    unknown = [i for i in requested if i not in available]
    if unknown:
        have = ", ".join(str(i) for i in available) or "none"
        raise UsageError(f"no GPU with index {', '.join(map(str, unknown))} (GPUs here: {have})")


def simulated() -> bool:
    """Same rule as open_backend: GPUWARDEN_SIM (also set by --sim) selects the sim."""
    from gpuwarden.gpus.backend import simulated as chosen

    return chosen()


def require_root(action: str) -> None:
    """Refuse a change of the machine's settings to anyone but root, before anything is
    opened (the simulated backend's settings are its own: no root needed)."""
    import os

    from gpuwarden.errors import PermissionDenied

    if simulated():
        return
    if os.geteuid() != 0:
        raise PermissionDenied(
            f"{action} needs root: run it with sudo (without --yes it is a dry run, which does not)"
        )


def simulated_backend(b: Backend) -> SimBackend | None:
    """``b`` if it is the simulated backend."""
    from gpuwarden.gpus.sim import SimBackend

    return b if isinstance(b, SimBackend) else None
