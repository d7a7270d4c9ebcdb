"""Scan /proc/*/fd for open NVIDIA device files — what ``fuser -v /dev/nvidia*`` does,
in-process and without a subprocess, so it is fast enough to run on every snapshot."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RawHolder:
    pid: int
    devices: tuple[str, ...]


def scan_holders(
    device_files: Mapping[str, int | None],
    *,
    proc: str = "/proc",
    exclude: Iterable[int] = (),
    only: Iterable[int] | None = None,
    listing: Sequence[str] | None = None,
) -> list[RawHolder]:
    """Every process (of ``only``, when given) with one of ``device_files`` open.
    ``listing``: the entries of ``proc`` when the caller has just listed it. Processes
    that vanish or deny access mid-scan are skipped (their fds cannot be read without
    root anyway)."""
    if not device_files:
        return []
    wanted = set(device_files)
    # One common directory prefix lets most fds be rejected with a cheap startswith.
    prefix = os.path.commonpath([os.path.dirname(p) for p in wanted]) + "/"
    skip = {str(p) for p in exclude}
    readlink = os.readlink
    out: list[RawHolder] = []
    try:
        entries = (
            (listing if listing is not None else os.listdir(proc))
            if only is None
            else [str(p) for p in sorted(set(only))]
        )
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or name in skip:
            continue
        # Open the fd directory once and resolve links relative to it: one path lookup
        # per process instead of one per descriptor.
        try:
            dir_fd = os.open(f"{proc}/{name}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        found: set[str] = set()
        try:
            for fd in os.listdir(dir_fd):
                try:
                    target = readlink(fd, dir_fd=dir_fd)
                except OSError:
                    continue
                if target.startswith(prefix) and target in wanted:
                    found.add(target)
        except OSError:
            pass  # the process exited mid-scan
        finally:
            os.close(dir_fd)
        if found:
            out.append(RawHolder(pid=int(name), devices=tuple(sorted(found))))
    return out
