"""The per-job supervisor: a small shim (like conmon) between the daemon and one job.

The daemon talks to it only through files in a per-job directory and signals, so a job
keeps running, and its end is recorded, while the daemon is dead (invariant 3).

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

Run as ``python -m gpuwarden.daemon.supervisor JOBDIR`` (or ``start`` from a process that
imported this module, as the daemon's fork server does): it detaches (fork, setsid, fork),
the process the daemon started exits as soon as the supervisor has claimed the directory,
and ``spawn_supervisor`` returns the real supervisor's identity. The supervisor becomes a
child subreaper, starts the command as argv (never through a shell) in a new session as
the job's user, and on the command's exit, SIGTERM (cancel) or the timeout ends every
process of the tree: SIGTERM (+SIGCONT), ``grace`` seconds, SIGKILL, reap (invariant 5).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psutil

from gpuwarden.errors import GpuwardenError
from gpuwarden.launch import (
    CommandNotExecutable,
    CommandNotFound,
    LaunchPlan,
    apply_affinity,
    launch_problem,
    resolve_command,
)
from gpuwarden.procs.identity import alive as identity_alive
from gpuwarden.procs.identity import (
    boot_id,
    identify,
    pin,
    running,
    same_boot,
    start_ticks,
)

SPEC, SUPERVISOR, CHILD, EXIT = "spec.json", "supervisor.json", "child.json", "exit.json"
STDOUT, STDERR, LOG = "stdout", "stderr", "supervisor.log"
DEFAULT_GRACE = 10.0
KILL_WAIT = 5.0  # how long SIGKILLed processes may take to go before they count as stuck
POLL = 0.05
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_SIGNAL = signal.SIGUSR1  # from the daemon: cancel --kill, SIGKILL the tree at once
CANCEL_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, KILL_SIGNAL})
WATCHED = frozenset({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                     KILL_SIGNAL})


class SupervisorError(GpuwardenError):
    """A supervisor could not be started for a job directory (bad spec, already started,
    did not come up in time)."""


class NotStarted(SupervisorError):
    """The start failed and it is proven that no supervisor runs the directory: the
    launcher voided it (its own claim, which a late supervisor cannot make) before any
    supervisor claimed it. Nothing of the job ran, so it may be queued again."""


# ---------------------------------------------------------------------------- the spec


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
        return {"job": self.job, "argv": list(self.argv), "env": dict(self.env),
                "cwd": self.cwd, "uid": self.uid, "gid": self.gid,
                "groups": list(self.groups),
                "cpus": None if self.cpus is None else sorted(self.cpus),
                "timeout": self.timeout, "grace": self.grace,
                "numactl_prefix": list(self.numactl_prefix)}

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
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
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
        return cls(job=need("job", int), argv=argv, env=dict(env), cwd=cwd, uid=uid, gid=gid,
                   groups=ints(need("groups", list, []), "groups"), cpus=cpus,
                   timeout=None if timeout is None else float(timeout), grace=float(grace),
                   numactl_prefix=strs(need("numactl_prefix", list, []), "numactl_prefix"))


def spec_from_plan(job: int, plan: LaunchPlan, command: Sequence[str], *, cwd: str, uid: int,
                   gid: int, groups: Sequence[int] = (), timeout: float | None = None,
                   grace: float = DEFAULT_GRACE) -> SupervisorSpec:
    """The spec for running ``command`` as ``plan_launch`` planned it: its environment
    (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, the cap hook), CPU set and numactl prefix."""
    cmd = tuple(command)
    n = len(plan.argv) - len(cmd)
    if not cmd or n < 0 or plan.argv[n:] != cmd:
        raise ValueError("the plan's argv does not end with the command")
    return SupervisorSpec(job=job, argv=cmd, env=dict(plan.env), cwd=cwd, uid=uid, gid=gid,
                          groups=tuple(groups), cpus=plan.cpus, timeout=timeout, grace=grace,
                          numactl_prefix=plan.argv[:n])


def write_spec(jobdir: str | os.PathLike[str], spec: SupervisorSpec) -> Path:
    """Write ``<jobdir>/spec.json`` atomically (mode 0600) into a new directory (0700).
    A directory already there belongs to another attempt (a reset state database can
    name one again): it is never reused."""
    d = Path(jobdir)
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        raise SupervisorError(f"job directory {d} already exists (left by an earlier "
                              "job?); refusing to reuse it") from None
    path = d / SPEC
    _write_json(path, spec.to_json(), exclusive=False)
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


# ---------------------------------------------------------------------- status files


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


def _read_json(path: Path) -> dict[str, Any] | None:
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
    data = _read_json(d / SUPERVISOR)
    try:
        if data is not None:
            bid = data.get("boot_id")
            sup = SupervisorHandle(pid=int(data["pid"]), start_time=float(data["start_time"]),
                                   boot_id=bid if isinstance(bid, str) else None,
                                   start_ticks=_opt_int(data.get("start_ticks")))
    except (KeyError, TypeError, ValueError):
        sup = None
    data = _read_json(d / CHILD)
    try:
        if data is not None:
            wall = data.get("started_at")
            child = ChildInfo(pid=int(data["pid"]), start_time=float(data["start_time"]),
                              start_ticks=_opt_int(data.get("start_ticks")),
                              warnings=_strings(data.get("warnings")),
                              started_at=float(wall) if isinstance(wall, (int, float)) else None)
    except (KeyError, TypeError, ValueError):
        child = None
    data = _read_json(d / EXIT)
    try:
        if data is not None:
            survivors = data.get("survivors")
            ended = ExitInfo(exit_code=_opt_int(data.get("exit_code")),
                             signal=_opt_int(data.get("signal")),
                             reason=str(data["reason"]), ended_at=float(data["ended_at"]),
                             tree_clean=bool(data.get("tree_clean", True)),
                             survivors=tuple(int(p) for p in survivors)
                             if isinstance(survivors, list) else (),
                             started=bool(data.get("started", True)),
                             warnings=_strings(data.get("warnings")))
    except (KeyError, TypeError, ValueError):
        ended = None
    return SupervisorStatus(supervisor=sup, child=child, exit=ended)


# ------------------------------------------------------------------ process identity
# One rule for "still that process" (procs/identity.py); a supervisor is also bound to
# the boot it started in.


def alive(handle: SupervisorHandle) -> bool:
    """Is this supervisor still running (same boot, same process, not a zombie)?"""
    return same_boot(handle.boot_id) and identity_alive(handle.pid, handle.start_time,
                                                         handle.start_ticks)


def live_supervisors(jobs_dir: str | os.PathLike[str]) -> list[psutil.Process]:
    """The supervisors still running for job directories under ``jobs_dir`` (any depth
    of ``<job>/<attempt>/supervisor.json``), identity-checked: forked from the daemon's
    fork server, their command lines do not name their directories."""
    out = []
    for claim in sorted(Path(jobs_dir).glob(f"*/*/{SUPERVISOR}")):
        status = read_status(claim.parent).supervisor
        if status is None:
            continue
        p = identify(status.pid, status.start_time, status.start_ticks)
        if p is not None and running(p):
            out.append(p)
    return out


def _signal_identified(handle: SupervisorHandle, sig: int) -> bool:
    """Send ``sig`` to the supervisor if it is still the same running process, through a
    pidfd opened before the check (procs/identity.py: a reused pid is never hit)."""
    if not same_boot(handle.boot_id):
        return False
    pinned = pin(handle.pid, handle.start_time, handle.start_ticks)
    if pinned is None:
        return False
    try:
        if not running(pinned.proc):
            return False
        pinned.send(sig)
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    finally:
        pinned.close()


def cancel(jobdir: str | os.PathLike[str], kill: bool = False) -> bool:
    """Ask the job's supervisor to end the job (SIGTERM, identity-checked). True when the
    signal was sent; False when the job has ended or has no live supervisor. The
    supervisor then kills the tree and writes exit.json with reason "cancelled".
    ``kill``: the supervisor SIGKILLs the tree at once (``KILL_SIGNAL``), even one already
    in its grace; an attached job's launcher gets SIGKILL itself."""
    status = read_status(jobdir)
    if status.exit is not None or status.supervisor is None:
        return False
    if not kill:
        return _signal_identified(status.supervisor, signal.SIGTERM)
    attached = (_read_json(Path(jobdir) / SUPERVISOR) or {}).get("nonce") == "attached"
    return _signal_identified(status.supervisor,
                              signal.SIGKILL if attached else KILL_SIGNAL)


