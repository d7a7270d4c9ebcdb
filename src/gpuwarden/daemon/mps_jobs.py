"""MPS for ``--mps`` jobs: hard memory limits enforced by the driver.

A job asking for ``--mps`` runs as a client of an MPS control daemon that gpuwarden starts
for its user and GPU set (own pipe and log directories under the state directory) and
quits once no running job of that user uses it. The job's budget becomes its client
limit (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), so an allocation past it fails with an OOM
inside the job instead of taking a neighbour's memory; ``--sm-percent`` becomes
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``.

MPS's own limits, which the job's ``show`` repeats: there is one MPS server per user and
GPU set, shared by all of that user's MPS jobs there, and a client that faults (an
illegal address, an assert in a kernel) takes that server down with every other client
of it. Jobs of different users never share a server.

On the simulated backend the control program is the simulated one (sim/mps.py), written
under the pool's directory: the same start, limits, clients and quit, without a GPU."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpuwarden.errors import GpuwardenError
from gpuwarden.mps.control import MpsControl
from gpuwarden.mps.limits import format_mem_limits
from gpuwarden.mps.state import (
    CONTROL_BINARY,
    ENV_LOG_DIR,
    ENV_MEM_LIMIT,
    ENV_PIPE_DIR,
    ENV_THREADS,
    ENV_VISIBLE,
)

log = logging.getLogger("gpuwarden.mps")
MAX_SOCKET_PATH = 100  # MPS puts unix sockets in the pipe directory (sun_path is 108)
SIM_BIN = "sim-bin"  # under the pool's root: the simulated control program
SHARED_FATE = (
    "MPS: one server per user and GPU set; a client that faults takes that "
    "server and its other clients down with it"
)


class MpsJobError(GpuwardenError):
    """An MPS daemon for a job could not be had."""


def key(uid: int, gpus: Sequence[int]) -> str:
    """The name of the control daemon for a user and GPU set (its directory's name)."""
    return f"{uid}-{'_'.join(str(g) for g in sorted(gpus))}"


def client_env(
    control: MpsControl, gpus: Sequence[int], limit: int, sm_percent: int | None
) -> dict[str, str]:
    """What a job's environment needs to be this daemon's client with ``limit`` bytes on
    each of its GPUs. The daemon shows its clients only its GPUs, numbered from 0: the
    client must say so (torch counts GPUs through NVML first and asserts otherwise)."""
    n = len(gpus)
    env = {
        ENV_PIPE_DIR: control.pipe_dir,
        ENV_LOG_DIR: control.log_dir,
        ENV_VISIBLE: ",".join(str(i) for i in range(n)),
        ENV_MEM_LIMIT: format_mem_limits({i: limit for i in range(n)}),
    }
    if sm_percent is not None:
        env[ENV_THREADS] = str(sm_percent)
    return env


class MpsPool:
    """The control daemons gpuwarden runs for ``--mps`` jobs, one per (uid, GPU set)."""

    def __init__(self, root: Path, control: Callable[..., MpsControl] = MpsControl) -> None:
        self.root = root
        self.control = control
        self._lock = threading.Lock()

    def binary(self) -> str:
        """The control program: the driver's, or the simulated one on the simulated
        backend (written out here, for the users its daemons run as to execute)."""
        from gpuwarden.gpus.backend import simulated

        if not simulated():
            return CONTROL_BINARY
        from gpuwarden.sim.mps import install

        return install(self.root / SIM_BIN)

    def _owned_control(self, name: str) -> MpsControl:
        """The control for a daemon directory, acting as the user it was started for."""
        uid = int(name.split("-", 1)[0])
        if uid == os.geteuid():
            return self._control(name, None, None)
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        return self._control(name, uid, gid)

    def _control(self, name: str, uid: int | None, gid: int | None) -> MpsControl:
        base = self.root / name
        pipe, logs = base / "p", base / "l"
        if len(str(pipe)) > MAX_SOCKET_PATH:
            raise MpsJobError(
                f"the MPS pipe directory {pipe} is too long for its unix "
                "sockets; use a shorter state directory"
            )
        return self.control(str(pipe), str(logs), uid=uid, gid=gid, binary=self.binary())

    def ensure(self, uid: int, gid: int, gpus: Sequence[int]) -> MpsControl:
        """The running control daemon for this user and GPU set, started if need be
        (as that user: it then serves only that user's jobs)."""
        name = key(uid, gpus)
        as_user = None if uid == os.geteuid() else uid
        control = self._control(name, as_user, None if as_user is None else gid)
        with self._lock:
            self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            (self.root / name).mkdir(mode=0o755, exist_ok=True)
            if control.daemons() and control.reachable():
                return control
            try:
                control.start(visible_devices=list(gpus))
            except GpuwardenError as e:
                raise MpsJobError(
                    f"cannot start an MPS daemon for GPU {','.join(map(str, gpus))}: {e}"
                ) from None
            log.info("started MPS control daemon %s for uid %s", name, uid)
            return control

    def server_pids(self) -> set[int]:
        """Pids of the MPS servers (and control daemons) started for our jobs: their
        memory is our jobs', not a foreign process's."""
        from gpuwarden.mps.state import read_mps_state

        root = str(self.root.resolve()) + os.sep
        return {
            d.pid
            for d in read_mps_state().daemons
            if d.pipe_dir is not None and os.path.abspath(d.pipe_dir).startswith(root)
        }

    def running(self) -> list[str]:
        """Names of the control daemons started here that still run."""
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name == SIM_BIN:
                continue
            with contextlib.suppress(GpuwardenError, OSError):
                if self._control(d.name, None, None).daemons():
                    out.append(d.name)
        return out

    def prune(self, in_use: Iterable[str]) -> list[str]:
        """Quit the control daemons no running job uses any more; returns their names."""
        keep = set(in_use)
        stopped = []
        with self._lock:
            for name in self.running():
                if name in keep:
                    continue
                try:
                    self._owned_control(name).stop()
                    stopped.append(name)
                    log.info("stopped MPS control daemon %s: no job uses it", name)
                except GpuwardenError as e:
                    log.warning("cannot stop MPS control daemon %s: %s", name, e)
        return stopped
