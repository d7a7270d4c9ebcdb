"""The job directory: the files through which the daemon and a job's supervisor speak
(``supervisor/``), and every reader and writer of them. Nothing else writes these files
by hand: the daemon's attached jobs (``daemon/attached.py``) and its recovery
(``daemon/recovery.py``) go through here too.

Files in ``<jobdir>`` (all JSON written atomically; each ``*.json`` but spec.json once):

``spec.json``       by the daemon (``write_spec``), mode 0600 since it holds the job's
                    environment: ``{"job", "argv", "env", "cwd", "uid", "gid", "groups",
                    "cpus", "timeout", "grace", "numactl_prefix"}``. ``env`` is the final
                    environment of the command (``spec_from_plan`` takes it, the CPU set and
                    the numactl prefix from ``gpuwarden.launch.plan_launch``'s LaunchPlan).
``supervisor.json`` by the supervisor when it starts: ``{"job", "pid", "start_time",
                    "start_ticks", "boot_id", "nonce"}``. Created exclusively: one
                    supervisor per job directory, ever.
``child.json``      right after the command started: ``{"pid", "start_time", "started_at",
                    "start_ticks", "warnings"}`` (start_time is the kernel's, for identity;
                    started_at the wall clock, for people).
``exit.json``       once the whole tree is gone: ``{"job", "exit_code", "signal", "reason",
                    "ended_at", "tree_clean", "survivors", "started", "warnings"}``.
                    ``exit_code`` is the command's code, 128+N when signal N killed it,
                    127/126 when it could not be started, null when it never ran or its
                    status is unknown. ``reason``: "exited", "cancelled", "timeout",
                    "command not found: X", "command not executable: ...", ...
``stdout``/``stderr`` the command's output, mode 0600, owned by the job's user.
``supervisor.log``  the supervisor's own diagnostics.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.errors import GpuwardenError

if TYPE_CHECKING:
    from gpuwarden.jobs.model import Job

SPEC, SUPERVISOR, CHILD, EXIT = "spec.json", "supervisor.json", "child.json", "exit.json"
STDOUT, STDERR, LOG = "stdout", "stderr", "supervisor.log"
DEFAULT_GRACE = 10.0


class SupervisorError(GpuwardenError):
    """A supervisor could not be started for a job directory (bad spec, already started,
    did not come up in time)."""


def job_dir(jobs_dir: Path, job: Job) -> Path:
    """Where one attempt of a job keeps its spec, supervisor records and logs. A supervisor
    claims its directory once, so every attempt (retry, requeue) gets a fresh one."""
    return jobs_dir / str(job.id) / f"attempt-{job.attempts}"


@dataclass(frozen=True)
class SupervisorSpec:
    """What the supervisor runs, exactly as the daemon decided it."""

    job: int
    argv: tuple[str, ...]  # the user's command
    env: dict[str, str]  # its complete environment
    cwd: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    cpus: frozenset[int] | None = None  # CPU affinity; None leaves it alone
    timeout: float | None = None  # seconds
    grace: float = DEFAULT_GRACE  # seconds between SIGTERM and SIGKILL
    numactl_prefix: tuple[str, ...] = ()  # e.g. ("/usr/bin/numactl", "--membind=0", "--")

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "cpus": None if self.cpus is None else sorted(self.cpus),
            "timeout": self.timeout,
            "grace": self.grace,
            "numactl_prefix": list(self.numactl_prefix),
        }

    @classmethod
    def from_json(cls, data: Any) -> SupervisorSpec:
        """Parse and check a spec; ``SupervisorError`` says what is wrong."""
        if not isinstance(data, dict):
            raise SupervisorError("spec.json: not a JSON object")

        def need(key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
            if key not in data or (data[key] is None and default is not ...):
                if default is ...:
                    raise SupervisorError(f"spec.json: missing {key!r}")
                return default
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise SupervisorError(f"spec.json: {key!r} has the wrong type")
            return value

        def ints(value: Any, key: str) -> tuple[int, ...]:
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
            ):
                raise SupervisorError(f"spec.json: {key!r} must be a list of ids")
            return tuple(value)

        def strs(value: Any, key: str) -> tuple[str, ...]:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SupervisorError(f"spec.json: {key!r} must be a list of strings")
            return tuple(value)

        argv = strs(need("argv", list), "argv")
        if not argv or not argv[0]:
            raise SupervisorError("spec.json: empty command")
        env = need("env", dict)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SupervisorError("spec.json: 'env' must map strings to strings")
        cwd = need("cwd", str)
        if not os.path.isabs(cwd):
            raise SupervisorError("spec.json: 'cwd' must be an absolute path")
        uid, gid = need("uid", int), need("gid", int)
        if uid < 0 or gid < 0:
            raise SupervisorError("spec.json: negative uid or gid")
        cpus_raw = need("cpus", list, None)
        cpus = None if cpus_raw is None else frozenset(ints(cpus_raw, "cpus"))
        if cpus is not None and not cpus:
            raise SupervisorError("spec.json: 'cpus' is empty (use null for no affinity)")
        timeout = need("timeout", (int, float), None)
        if timeout is not None and timeout <= 0:
            raise SupervisorError("spec.json: 'timeout' must be positive")
        grace = need("grace", (int, float), DEFAULT_GRACE)
        if grace < 0:
            raise SupervisorError("spec.json: 'grace' must not be negative")
        return cls(
            job=need("job", int),
            argv=argv,
            env=dict(env),
            cwd=cwd,
            uid=uid,
            gid=gid,
            groups=ints(need("groups", list, []), "groups"),
            cpus=cpus,
            timeout=None if timeout is None else float(timeout),
            grace=float(grace),
            numactl_prefix=strs(need("numactl_prefix", list, []), "numactl_prefix"),
        )


def write_spec(jobdir: str | os.PathLike[str], spec: SupervisorSpec) -> Path:
    """Write ``<jobdir>/spec.json`` atomically (mode 0600) into a new directory (0700).
    A directory already there belongs to another attempt (a reset state database can
    name one again): it is never reused."""
    d = Path(jobdir)
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        raise SupervisorError(
            f"job directory {d} already exists (left by an earlier job?); refusing to reuse it"
        ) from None
    path = d / SPEC
    write_json(path, spec.to_json(), exclusive=False)
    return path


def load_spec(jobdir: str | os.PathLike[str]) -> SupervisorSpec:
    try:
        text = (Path(jobdir) / SPEC).read_text()
    except OSError as e:
        raise SupervisorError(f"cannot read {Path(jobdir) / SPEC}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SupervisorError(f"spec.json is not valid JSON: {e}") from None
    return SupervisorSpec.from_json(data)


@dataclass(frozen=True)
class SupervisorHandle:
    """Identity of a running supervisor: pid + start time (+ boot id, + start time in
    clock ticks since boot, which unlike the epoch form survives wall-clock steps)."""

    pid: int
    start_time: float
    boot_id: str | None = None
    start_ticks: int | None = None


@dataclass(frozen=True)
class ChildInfo:
    pid: int
    start_time: float  # the kernel's start time: identity, may drift from the wall clock
    start_ticks: int | None = None
    warnings: tuple[str, ...] = ()
    started_at: float | None = None  # wall clock when the command started


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int | None
    signal: int | None
    reason: str
    ended_at: float
    tree_clean: bool
    survivors: tuple[int, ...] = ()
    started: bool = True
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class SupervisorStatus:
    """What the job directory says; a field is None while its file is absent (or not
    readable yet)."""

    supervisor: SupervisorHandle | None
    child: ChildInfo | None
    exit: ExitInfo | None

    @property
    def finished(self) -> bool:
        return self.exit is not None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _strings(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, list) else ()


def read_status(jobdir: str | os.PathLike[str]) -> SupervisorStatus:
    """Parse supervisor.json, child.json and exit.json; tolerant of absent, partial or
    foreign files (each such file reads as None)."""
    d = Path(jobdir)
    sup: SupervisorHandle | None = None
    child: ChildInfo | None = None
    ended: ExitInfo | None = None
    data = read_json(d / SUPERVISOR)
    try:
        if data is not None:
            bid = data.get("boot_id")
            sup = SupervisorHandle(
                pid=int(data["pid"]),
                start_time=float(data["start_time"]),
                boot_id=bid if isinstance(bid, str) else None,
                start_ticks=_opt_int(data.get("start_ticks")),
            )
    except (KeyError, TypeError, ValueError):
        sup = None
    data = read_json(d / CHILD)
    try:
        if data is not None:
            wall = data.get("started_at")
            child = ChildInfo(
                pid=int(data["pid"]),
                start_time=float(data["start_time"]),
                start_ticks=_opt_int(data.get("start_ticks")),
                warnings=_strings(data.get("warnings")),
                started_at=float(wall) if isinstance(wall, (int, float)) else None,
            )
    except (KeyError, TypeError, ValueError):
        child = None
    data = read_json(d / EXIT)
    try:
        if data is not None:
            survivors = data.get("survivors")
            ended = ExitInfo(
                exit_code=_opt_int(data.get("exit_code")),
                signal=_opt_int(data.get("signal")),
                reason=str(data["reason"]),
                ended_at=float(data["ended_at"]),
                tree_clean=bool(data.get("tree_clean", True)),
                survivors=tuple(int(p) for p in survivors) if isinstance(survivors, list) else (),
                started=bool(data.get("started", True)),
                warnings=_strings(data.get("warnings")),
            )
    except (KeyError, TypeError, ValueError):
        ended = None
    return SupervisorStatus(supervisor=sup, child=child, exit=ended)


def write_claim(jobdir: Path, job: int, me: SupervisorHandle, nonce: str | None) -> None:
    """``supervisor.json``: ``me`` runs this directory's job (a supervisor, or the
    launcher of an attached job). Exclusive: FileExistsError when another claimed it."""
    write_json(
        jobdir / SUPERVISOR,
        {
            "job": job,
            "pid": me.pid,
            "start_time": me.start_time,
            "start_ticks": me.start_ticks,
            "boot_id": me.boot_id,
            "nonce": nonce,
        },
        exclusive=True,
    )


def write_child(jobdir: Path, child: ChildInfo) -> None:
    """``child.json``, once: the command started (FileExistsError when it was recorded)."""
    write_json(
        jobdir / CHILD,
        {
            "pid": child.pid,
            "start_time": child.start_time,
            "started_at": child.started_at,
            "start_ticks": child.start_ticks,
            "warnings": list(child.warnings),
        },
        exclusive=True,
    )


def exit_record(job: int, ended: ExitInfo) -> dict[str, Any]:
    """``exit.json``'s document."""
    return {
        "job": job,
        "exit_code": ended.exit_code,
        "signal": ended.signal,
        "reason": ended.reason,
        "ended_at": ended.ended_at,
        "tree_clean": ended.tree_clean,
        "survivors": list(ended.survivors),
        "started": ended.started,
        "warnings": list(ended.warnings),
    }


