"""The supervisor itself: a small shim (like conmon) between the daemon and one job.

The daemon talks to it only through files in the job directory (``jobs/jobdir.py``) and
signals (``control.py``), so a job keeps running, and its end is recorded, while the
daemon is dead (invariant 3). Once detached (``detach.py``) the supervisor claims the
directory, becomes a child subreaper, starts the command as argv (never through a
shell) in a new session as the job's user, and on the command's exit, SIGTERM (cancel)
or the timeout ends every process of the tree: SIGTERM (+SIGCONT), ``grace`` seconds,
SIGKILL, reap (invariant 5).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import psutil

from gpuwarden.jobs.jobdir import (
    CHILD,
    EXIT,
    STDERR,
    STDOUT,
    SUPERVISOR,
    ChildInfo,
    ExitInfo,
    SupervisorError,
    SupervisorHandle,
    SupervisorSpec,
    exit_record,
    write_child,
    write_claim,
    write_exit,
)
from gpuwarden.procs.identity import boot_id, running, start_ticks
from gpuwarden.procs.tree import become_subreaper
from gpuwarden.supervisor.child import StartFailed, exec_job, resolve, send
from gpuwarden.supervisor.control import KILL_SIGNAL

KILL_WAIT = 5.0  # how long SIGKILLed processes may take to go before they count as stuck
POLL = 0.05
CANCEL_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, KILL_SIGNAL})
WATCHED = frozenset({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, KILL_SIGNAL})


class Supervisor:
    """One job's supervisor, in the detached process that runs it (``run``)."""

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
                send(ready_fd, {"error": str(e)})
                os.close(ready_fd)
            return 2
        told = True
        if ready_fd is not None:
            try:
                os.write(ready_fd, b'{"ok": true}\n')
            except OSError:
                told = False
            os.close(ready_fd)
        if not become_subreaper():
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
        self.write_exit(
            ExitInfo(
                exit_code=code,
                signal=sig,
                reason=reason,
                ended_at=time.time(),
                tree_clean=clean,
                survivors=tuple(survivors),
                started=self.child_pid is not None and fixed_code is None,
                warnings=tuple(self.warnings),
            )
        )
        return 0

    def claim(self) -> None:
        for name in (CHILD, EXIT):
            if (self.jobdir / name).exists():
                raise SupervisorError(
                    f"{name} exists: this job was started before; refusing to start it again"
                )
        me = SupervisorHandle(
            pid=self.pid,
            start_time=psutil.Process(self.pid).create_time(),
            boot_id=boot_id(),
            start_ticks=start_ticks(self.pid),
        )
        try:
            write_claim(self.jobdir, self.spec.job, me, self.nonce)
        except FileExistsError:
            raise SupervisorError("another supervisor already owns this job directory") from None
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
        except StartFailed as e:
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
                raise StartFailed(
                    126,
                    f"cannot run as uid {spec.uid}: the supervisor runs as uid {euid}, not root",
                )
            if spec.gid != os.getegid() or set(spec.groups) - set(os.getgroups()):
                self.warn("not root: the job keeps the supervisor's groups")
        elif spec.uid != 0:  # cwd and command are checked as the job's user, in the child
            return None, (*spec.numactl_prefix, *spec.argv)
        return self.resolve()

    def resolve(self) -> tuple[str, tuple[str, ...]]:
        """The executable and argv, checked as the user this process now runs as."""
        return resolve(self.spec)

    def open_log(self, name: str) -> int:
        fd = os.open(
            self.jobdir / name,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            os.fchmod(fd, 0o600)
            if os.geteuid() == 0:
                os.fchown(fd, self.spec.uid, self.spec.gid)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def start(
        self, path: str | None, argv: tuple[str, ...], out_fd: int, err_fd: int
    ) -> StartFailed | None:
        """Fork and exec the command; a start pipe (closed by exec) carries failures."""
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            exec_job(self.spec, w, path, argv, out_fd, err_fd, self.pid)
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
        failed: StartFailed | None = None
        for line in b"".join(chunks).decode(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "warning" in rec:
                self.warn(str(rec["warning"]))
            elif "error" in rec and failed is None:
                failed = StartFailed(int(rec.get("exit_code", 126)), str(rec["error"]))
        if failed is not None:
            return failed
        started_at = time.time()  # the wall clock, for people; start_time is identity
        start = started_at
        with contextlib.suppress(psutil.Error):
            start = psutil.Process(pid).create_time()
        try:
            write_child(
                self.jobdir,
                ChildInfo(
                    pid=pid,
                    start_time=start,
                    start_ticks=start_ticks(pid),
                    warnings=tuple(self.warnings),
                    started_at=started_at,
                ),
            )
        except OSError as e:  # the job runs on; the daemon still knows us by supervisor.json
            self.warn(f"cannot write {CHILD}: {e.strerror or e}")
        self.log(f"started pid {pid}: {json.dumps(list(argv))}")
        return None

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

    def write_exit(self, ended: ExitInfo) -> None:
        """exit.json, once; retried (a full disk may clear) since the daemon needs it,
        unless the job directory itself is gone: then nobody can read it."""
        give_up = time.monotonic() + 3600
        pause = 0.5
        while True:
            try:
                write_exit(self.jobdir, self.spec.job, ended)
                self.log(f"ended: {json.dumps(exit_record(self.spec.job, ended))}")
                return
            except FileExistsError:
                self.log("exit.json exists already: not written again")
                return
            except OSError as e:
                if isinstance(e, FileNotFoundError) and not self.jobdir.is_dir():
                    self.log("the job directory was removed: its end is not recorded")
                    return
                self.log(f"cannot write exit.json: {e.strerror or e}")
                if time.monotonic() >= give_up:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 30.0)
