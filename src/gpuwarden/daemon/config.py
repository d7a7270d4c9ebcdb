"""The daemon's config file (TOML): admin groups, headroom settings, loop interval.

    admin_groups = ["gpuadmin"]
    spike_buffer = 0.1      # foreign processes count at their peak x (1 + this)
    reserve = "512MiB"      # per GPU, never given to jobs
    interval = "500ms"      # scheduling pass period (passes also run on every change)
    grace = "10s"           # SIGTERM -> SIGKILL when a job is cancelled
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpuwarden.daemon.service import Config
from gpuwarden.errors import UsageError
from gpuwarden.units import parse_duration, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]


def read_config(path: Path) -> Config:
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return Config()
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"cannot read the config file {path}: {e}") from None
    unknown = sorted(set(raw) - {"admin_groups", "spike_buffer", "reserve", "interval",
                                 "grace"})
    if unknown:
        raise UsageError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    groups = raw.get("admin_groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise UsageError(f"{path}: admin_groups must be a list of group names")
    spike = raw.get("spike_buffer", 0.1)
    if isinstance(spike, bool) or not isinstance(spike, (int, float)) or not 0 <= spike <= 10:
        raise UsageError(f"{path}: spike_buffer must be a number from 0 to 10")
    return Config(
        admin_groups=tuple(groups),
        spike_buffer=float(spike),
        reserve=parse_size(raw.get("reserve", 512 << 20)),
        interval=max(parse_duration(raw.get("interval", 0.5)), 0.05),
        grace=parse_duration(raw.get("grace", 10.0)),
    )