def write_exit(jobdir: Path, job: int, ended: ExitInfo) -> None:
    """``exit.json``, once: the job's whole tree is gone (FileExistsError when its end
    was recorded)."""
    write_json(jobdir / EXIT, exit_record(job, ended), exclusive=True)


def void_start(jobdir: Path, by: str, *, job: int | None = None) -> bool:
    """Make sure no supervisor ever claims ``jobdir``: write ``supervisor.json``
    ourselves, exclusively, naming no process (a tombstone). True when this call (or an
    earlier one) voided it; False when a supervisor claimed it first."""
    jobdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = jobdir / SUPERVISOR
    try:
        write_json(path, {"job": job, "void": True, "by": by, "at": time.time()}, exclusive=True)
    except FileExistsError:
        # A claim is written whole (temp file, then link), so one that names no process
        # is a tombstone: this one's, or an earlier recovery's cut short.
        return read_status(jobdir).supervisor is None
    spec = jobdir / SPEC  # tidy: a supervisor started now stops at reading it
    with contextlib.suppress(FileNotFoundError):
        os.replace(spec, spec.with_suffix(".void"))
    return True


def write_json(path: Path, data: Mapping[str, Any], *, exclusive: bool) -> None:
    """Write ``path`` atomically (temp file, fsync, rename). ``exclusive``: fail with
    FileExistsError instead of replacing (a hard link creates the name atomically)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links: exclusive, if not atomic
                fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd2, "w") as f2:
                    f2.write(tmp.read_text())
                    f2.flush()
                    os.fsync(f2.fileno())
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