# -------------------------------------------------------------------------- spawning


def spawn_supervisor(jobdir: str | os.PathLike[str], python: str = sys.executable, *,
                     timeout: float = 10.0,
                     env: Mapping[str, str] | None = None) -> SupervisorHandle:
    """Start the supervisor for ``jobdir`` (spec.json written already) and return its
    identity. The process started here exits as soon as the detached supervisor has
    claimed the directory, and is reaped here: nothing is left as the caller's zombie.
    Raises ``SupervisorError`` (bad spec, job already started, no start in time)."""
    d = Path(jobdir).resolve()
    nonce = secrets.token_hex(8)
    proc = subprocess.Popen(
        [python, "-m", "gpuwarden.daemon.supervisor", "--nonce", nonce, str(d)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        close_fds=True, env=None if env is None else dict(env))
    assert proc.stderr is not None
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        proc.stderr.close()
        abandon_start(d, nonce)
        raise SupervisorError(f"the supervisor for {d} did not start within {timeout:g}s") \
            from None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    return started(d, nonce, rc, err)


def started(jobdir: Path, nonce: str, rc: int, err: str) -> SupervisorHandle:
    """The identity of the supervisor that claimed ``jobdir`` with ``nonce``, given how
    the process that started it ended (exit status ``rc``, its stderr ``err``)."""
    err = err.strip()
    if rc != 0:
        last = err.splitlines()[-1] if err else f"exit status {rc}"
        raise SupervisorError(last.removeprefix("gpuwarden supervisor: "))
    data = _read_json(jobdir / SUPERVISOR)
    status = read_status(jobdir).supervisor
    if data is None or status is None or data.get("nonce") != nonce:
        raise SupervisorError(f"{jobdir / SUPERVISOR} was not written by the supervisor "
                              "started")
    return status


def abandon_start(jobdir: Path, nonce: str) -> None:
    """The launcher gave up on a start: if the supervisor claimed the directory anyway,
    make sure the job does not run unnoticed."""
    data = _read_json(jobdir / SUPERVISOR)
    if data is not None and data.get("nonce") == nonce:
        cancel(jobdir)


def void_start(jobdir: Path, by: str) -> bool:
    """Make sure no supervisor ever claims ``jobdir``: write ``supervisor.json``
    ourselves, exclusively, naming no process (a tombstone). True when this call (or an
    earlier one) voided it; False when a supervisor claimed it first."""
    path = jobdir / SUPERVISOR
    try:
        _write_json(path, {"void": True, "by": by, "at": time.time()}, exclusive=True)
    except FileExistsError:
        data = _read_json(path)
        return data is not None and data.get("void") is True
    spec = jobdir / SPEC  # tidy: a supervisor started now stops at reading it
    with contextlib.suppress(FileNotFoundError):
        os.replace(spec, spec.with_suffix(".void"))
    return True


# ------------------------------------------------------------------------ internals


def _write_json(path: Path, data: Mapping[str, Any], *, exclusive: bool) -> None:
    """Write ``path`` atomically (temp file, fsync, rename). ``exclusive``: fail with
    FileExistsError instead of replacing (a hard link creates the name atomically)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
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


_LIBC: Any = None


def _prctl(option: int, arg: int) -> bool:
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        return int(_LIBC.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0),
                               ctypes.c_ulong(0), ctypes.c_ulong(0))) == 0
    except (OSError, AttributeError):
        return False


def _set_name(name: str) -> None:
    """Name this process for ps/top (``comm``): supervisors forked from the daemon's fork
    server would otherwise all show as the fork server."""
    global _LIBC
    PR_SET_NAME = 15
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _StartFailed(Exception):
    def __init__(self, exit_code: int, reason: str) -> None:
        # A command or path that is not UTF-8 is written as \xNN: the reason is stored.
        reason = os.fsencode(reason).decode(errors="backslashreplace")
        super().__init__(reason)
        self.exit_code = exit_code
        self.reason = reason


def _send(fd: int, record: Mapping[str, Any]) -> None:
    """One JSON line on the start pipe (kept under PIPE_BUF, so it is written whole)."""
    line = json.dumps(record)[:3500] + "\n"
    with contextlib.suppress(OSError):
        os.write(fd, line.encode())


class _Supervisor:
    def __init__(self, jobdir: Path, spec: SupervisorSpec, nonce: str | None) -> None:
        self.jobdir = jobdir
        self.spec = spec
        self.nonce = nonce
        self.pid = os.getpid()
        self.me: psutil.Process | None = None
        self.child_pid: int | None = None
        self.child_status: int | None = None
        self.warnings: list[str] = []
        self.kill_now = False  # cancelled with KILL_SIGNAL: no grace

    # -- small helpers
    def log(self, msg: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with contextlib.suppress(OSError):
            os.write(2, f"{stamp} supervisor[{self.pid}] job {self.spec.job}: {msg}\n".encode())

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)
        self.log(f"warning: {msg}")

    def reap(self) -> None:
        """Collect every exited child (the command, and orphans re-parented to us)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child_pid:
                self.child_status = status

    def descendants(self) -> list[psutil.Process]:
        """Every process below us, zombies included. As a subreaper we inherit every
        orphan of the tree, so this is the whole job, whatever sessions it made."""
        if self.me is None:
            self.me = psutil.Process(self.pid)
        try:
            return self.me.children(recursive=True)
        except psutil.Error:
            return []

    def live_descendants(self) -> list[psutil.Process]:
        return [p for p in self.descendants() if running(p)]

    # -- the life of a job
    def run(self, ready_fd: int | None) -> int:
        """Claim the directory, run the job, end its tree, record the end. Returns the
        supervisor's own exit status (0 once it has claimed the directory)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        # A launcher that ignored these must not make us lose children or cancels.
        for watched in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(watched, signal.SIG_DFL)
        self.pid = os.getpid()
        try:
            self.claim()
        except SupervisorError as e:
            self.log(str(e))
            if ready_fd is not None:
                _send(ready_fd, {"error": str(e)})
                os.close(ready_fd)
            return 2
        told = True
        if ready_fd is not None:
            try:
                os.write(ready_fd, b'{"ok": true}\n')
            except OSError:
                told = False
            os.close(ready_fd)
        if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
            self.warn("could not become a child subreaper: orphaned processes may escape")

        reason, fixed_code = "supervisor error", None
        try:
            if not told:
                reason = "not started: the launcher gave up waiting for the supervisor"
            else:
                reason, fixed_code = self.supervise()
        except Exception as e:
            self.log(traceback.format_exc())
            reason = f"supervisor error: {e}"
        clean: bool = False
        survivors: list[int] = []
        try:
            kill = self.kill_now or KILL_SIGNAL in signal.sigpending()
            clean, survivors = self.end_tree(0.0 if kill else self.spec.grace)
        except Exception:
            self.log(traceback.format_exc())
        if self.child_pid is None or fixed_code is not None:
            code, sig = fixed_code, None
        else:
            code, sig = self.exit_code()
        self.write_exit({
            "job": self.spec.job, "exit_code": code, "signal": sig, "reason": reason,
            "ended_at": time.time(), "tree_clean": clean, "survivors": survivors,
            "started": self.child_pid is not None and fixed_code is None,
            "warnings": self.warnings,
        })
        return 0

    def claim(self) -> None:
        for name in (CHILD, EXIT):
            if (self.jobdir / name).exists():
                raise SupervisorError(f"{name} exists: this job was started before; "
                                      "refusing to start it again")
        me = psutil.Process(self.pid)
        data = {"job": self.spec.job, "pid": self.pid, "start_time": me.create_time(),
                "start_ticks": start_ticks(self.pid), "boot_id": boot_id(),
                "nonce": self.nonce}
        try:
            _write_json(self.jobdir / SUPERVISOR, data, exclusive=True)
        except FileExistsError:
            raise SupervisorError("another supervisor already owns this job directory") \
                from None
        except OSError as e:
            raise SupervisorError(f"cannot write {SUPERVISOR}: {e.strerror or e}") from None
        self.log(f"supervising {self.jobdir}")

    def supervise(self) -> tuple[str, int | None]:
        """Start the command and wait for its end. Returns (reason, exit code when the
        command could not be started)."""
        if CANCEL_SIGNALS & signal.sigpending():
            return "cancelled", None  # before anything ran
        try:
            path, argv = self.prepare()
            out_fd = self.open_log(STDOUT)
            try:
                err_fd = self.open_log(STDERR)
            except BaseException:
                os.close(out_fd)
                raise
        except _StartFailed as e:
            self.log(e.reason)
            return e.reason, e.exit_code
        except OSError as e:
            reason = f"cannot open the log files: {e.strerror or e}"
            self.log(reason)
            return reason, 126
        try:
            failed = self.start(path, argv, out_fd, err_fd)
        finally:
            os.close(out_fd)
            os.close(err_fd)
        if failed is not None:
            self.log(failed.reason)
            return failed.reason, failed.exit_code
        return self.wait(), None

    def prepare(self) -> tuple[str | None, tuple[str, ...]]:
        """Check identity before forking; the executable (None: to be resolved in the
        child, as the job's user) and argv."""
        spec = self.spec
        euid = os.geteuid()
        if euid != 0:
            if spec.uid != euid:
                raise _StartFailed(126, f"cannot run as uid {spec.uid}: the supervisor runs "
                                        f"as uid {euid}, not root")
            if spec.gid != os.getegid() or set(spec.groups) - set(os.getgroups()):
                self.warn("not root: the job keeps the supervisor's groups")
        elif spec.uid != 0:  # cwd and command are checked as the job's user, in the child
            return None, (*spec.numactl_prefix, *spec.argv)
        return self.resolve()

    def resolve(self) -> tuple[str, tuple[str, ...]]:
        """Check cwd and command as the user this process now runs as (``launch_problem``);
        the executable and argv."""
        spec = self.spec
        argv = (*spec.numactl_prefix, *spec.argv)
        for command in (spec.argv, spec.numactl_prefix):  # the command, then its wrapper
            problem = launch_problem(command, spec.cwd, spec.env) if command else None
            if problem is not None:
                raise _StartFailed(*problem)
        name = argv[0]
        if os.sep in name and not os.path.isabs(name):
            name = os.path.join(spec.cwd, name)  # relative to the job's cwd, not ours
        try:
            return resolve_command([name], spec.env), argv
        except (CommandNotFound, CommandNotExecutable) as e:
            raise _StartFailed(e.exit_code, str(e)) from None

    def open_log(self, name: str) -> int:
        fd = os.open(self.jobdir / name,
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.fchmod(fd, 0o600)
            if os.geteuid() == 0:
                os.fchown(fd, self.spec.uid, self.spec.gid)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def start(self, path: str | None, argv: tuple[str, ...], out_fd: int,
              err_fd: int) -> _StartFailed | None:
        """Fork and exec the command; a start pipe (closed by exec) carries failures."""
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            self.child(w, path, argv, out_fd, err_fd)
        os.close(w)
        self.child_pid = pid
        chunks = []
        try:
            while True:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(r)
        failed: _StartFailed | None = None
        for line in b"".join(chunks).decode(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "warning" in rec:
                self.warn(str(rec["warning"]))
            elif "error" in rec and failed is None:
                failed = _StartFailed(int(rec.get("exit_code", 126)), str(rec["error"]))
        if failed is not None:
            return failed
        started_at = time.time()  # the wall clock, for people; start_time is identity
        start = started_at
        with contextlib.suppress(psutil.Error):
            start = psutil.Process(pid).create_time()
        try:
            _write_json(self.jobdir / CHILD, {"pid": pid, "start_time": start,
                                              "started_at": started_at,
                                              "start_ticks": start_ticks(pid),
                                              "warnings": self.warnings}, exclusive=True)
        except OSError as e:  # the job runs on; the daemon still knows us by supervisor.json
            self.warn(f"cannot write {CHILD}: {e.strerror or e}")
        self.log(f"started pid {pid}: {json.dumps(list(argv))}")
        return None

    def child(self, w: int, path: str | None, argv: tuple[str, ...], out_fd: int,
              err_fd: int) -> NoReturn:
        """In the forked child: new session, log files, the job's identity, cwd, CPUs,
        exec. Never returns; failures go to the start pipe."""
        spec = self.spec
        code = 126
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                if fd > 2 and fd != w:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if os.geteuid() == 0:
                try:
                    os.setgroups(list(spec.groups))
                    os.setresgid(spec.gid, spec.gid, spec.gid)
                    os.setresuid(spec.uid, spec.uid, spec.uid)
                except OSError as e:
                    raise _StartFailed(126, f"cannot switch to uid {spec.uid} gid {spec.gid}: "
                                            f"{e.strerror or e}") from None
                ok = (os.getresuid() == (spec.uid,) * 3 and os.getresgid() == (spec.gid,) * 3
                      and set(os.getgroups()) == set(spec.groups))
                if ok and spec.uid != 0:
                    try:
                        os.setuid(0)
                        ok = False
                    except PermissionError:
                        pass
                if not ok:
                    raise _StartFailed(126, "privilege drop failed: the identity is not "
                                            f"uid {spec.uid} gid {spec.gid}")
            # Our death (even by SIGKILL) takes the command with it rather than leaving it
            # unsupervised; set after the identity change, which clears it.
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != self.pid:
                os._exit(1)
            if path is None:
                path, argv = self.resolve()
            try:
                os.chdir(spec.cwd)
            except FileNotFoundError:
                raise _StartFailed(127, f"working directory not found: {spec.cwd}") from None
            except OSError as e:
                raise _StartFailed(126, f"working directory not usable: {spec.cwd}: "
                                        f"{e.strerror or e}") from None
            warning = apply_affinity(spec.cpus)
            if warning:
                _send(w, {"warning": warning})
            try:
                os.execve(path, list(argv), spec.env)
            except FileNotFoundError:
                raise _StartFailed(127, f"command not found: {argv[0]}") from None
            except PermissionError as e:
                raise _StartFailed(126, f"command not executable: {argv[0]}: "
                                        f"{e.strerror or e}") from None
            except OSError as e:
                raise _StartFailed(126, f"cannot execute {argv[0]}: {e.strerror or e}") \
                    from None
        except _StartFailed as e:
            code = e.exit_code
            _send(w, {"error": e.reason, "exit_code": e.exit_code})
        except BaseException as e:
            _send(w, {"error": f"cannot start the command: {e}", "exit_code": 126})
        os._exit(code)

    def wait(self) -> str:
        """Wait for the command's exit, a cancel (SIGTERM/SIGINT) or the timeout."""
        deadline = None if self.spec.timeout is None else time.monotonic() + self.spec.timeout
        while True:
            self.reap()
            if self.child_status is not None:
                return "exited"
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                self.log(f"timeout after {self.spec.timeout:g}s")
                return "timeout"
            # At most an hour per wait: a huge timeout (years) overflows the kernel's
            # timespec, and the loop re-checks the deadline anyway.
            info = signal.sigtimedwait(WATCHED, min(left, 3600.0))
            if info is not None and info.si_signo in CANCEL_SIGNALS:
                self.log(f"cancelled by signal {info.si_signo} from pid {info.si_pid}")
                self.kill_now = info.si_signo == KILL_SIGNAL
                return "cancelled"

    def end_tree(self, grace: float) -> tuple[bool, list[int]]:
        """End every process below us: SIGTERM (and SIGCONT, for stopped ones), up to
        ``grace`` seconds, then SIGKILL until none is left. (clean, survivors)."""
        self.reap()
        live = self.live_descendants()
        if not live:
            return self.drained()
        sent: set[int] = set()
        group = self.child_pid if self.child_pid and self.child_status is None else None
        if group is not None:  # the command's own group at once, as a terminal's ^C does
            for p in live:
                try:
                    if os.getpgid(p.pid) == group:
                        sent.add(p.pid)
                except OSError:
                    pass
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(OSError):
                    os.killpg(group, sig)
        deadline = time.monotonic() + grace
        while True:
            for p in live:
                if p.pid not in sent:
                    sent.add(p.pid)
                    for sig in (signal.SIGTERM, signal.SIGCONT):
                        try:
                            p.send_signal(sig)
                        except psutil.Error:
                            break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if KILL_SIGNAL in signal.sigpending():  # cancel --kill during the grace
                self.log("told to kill now: the rest of the grace is skipped")
                break
            signal.sigtimedwait([signal.SIGCHLD], min(POLL, left))
            self.reap()
            live = self.live_descendants()
            if not live:
                return self.drained()
        self.log(f"{len(live)} process(es) still there after {grace:g}s: SIGKILL")
        deadline = time.monotonic() + KILL_WAIT
        while True:
            if self.child_pid and self.child_status is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.child_pid, signal.SIGKILL)
            for p in live:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
            signal.sigtimedwait([signal.SIGCHLD], POLL)
            self.reap()
            live = self.live_descendants()
            if not live:
                return self.drained()
            if time.monotonic() >= deadline:
                survivors = sorted(p.pid for p in live)
                self.log(f"survived SIGKILL: {survivors}")
                return False, survivors

    def drained(self) -> tuple[bool, list[int]]:
        """With nothing alive below us, reap the zombies left (children that died just
        after the last reap, or orphans whose parent just died), so none outlives us."""
        deadline = time.monotonic() + KILL_WAIT
        while True:
            self.reap()
            left = self.descendants()
            if not left:
                return True, []
            if time.monotonic() >= deadline:
                pids = sorted(p.pid for p in left)
                self.log(f"zombies left unreaped: {pids}")
                return False, pids
            signal.sigtimedwait([signal.SIGCHLD], POLL)

    def exit_code(self) -> tuple[int | None, int | None]:
        """(exit code, signal): the command's code, or 128+N when signal N killed it."""
        if self.child_status is None:
            return None, None
        code = os.waitstatus_to_exitcode(self.child_status)
        if code < 0:
            return 128 - code, -code
        return code, None

    def write_exit(self, data: Mapping[str, Any]) -> None:
        """exit.json, once; retried (a full disk may clear) since the daemon needs it."""
        give_up = time.monotonic() + 3600
        pause = 0.5
        while True:
            try:
                _write_json(self.jobdir / EXIT, data, exclusive=True)
                self.log(f"ended: {json.dumps(dict(data))}")
                return
            except FileExistsError:
                self.log("exit.json exists already: not written again")
                return
            except OSError as e:
                self.log(f"cannot write exit.json: {e.strerror or e}")
                if time.monotonic() >= give_up:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 30.0)


# ------------------------------------------------------------------------ entry point


def _refuse_if_started(jobdir: Path) -> None:
    for name in (SUPERVISOR, CHILD, EXIT):
        if (jobdir / name).exists():
            raise SupervisorError(f"{jobdir / name} exists: this job has (had) a supervisor; "
                                  "refusing to start it again")


def _daemonize(jobdir: Path, spec: SupervisorSpec, nonce: str | None) -> int:
    """fork, setsid, fork: the supervisor is nobody's child but init's (or the nearest
    subreaper's). This process waits for the intermediate one and for the supervisor's
    word that it owns the directory, then exits: 0, or 2 with the reason on stderr."""
    rc, err = detach(jobdir, spec, nonce)
    if err:
        print(err, file=sys.stderr)
    return rc


def detach(jobdir: Path, spec: SupervisorSpec, nonce: str | None) -> tuple[int, str]:
    """Start the detached supervisor for ``jobdir`` from this process (fork, setsid,
    fork) and wait until it owns the directory. Returns (0, "") or (2, the reason); the
    caller goes on as before, with no child of its own left behind."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _run_detached(jobdir, spec, nonce, r, w)
    os.close(w)
    os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    try:
        reply = json.loads(b"".join(chunks).decode(errors="replace").splitlines()[0])
    except (ValueError, IndexError):
        reply = {}
    if isinstance(reply, dict) and reply.get("ok") is True:
        return 0, ""
    why = reply.get("error") if isinstance(reply, dict) else None
    return 2, f"gpuwarden supervisor: {why or 'the supervisor died while starting'}"


def _run_detached(jobdir: Path, spec: SupervisorSpec, nonce: str | None, r: int,
                  w: int) -> NoReturn:
    """In the first child: new session, fork the supervisor, exit."""
    code = 1
    try:
        os.close(r)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        os.chdir("/")
        _set_name(f"gw-sup-{spec.job}")
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(jobdir / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                      0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = _Supervisor(jobdir, spec, nonce).run(w)
    except BaseException:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


def start(jobdir: str | os.PathLike[str], nonce: str | None) -> tuple[int, str]:
    """What ``python -m gpuwarden.daemon.supervisor --nonce N JOBDIR`` does, callable from
    a process that has this module imported already (the daemon's fork server)."""
    d = Path(jobdir).resolve()
    try:
        spec = load_spec(d)
        _refuse_if_started(d)
    except SupervisorError as e:
        return 2, f"gpuwarden supervisor: {e}"
    return detach(d, spec, nonce)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwarden.daemon.supervisor",
        description="Run the job described by JOBDIR/spec.json under a supervisor.")
    parser.add_argument("jobdir")
    parser.add_argument("--nonce", help="echoed in supervisor.json (spawn_supervisor's check)")
    parser.add_argument("--foreground", action="store_true",
                        help="do not detach (for debugging)")
    args = parser.parse_args(argv)
    jobdir = Path(args.jobdir).resolve()
    try:
        spec = load_spec(jobdir)
        _refuse_if_started(jobdir)
    except SupervisorError as e:
        print(f"gpuwarden supervisor: {e}", file=sys.stderr)
        return 2
    if args.foreground:
        return _Supervisor(jobdir, spec, args.nonce).run(None)
    return _daemonize(jobdir, spec, args.nonce)


if __name__ == "__main__":
    sys.exit(main())
