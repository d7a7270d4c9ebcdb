"""The child side of a job's start: between the supervisor's fork and the command's
exec, the job's session, standard streams, identity (the privilege drop, verified),
working directory and CPUs. What fails on the way goes back on the start pipe as one
JSON line, which the supervisor (``shim.py``) records as the job's exit."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Mapping
from typing import Any, NoReturn

from gpuwarden.jobs.jobdir import SupervisorSpec
from gpuwarden.launch import (
    CommandNotExecutable,
    CommandNotFound,
    apply_affinity,
    launch_problem,
    resolve_command,
)
from gpuwarden.procs.tree import PR_SET_PDEATHSIG, prctl


class StartFailed(Exception):
    """The command could not start: its exit code (126, 127) and why, for exit.json."""

    def __init__(self, exit_code: int, reason: str) -> None:
        # A command or path that is not UTF-8 is written as \xNN: the reason is stored.
        reason = os.fsencode(reason).decode(errors="backslashreplace")
        super().__init__(reason)
        self.exit_code = exit_code
        self.reason = reason


def send(fd: int, record: Mapping[str, Any]) -> None:
    """One JSON line on the start pipe (kept under PIPE_BUF, so it is written whole)."""
    line = json.dumps(record)[:3500] + "\n"
    with contextlib.suppress(OSError):
        os.write(fd, line.encode())


def resolve(spec: SupervisorSpec) -> tuple[str, tuple[str, ...]]:
    """Check cwd and command as the user this process now runs as (``launch_problem``);
    the executable and argv."""
    argv = (*spec.numactl_prefix, *spec.argv)
    for command in (spec.argv, spec.numactl_prefix):  # the command, then its wrapper
        problem = launch_problem(command, spec.cwd, spec.env) if command else None
        if problem is not None:
            raise StartFailed(*problem)
    name = argv[0]
    if os.sep in name and not os.path.isabs(name):
        name = os.path.join(spec.cwd, name)  # relative to the job's cwd, not ours
    try:
        return resolve_command([name], spec.env), argv
    except (CommandNotFound, CommandNotExecutable) as e:
        raise StartFailed(e.exit_code, str(e)) from None


def exec_job(
    spec: SupervisorSpec,
    w: int,
    path: str | None,
    argv: tuple[str, ...],
    out_fd: int,
    err_fd: int,
    supervisor: int,
) -> NoReturn:
    """In the forked child: new session, log files, the job's identity, cwd, CPUs,
    exec. Never returns; failures go to the start pipe ``w``. ``path`` None: resolved
    here, as the job's user; ``supervisor``: the parent's pid, which must still be it."""
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
                raise StartFailed(
                    126, f"cannot switch to uid {spec.uid} gid {spec.gid}: {e.strerror or e}"
                ) from None
            ok = (
                os.getresuid() == (spec.uid,) * 3
                and os.getresgid() == (spec.gid,) * 3
                and set(os.getgroups()) == set(spec.groups)
            )
            if ok and spec.uid != 0:
                try:
                    os.setuid(0)
                    ok = False
                except PermissionError:
                    pass
            if not ok:
                raise StartFailed(
                    126,
                    f"privilege drop failed: the identity is not uid {spec.uid} gid {spec.gid}",
                )
        # Our death (even by SIGKILL) takes the command with it rather than leaving it
        # unsupervised; set after the identity change, which clears it.
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != supervisor:
            os._exit(1)
        if path is None:
            path, argv = resolve(spec)
        try:
            os.chdir(spec.cwd)
        except FileNotFoundError:
            raise StartFailed(127, f"working directory not found: {spec.cwd}") from None
        except OSError as e:
            raise StartFailed(
                126, f"working directory not usable: {spec.cwd}: {e.strerror or e}"
            ) from None
        warning = apply_affinity(spec.cpus)
        if warning:
            send(w, {"warning": warning})
        try:
            os.execve(path, list(argv), spec.env)
        except FileNotFoundError:
            raise StartFailed(127, f"command not found: {argv[0]}") from None
        except PermissionError as e:
            raise StartFailed(
                126, f"command not executable: {argv[0]}: {e.strerror or e}"
            ) from None
        except OSError as e:
            raise StartFailed(126, f"cannot execute {argv[0]}: {e.strerror or e}") from None
    except StartFailed as e:
        code = e.exit_code
        send(w, {"error": e.reason, "exit_code": e.exit_code})
    except BaseException as e:
        send(w, {"error": f"cannot start the command: {e}", "exit_code": 126})
    os._exit(code)
