"""A thin control layer over ``nvidia-cuda-mps-control``: the plan for one control
daemon (its pipe and log directories, visible GPUs, limits) and starting, asking and
stopping it, as argv lists, never through a shell. Nothing assumes the default pipe
directory: several control daemons can run at once, each named by its own
``CUDA_MPS_PIPE_DIRECTORY``."""

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuwarden.errors import GpuwardenError, UsageError
from gpuwarden.mps.limits import check_thread_percentage, format_mem_limits, format_mps_size
from gpuwarden.mps.state import (
    CONTROL_BINARY,
    CONTROL_PIPE,
    DEFAULT_LOG_DIR,
    DEFAULT_PIPE_DIR,
    ENV_LOG_DIR,
    ENV_MEM_LIMIT,
    ENV_ORDER,
    ENV_PIPE_DIR,
    ENV_THREADS,
    ENV_VISIBLE,
    MpsDaemon,
    MpsError,
    MpsUnavailable,
    read_mps_state,
)
from gpuwarden.procs.identity import alive

# What a control daemon must not inherit: it is given its own.
_DROPPED_ENV = (ENV_PIPE_DIR, ENV_LOG_DIR, ENV_MEM_LIMIT, ENV_THREADS, ENV_VISIBLE, ENV_ORDER)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- the plan for one control daemon ------------------------------------------


