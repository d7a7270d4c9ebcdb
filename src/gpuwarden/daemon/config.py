"""The daemon's settings (``Config``) and the config file (TOML) they are read from: admin
groups, headroom settings, loop interval.

    admin_groups = ["gpuadmin"]
    spike_buffer = 0.1      # foreign processes count at their peak x (1 + this)
    reserve = "512MiB"      # per GPU, never given to jobs (the driver's own memory)
    context_memory = "auto" # CUDA context booked beside each job's budget on a GPU:
                            # "auto" measures it per GPU model, or a size such as "600MiB"
    interval = "500ms"      # scheduling pass period (passes also run on every change)
    grace = "10s"           # SIGTERM -> SIGKILL when a job is cancelled or preempted
    max_grace = "5m"        # the longest --grace a job may ask for (and at least grace)
    aging = "1h"            # waiting this long raises a job's priority by one ("0": off)
    fairshare_halflife = "7d"  # at equal priority and QoS, users who used less go first;
                            # a use weighs half after this long (off by default, "0")
    backfill = true         # later jobs may start if they cannot delay the first waiting one
    starve_after = "15m"    # until the first waiting job has waited this long, jobs that
                            # fit start before it when its start is unknown ("0": never)
    preemption = true       # higher class/priority jobs may stop cheaper running ones
    oom_retries = 1         # CUDA-OOM retries of a job with --mem that gives no --retries
    retry_backoff = "10s"   # before an OOM retry at the same budget; doubles each time
    release_timeout = "10s" # an ended job's memory not back by then is a leak
    metrics_listen = "127.0.0.1:9402"  # serve Prometheus metrics there (off by default)
    metrics_cache = "1s"    # scrapes this close together share one snapshot
    history_interval = "10s"   # memory samples for the web page ("0": none kept)
    history_retention = "48h"  # samples older than this are dropped
    web_listen = "0.0.0.0:9403"  # the read-only web page for anyone (off by default;
                                 # `gpuwarden web` serves it to you alone without this)
    max_connections_per_user = 64  # open connections of one user on the daemon's socket;
                                   # past it a new one is closed at once
    max_connections_tcp = 256      # open connections on web_listen, and on metrics_listen
    request_timeout = "5s"  # a new connection's first request head, and each request
                            # body, must arrive within this
    idle_timeout = "30s"    # a connection waiting this long for (the head of) its next
                            # request is closed

    [limits]                # every user (each key optional)
    max_gpus = 4
    max_memory = "160G"     # reserved, summed over the user's GPUs
    max_running = 8
    max_priority = 0        # the highest --priority a user may ask for (admins: any)
    qos = ["burstable", "besteffort"]  # the classes a user may ask for (admins: all)

    [limits.users.alice]    # one user, instead of the defaults above
    max_gpus = 8

    [notify]
    webhook = "https://chat.example/hooks/gpu"  # every job's end POSTed there (its JSON,
                                                # no environment; 3 tries, 10 s each)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.daemon.usercmd import checked_url
from gpuwarden.errors import UsageError
from gpuwarden.jobs.request import QOS_CLASSES
from gpuwarden.sched.limits import Limits, UserLimits
from gpuwarden.sched.queue import Policy
from gpuwarden.units import bounded_duration, bounded_size, parse_listen, parse_size

if TYPE_CHECKING:
    from gpuwarden.client.paths import Paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]


@dataclass(frozen=True)
class Config:
    """Daemon settings: the config file's, read by ``read_config``; the defaults without
    one."""

    admin_groups: tuple[str, ...] = ()
    spike_buffer: float = 0.1
    reserve: int = 512 << 20
    interval: float = 0.5
    grace: float = 10.0
    max_grace: float = 300.0  # the longest --grace a job may ask for
    policy: Policy = field(default_factory=lambda: Policy(aging=3600.0))
    retry_backoff: float = 10.0  # seconds before a same-budget OOM retry; doubles each time
    oom_retries: int = 1  # OOM retries of a job with a budget that does not say (--retries)
    context_memory: int | None = None  # CUDA context per job and GPU; None: measured
    release_timeout: float = 10.0  # seconds an ended job's memory may take to come back
    metrics_listen: str | None = None  # HOST:PORT for /metrics; None: not served
    metrics_cache: float = 1.0  # seconds one snapshot serves scrapes
    history_interval: float = 10.0  # seconds between memory samples kept for the web page
    history_retention: float = 48 * 3600.0  # samples older than this are dropped
    web_listen: str | None = None  # HOST:PORT for the read-only web page; None: not served
    max_connections_per_user: int = 64  # open connections of one uid on the unix socket
    max_connections_tcp: int = 256  # open connections on web_listen, on metrics_listen
    request_timeout: float = 5.0  # seconds a connection's first head, and a body, may take
    idle_timeout: float = 30.0  # seconds a connection may wait for its next request
    webhook: str | None = None  # [notify] webhook: every job's end POSTed there as JSON

    def grace_of(self, asked: float | None) -> float:
        """A job's grace (SIGTERM -> SIGKILL): its --grace, else ``grace``; never past
        ``max_grace``, for jobs stored before a lower cap too."""
        return min(self.grace if asked is None else asked, self.max_grace)


SETTINGS = (
    "admin_groups",
    "spike_buffer",
    "reserve",
    "context_memory",
    "interval",
    "grace",
    "max_grace",
    "aging",
    "fairshare_halflife",
    "backfill",
    "starve_after",
    "preemption",
    "oom_retries",
    "retry_backoff",
    "release_timeout",
    "metrics_listen",
    "metrics_cache",
    "history_interval",
    "history_retention",
    "web_listen",
    "max_connections_per_user",
    "max_connections_tcp",
    "request_timeout",
    "idle_timeout",
    "limits",
    "notify",
)
"""Every top-level setting the loader knows (deploy/config.toml shows each)."""
LIMIT_SETTINGS = ("max_gpus", "max_memory", "max_running", "max_priority", "qos")
"""The settings of ``[limits]`` and of each ``[limits.users.NAME]``."""


def _load(path: Path) -> dict[str, Any] | None:
    """The file's TOML as a table; None when there is no file (the defaults apply)."""
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
        return raw
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise UsageError(
            f"cannot read the config file {path}: it is not UTF-8 text (TOML)"
        ) from None
    except OSError as e:
        raise UsageError(f"cannot read the config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"cannot read the config file {path}: {e}") from None
    except RecursionError:
        raise UsageError(f"cannot read the config file {path}: nested too deeply") from None


def load_config(paths: Paths) -> Config:
    """The daemon's config, checked with everything else a start needs before it binds
    anything (``daemon start`` runs this before it detaches, without importing the
    daemon itself: a client that starts one waits for this)."""
    paths.check_socket()
    return read_config(paths.config)


def read_config(path: Path) -> Config:
    raw = _load(path)
    return Config() if raw is None else _parse(path, raw)


def check_config(path: Path) -> list[str]:
    """Every problem of the config file, one line each (``gpuwarden config check``): each
    setting is checked alone, then together (grace against max_grace). A missing file is
    a problem here: the daemon would run on the defaults without a word."""
    try:
        raw = _load(path)
    except UsageError as e:
        return [str(e)]
    if raw is None:
        return [f"{path}: no such file"]
    problems = [f"{path}: unknown setting {k}" for k in sorted(set(raw) - set(SETTINGS))]
    for key in SETTINGS:
        if key in raw:
            try:
                _parse(path, {key: raw[key]})
            except UsageError as e:
                problems.append(str(e))
    if not problems:
        try:
            _parse(path, raw)
        except UsageError as e:
            problems.append(str(e))
    return problems


def _parse(path: Path, raw: dict[str, Any]) -> Config:
    unknown = sorted(set(raw) - set(SETTINGS))
    if unknown:
        raise UsageError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    groups = raw.get("admin_groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise UsageError(f"{path}: admin_groups must be a list of group names")
    spike = raw.get("spike_buffer", 0.1)
    if isinstance(spike, bool) or not isinstance(spike, (int, float)) or not 0 <= spike <= 10:
        raise UsageError(f"{path}: spike_buffer must be a number from 0 to 10")
    for flag in ("backfill", "preemption"):
        if not isinstance(raw.get(flag, True), bool):
            raise UsageError(f"{path}: {flag} must be true or false")
    oom_retries = raw.get("oom_retries", 1)
    if (
        isinstance(oom_retries, bool)
        or not isinstance(oom_retries, int)
        or not 0 <= oom_retries <= 100
    ):
        raise UsageError(f"{path}: oom_retries must be a whole number from 0 to 100")
    policy = Policy(
        aging=_duration(path, raw, "aging", 3600.0, YEAR),
        fairshare_halflife=_duration(path, raw, "fairshare_halflife", 0.0, YEAR),
        backfill=raw.get("backfill", True),
        preemption=raw.get("preemption", True),
        limits=_limits(path, raw.get("limits", {})),
        starve_after=_starve_after(path, raw.get("starve_after", "15m")),
    )
    grace = _duration(path, raw, "grace", 10.0, DAY)
    max_grace = _duration(path, raw, "max_grace", 300.0, DAY)
    if grace > max_grace:
        raise UsageError(f"{path}: grace must be at most max_grace ({max_grace:g}s)")
    return Config(
        policy=policy,
        retry_backoff=_duration(path, raw, "retry_backoff", 10.0, DAY),
        oom_retries=oom_retries,
        release_timeout=_duration(path, raw, "release_timeout", 10.0, DAY),
        metrics_listen=_listen(path, raw.get("metrics_listen"), "metrics_listen"),
        web_listen=_listen(path, raw.get("web_listen"), "web_listen"),
        history_interval=_duration(path, raw, "history_interval", 10.0, DAY),
        history_retention=max(_duration(path, raw, "history_retention", 48 * 3600.0, YEAR), 60.0),
        metrics_cache=_duration(path, raw, "metrics_cache", 1.0, HOUR),
        admin_groups=tuple(groups),
        spike_buffer=float(spike),
        reserve=_size(path, raw, "reserve", 512 << 20, 1 << 40),
        context_memory=_context_memory(path, raw.get("context_memory", "auto")),
        interval=max(_duration(path, raw, "interval", 0.5, HOUR), 0.05),
        grace=grace,
        max_grace=max_grace,
        max_connections_per_user=_count(path, raw, "max_connections_per_user", 64),
        max_connections_tcp=_count(path, raw, "max_connections_tcp", 256),
        request_timeout=max(_duration(path, raw, "request_timeout", 5.0, HOUR), 0.1),
        idle_timeout=max(_duration(path, raw, "idle_timeout", 30.0, DAY), 0.1),
        webhook=_webhook(path, raw.get("notify", {})),
    )


HOUR = 3600.0
DAY = 24 * HOUR
YEAR = 365 * DAY


def _duration(path: Path, raw: dict[str, Any], name: str, default: float, most: float) -> float:
    """Setting ``name``: a duration from 0 to ``most`` seconds, or one line saying not."""
    return bounded_duration(raw.get(name, default), f"{path}: {name}", most=most, example="10s")


def _count(path: Path, raw: dict[str, Any], name: str, default: int) -> int:
    """Setting ``name``: a whole number from 1 to 100000, or one line saying not."""
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise UsageError(f"{path}: {name} must be a whole number from 1 to 100000")
    return value


def _size(path: Path, raw: dict[str, Any], name: str, default: int, most: int) -> int:
    """Setting ``name``: a size from 0 to ``most`` bytes, or one line saying not."""
    return bounded_size(raw.get(name, default), f"{path}: {name}", most=most)


def _context_memory(path: Path, raw: Any) -> int | None:
    """None for "auto" (measured per GPU model, sched/context.py), else bytes."""
    if raw == "auto":
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise UsageError(f'{path}: context_memory must be "auto" or a size like 600MiB')
    return bounded_size(raw, f"{path}: context_memory", most=16 << 30)


def _starve_after(path: Path, raw: Any) -> float:
    return bounded_duration(raw, f"{path}: starve_after", example="15m")


def _user_limits(path: Path, where: str, raw: Any) -> UserLimits:
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: {where} must be a table")
    unknown = sorted(set(raw) - set(LIMIT_SETTINGS))
    if unknown:
        raise UsageError(f"{path}: {where}: unknown setting(s) {', '.join(unknown)}")
    out: dict[str, int | None] = {}
    for name in ("max_gpus", "max_running"):
        v = raw.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UsageError(f"{path}: {where}.{name} must be a whole number ≥ 0")
        out[name] = v
    mem = raw.get("max_memory")
    if mem is not None:
        if isinstance(mem, bool) or not isinstance(mem, (int, str)):
            raise UsageError(f"{path}: {where}.max_memory must be a size like 160G")
        try:
            mem = parse_size(mem)
        except UsageError as e:
            raise UsageError(f"{path}: {where}.max_memory: {e}") from None
    prio = raw.get("max_priority", UserLimits.max_priority)
    if isinstance(prio, bool) or not isinstance(prio, int) or not -1000 <= prio <= 1000:
        raise UsageError(f"{path}: {where}.max_priority must be a whole number from -1000 to 1000")
    qos = raw.get("qos", list(UserLimits.qos))
    if not isinstance(qos, list) or not all(q in QOS_CLASSES for q in qos):
        raise UsageError(f"{path}: {where}.qos must be a list of {', '.join(QOS_CLASSES)}")
    return UserLimits(
        max_gpus=out["max_gpus"],
        max_running=out["max_running"],
        max_memory=mem,
        max_priority=prio,
        qos=tuple(qos),
    )


def _limits(path: Path, raw: Any) -> Limits:
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: limits must be a table")
    users_raw = raw.get("users", {})
    if not isinstance(users_raw, dict):
        raise UsageError(f"{path}: limits.users must be a table of users")
    default = _user_limits(path, "limits", {k: v for k, v in raw.items() if k != "users"})
    users = {name: _user_limits(path, f"limits.users.{name}", v) for name, v in users_raw.items()}
    return Limits(default=default, users=users)


def _webhook(path: Path, raw: Any) -> str | None:
    """``[notify] webhook``: where every job's end is POSTed; None: nowhere."""
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: notify must be a table ([notify] webhook = URL)")
    unknown = sorted(set(raw) - {"webhook"})
    if unknown:
        raise UsageError(f"{path}: notify: unknown setting(s) {', '.join(unknown)}")
    url = raw.get("webhook")
    return None if url is None else checked_url(url, f"{path}: notify.webhook")


def _listen(path: Path, raw: Any, name: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise UsageError(f"{path}: {name} must be HOST:PORT")
    try:
        parse_listen(raw)
    except UsageError as e:
        raise UsageError(f"{path}: {name}: {e}") from None
    return raw