@dataclass(frozen=True)
class MpsConfig:
    """Everything one control daemon is started with. GPU indices are the machine's
    (nvidia-smi's); the daemon sees ``visible_devices`` renumbered from 0, so limits are
    written with the daemon's own ordinals."""

    pipe_dir: str = DEFAULT_PIPE_DIR
    log_dir: str = DEFAULT_LOG_DIR
    visible_devices: tuple[int, ...] | None = None  # None: every GPU
    mem_limits: Mapping[int, int] = field(default_factory=dict)  # GPU index -> bytes
    thread_percentage: int | None = None

    def __post_init__(self) -> None:
        if self.thread_percentage is not None:
            check_thread_percentage(self.thread_percentage)
        for gpu, nbytes in self.mem_limits.items():
            format_mps_size(nbytes)
            if self.visible_devices is not None and gpu not in self.visible_devices:
                shown = ",".join(map(str, self.visible_devices))
                raise UsageError(
                    f"--mem-limit names GPU {gpu}, which is not among the daemon's GPUs ({shown})"
                )

    def ordinal(self, gpu: int) -> int:
        """The device number the daemon and its clients use for machine GPU ``gpu``."""
        return gpu if self.visible_devices is None else self.visible_devices.index(gpu)

    def device_limits(self) -> dict[int, int]:
        return {self.ordinal(g): n for g, n in self.mem_limits.items()}

    def env_overrides(self) -> dict[str, str]:
        """The variables the daemon is started with (beyond the inherited environment)."""
        env = {ENV_ORDER: "PCI_BUS_ID", ENV_PIPE_DIR: self.pipe_dir, ENV_LOG_DIR: self.log_dir}
        if self.visible_devices is not None:
            env[ENV_VISIBLE] = ",".join(map(str, self.visible_devices))
        if self.mem_limits:
            env[ENV_MEM_LIMIT] = format_mem_limits(self.device_limits())
        if self.thread_percentage is not None:
            env[ENV_THREADS] = str(self.thread_percentage)
        return env

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The daemon's full environment: ``base`` (default os.environ) without any
        inherited MPS or device-selection variables, plus ``env_overrides``."""
        src = os.environ if base is None else base
        env = {k: v for k, v in src.items() if k not in _DROPPED_ENV}
        env.update(self.env_overrides())
        return env

    def limit_commands(self) -> list[str]:
        """Control-pipe commands that set the default limits for new servers."""
        cmds = [
            f"set_default_device_pinned_mem_limit {dev} {format_mps_size(n)}"
            for dev, n in sorted(self.device_limits().items())
        ]
        if self.thread_percentage is not None:
            cmds.append(f"set_default_active_thread_percentage {self.thread_percentage}")
        return cmds

    def shell_lines(
        self, binary: str = CONTROL_BINARY, current_env: Mapping[str, str] | None = None
    ) -> list[str]:
        """The start as shell lines a person could run (display only; gpuwarden runs argv)."""
        cur = os.environ if current_env is None else current_env
        unset = [f"-u {k}" for k in _DROPPED_ENV if k in cur and k not in self.env_overrides()]
        assigns = [f"{k}={shlex.quote(v)}" for k, v in self.env_overrides().items()]
        lines = [
            shlex.join(["mkdir", "-p", self.pipe_dir, self.log_dir]),
            " ".join(["env", *unset, *assigns, shlex.quote(binary), "-d"]),
        ]
        lines += [control_shell_line(c, self.pipe_dir, binary) for c in self.limit_commands()]
        return lines


def control_shell_line(command: str, pipe_dir: str, binary: str = CONTROL_BINARY) -> str:
    """``echo CMD | CUDA_MPS_PIPE_DIRECTORY=D nvidia-cuda-mps-control``, for display."""
    return (
        f"echo {shlex.quote(command)} | {ENV_PIPE_DIR}={shlex.quote(pipe_dir)} "
        f"{shlex.quote(binary)}"
    )


# -- control --------------------------------------------------------------------


class MpsControl:
    """One MPS control daemon, named by its pipe directory.

    ``uid``/``gid`` run the daemon and the client commands as that user (the caller must
    be root), so that a per-user daemon can serve only that user's jobs; the
    directories are then created owned by that user."""

    def __init__(
        self,
        pipe_dir: str = DEFAULT_PIPE_DIR,
        log_dir: str | None = None,
        *,
        binary: str = CONTROL_BINARY,
        timeout: float = 10.0,
        uid: int | None = None,
        gid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.pipe_dir = os.path.abspath(pipe_dir)
        self.log_dir = os.path.abspath(log_dir) if log_dir is not None else DEFAULT_LOG_DIR
        self.binary = binary
        self.timeout = timeout
        self.uid = uid
        self.gid = gid
        self._clock = clock
        self._sleep = sleep

    @property
    def control_path(self) -> str:
        return os.path.join(self.pipe_dir, CONTROL_PIPE)

    def reachable(self) -> bool:
        """Whether the control endpoint exists (a daemon listens, or left it behind)."""
        return os.path.exists(self.control_path)

    def executable(self) -> str:
        """The control binary's path, or MpsUnavailable saying what is missing."""
        found = shutil.which(self.binary)
        if found is None:
            raise MpsUnavailable(
                f"{self.binary} not found on PATH (it ships with the NVIDIA driver's "
                "compute utilities, e.g. nvidia-compute-utils)"
            )
        return found

    def config(
        self,
        visible_devices: Sequence[int] | None = None,
        mem_limits: Mapping[int, int] | None = None,
        thread_percentage: int | None = None,
    ) -> MpsConfig:
        """The plan ``start`` would carry out with these settings (for dry runs)."""
        return MpsConfig(
            pipe_dir=self.pipe_dir,
            log_dir=self.log_dir,
            visible_devices=None if visible_devices is None else tuple(visible_devices),
            mem_limits=dict(mem_limits or {}),
            thread_percentage=thread_percentage,
        )

    def daemons(self) -> tuple[MpsDaemon, ...]:
        """Control daemons running with this pipe directory."""
        return read_mps_state().for_pipe_dir(self.pipe_dir).controls

    def _extra_groups(self) -> list[int] | None:
        """Drop root's supplementary groups when running as another user."""
        return None if self.uid is None else []

    def _client_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env[ENV_PIPE_DIR] = self.pipe_dir
        env[ENV_LOG_DIR] = self.log_dir
        return env

    def _make_dir(self, path: str) -> None:
        os.makedirs(path, mode=0o755, exist_ok=True)
        if self.uid is not None:
            os.chown(path, self.uid, -1 if self.gid is None else self.gid)

    def start(
        self,
        visible_devices: Sequence[int] | None = None,
        mem_limits: Mapping[int, int] | None = None,
        thread_percentage: int | None = None,
    ) -> MpsDaemon:
        """Run ``nvidia-cuda-mps-control -d`` with the plan's environment, wait until its
        control endpoint appears, then apply the default limits through it. All or
        nothing: when a limit is refused, the fresh daemon is stopped again."""
        config = self.config(visible_devices, mem_limits, thread_percentage)
        exe = self.executable()
        running = self.daemons()
        if running:
            raise UsageError(
                f"an MPS control daemon (pid {running[0].pid}) already uses pipe "
                f"dir {self.pipe_dir}; stop it first or choose another --pipe-dir"
            )
        self._make_dir(self.pipe_dir)
        self._make_dir(self.log_dir)
        # Output to a file, not a pipe: the daemonised child may keep inherited pipes
        # open, and reading one would wait for the daemon to exit.
        with tempfile.TemporaryFile() as out:
            try:
                rc = subprocess.run(
                    [exe, "-d"],
                    env=config.env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.timeout,
                    check=False,
                    user=self.uid,
                    group=self.gid,
                    extra_groups=self._extra_groups(),
                ).returncode
            except subprocess.TimeoutExpired:
                raise MpsError(
                    f"{self.binary} -d did not return within {self.timeout:g}s"
                ) from None
            except OSError as e:
                raise MpsError(f"cannot run {exe}: {e.strerror or e}") from None
            out.seek(0)
            said = _one_line(out.read().decode(errors="replace"))
        if rc != 0:
            raise MpsError(f"{self.binary} -d failed (exit {rc})" + (f": {said}" if said else ""))
        daemon = self._wait_up()
        try:
            for command in config.limit_commands():
                self.query(command)
        except GpuwardenError:
            with contextlib.suppress(GpuwardenError):
                self.stop()
            raise
        return daemon

    def _wait_up(self) -> MpsDaemon:
        deadline = self._clock() + self.timeout
        while True:
            daemons = self.daemons()
            if daemons and self.reachable():
                return daemons[0]
            if self._clock() >= deadline:
                raise MpsError(
                    f"the MPS control daemon did not come up within {self.timeout:g}s "
                    f"(no {self.control_path}); see {os.path.join(self.log_dir, 'control.log')}"
                )
            self._sleep(0.05)

    def query(self, command: str) -> str:
        """Send one command line (``get_server_list``, ``set_default_...``) to the daemon
        and return its answer."""
        command = command.strip()
        if not command or "\n" in command:
            raise UsageError(f"an MPS control command is one line, got {command!r}")
        if not self.reachable():
            raise MpsError(f"no MPS control daemon listens at {self.pipe_dir}")
        exe = self.executable()
        try:
            r = subprocess.run(
                [exe],
                input=command + "\n",
                env=self._client_env(),
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
                user=self.uid,
                group=self.gid,
                extra_groups=self._extra_groups(),
            )
        except subprocess.TimeoutExpired:
            raise MpsError(
                f"the MPS control daemon at {self.pipe_dir} did not answer "
                f"{command!r} within {self.timeout:g}s"
            ) from None
        except OSError as e:
            raise MpsError(f"cannot run {exe}: {e.strerror or e}") from None
        if r.returncode != 0:
            said = _one_line(r.stderr or r.stdout)
            raise MpsError(
                f"MPS control at {self.pipe_dir}: {command!r} failed "
                f"(exit {r.returncode})" + (f": {said}" if said else "")
            )
        return r.stdout.strip()

    def stop(self) -> tuple[MpsDaemon, ...]:
        """Send ``quit`` and wait until the daemon's process is gone; returns the daemons
        that were stopped. A daemon still alive after ``timeout`` is an MpsError."""
        daemons = self.daemons()
        if not daemons and not self.reachable():
            raise UsageError(f"no MPS control daemon runs with pipe dir {self.pipe_dir}")
        self.query("quit")
        deadline = self._clock() + self.timeout
        while True:
            left = [d for d in daemons if alive(d.pid, d.start_time)]
            if not left:
                return daemons
            if self._clock() >= deadline:
                raise MpsError(
                    f"the MPS control daemon (pid {left[0].pid}) still runs {self.timeout:g}s "
                    "after quit; MPS servers may still have clients (see `gpuwarden mps status`)"
                )
            self._sleep(0.05)
