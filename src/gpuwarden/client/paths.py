"""Where the daemon keeps its state, socket, config and per-job files.

Three modes, decided once from the environment so that a client and the daemon it
talks to agree without talking:

* ``home``: ``GPUWARDEN_HOME`` is set; everything lives below it, the socket included
  (``$GPUWARDEN_HOME/gpuwarden.sock``), so tests run isolated daemons side by side.
* ``system``: root, or any user on a machine with a system config
  (``/etc/gpuwarden/config.toml``): state in ``/var/lib/gpuwarden``, socket
  ``/run/gpuwarden.sock``. A non-root user on a configured machine resolves to the
  system daemon's socket, because the point of a system daemon is that every user's
  jobs go through the one queue; starting a private daemon beside it would defeat that.
* ``user``: state in ``$XDG_STATE_HOME/gpuwarden`` (default ``~/.local/state/gpuwarden``),
  socket ``$XDG_RUNTIME_DIR/gpuwarden.sock`` (under the state dir when there is no usable
  runtime dir), config in ``$XDG_CONFIG_HOME/gpuwarden/config.toml``.

``configured`` says whether a daemon is expected to exist already (``GPUWARDEN_HOME``
set, or a system config present); when it is False, client commands may start a
user-mode daemon on demand.

Unix socket paths are limited to 107 bytes; a deep ``GPUWARDEN_HOME`` can exceed that,
so whoever binds or connects should check ``len(bytes(socket)) < 108`` (or connect
relative to the directory)."""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "GPUWARDEN_HOME"
SYSTEM_HOME = Path("/var/lib/gpuwarden")
SYSTEM_SOCKET = Path("/run/gpuwarden.sock")
SYSTEM_CONFIG = Path("/etc/gpuwarden/config.toml")
SOCKET_NAME = "gpuwarden.sock"
MAX_SOCKET_PATH = 107  # bytes of sun_path, less its terminating NUL
DB_NAME = "state.db"
JOBS_DIR_NAME = "jobs"
LOCK_NAME = "daemon.lock"
CONFIG_NAME = "config.toml"

HOME, SYSTEM, USER = "home", "system", "user"


@dataclass(frozen=True)
class Paths:
    """Every path the daemon and its clients use; ``mode`` is home, system or user."""

    home: Path  # state directory
    socket: Path
    db: Path
    jobs_dir: Path  # one directory per job: logs, supervisor files
    config: Path
    lock: Path  # held (flock) by the running daemon: at most one per state directory
    configured: bool
    mode: str = USER

    def job_dir(self, job_id: int) -> Path:
        """The directory of one job's logs and supervisor files."""
        return self.jobs_dir / str(job_id)

    def check_socket(self) -> None:
        """One line when the socket path is too long for a unix socket (107 bytes)."""
        from gpuwarden.errors import UsageError

        size = len(os.fsencode(self.socket))
        if size > MAX_SOCKET_PATH:
            raise UsageError(
                f"the socket path {self.socket} is {size} bytes, longer than "
                f"a unix socket allows ({MAX_SOCKET_PATH}); use a shorter "
                "GPUWARDEN_HOME"
            )

    def highest_job_dir(self) -> int:
        """The highest job id with a directory under ``jobs_dir`` (0: none)."""
        try:
            names = [e.name for e in os.scandir(self.jobs_dir)]
        except OSError:
            return 0
        return max((int(n) for n in names if n.isascii() and n.isdigit()), default=0)

    def ensure(self) -> None:
        """Create the state and jobs directories. A system state dir is world-traversable
        (0755) and its jobs dir 0711: users reach their own job directory (which the
        launcher makes 0700 and theirs) but cannot list the others. User and home
        modes keep everything private (0700)."""
        shared = self.mode == SYSTEM
        self.home.mkdir(mode=0o755 if shared else 0o700, parents=True, exist_ok=True)
        self.jobs_dir.mkdir(mode=0o711 if shared else 0o700, exist_ok=True)
        self.socket.parent.mkdir(mode=0o755 if shared else 0o700, parents=True, exist_ok=True)


def _abs_dir(value: str | None) -> Path | None:
    """An XDG base directory value: only absolute paths count (XDG base dir spec)."""
    if not value:
        return None
    p = Path(value)
    return p if p.is_absolute() else None


def _user_home(env: Mapping[str, str], euid: int) -> Path:
    if env.get("HOME"):
        return Path(env["HOME"])
    try:
        return Path(pwd.getpwuid(euid).pw_dir)
    except KeyError:
        return Path("/tmp") / f"gpuwarden-{euid}"


def _runtime_dir(env: Mapping[str, str], euid: int) -> Path | None:
    """``$XDG_RUNTIME_DIR`` when it is a directory this user owns: after ``su user`` the
    variable often still names root's (``/run/user/0``), which the user cannot use."""
    d = _abs_dir(env.get("XDG_RUNTIME_DIR"))
    if d is None:
        return None
    try:
        st = d.stat()
    except OSError:
        return None
    if not d.is_dir() or st.st_uid != euid:
        return None
    return d


def user_cache_dir(env: Mapping[str, str] | None = None, euid: int | None = None) -> Path | None:
    """Where one command leaves what the next one of the same user may reuse (the fd
    tables of the device-file scan): ``$XDG_RUNTIME_DIR/gpuwarden`` when that runtime
    directory is this user's (emptied at every boot), else
    ``$XDG_CACHE_HOME/gpuwarden`` (``~/.cache/gpuwarden``) when the cache directory is
    this user's. Made owner-only; None where neither is this user's (``sudo`` keeps
    another user's HOME: root leaves nothing in it)."""
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    base = _runtime_dir(env, euid)
    if base is None:
        base = _abs_dir(env.get("XDG_CACHE_HOME")) or _user_home(env, euid) / ".cache"
    d = base / "gpuwarden"
    try:
        if not base.exists() and base.parent.stat().st_uid == euid:
            base.mkdir(mode=0o700)  # as the XDG spec says: made when missing
        if base.stat().st_uid != euid:
            return None
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
    except OSError:
        return None
    if not d.is_dir() or d.is_symlink() or st.st_uid != euid or st.st_mode & 0o077:
        return None
    return d


def resolve_paths(
    env: Mapping[str, str] | None = None,
    euid: int | None = None,
    *,
    system_config: Path = SYSTEM_CONFIG,
) -> Paths:
    """Resolve the paths for this environment and effective uid (see the module doc)."""
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    if env.get(HOME_ENV):
        home = Path(env[HOME_ENV]).absolute()
        return Paths(
            home=home,
            socket=home / SOCKET_NAME,
            db=home / DB_NAME,
            jobs_dir=home / JOBS_DIR_NAME,
            config=home / CONFIG_NAME,
            lock=home / LOCK_NAME,
            configured=True,
            mode=HOME,
        )
    has_system = system_config.is_file()
    if euid == 0 or has_system:
        return Paths(
            home=SYSTEM_HOME,
            socket=SYSTEM_SOCKET,
            db=SYSTEM_HOME / DB_NAME,
            jobs_dir=SYSTEM_HOME / JOBS_DIR_NAME,
            config=system_config,
            lock=SYSTEM_HOME / LOCK_NAME,
            configured=has_system,
            mode=SYSTEM,
        )
    user_home = _user_home(env, euid)
    state = _abs_dir(env.get("XDG_STATE_HOME")) or user_home / ".local" / "state"
    config = _abs_dir(env.get("XDG_CONFIG_HOME")) or user_home / ".config"
    home = state / "gpuwarden"
    runtime = _runtime_dir(env, euid)
    socket = (runtime if runtime is not None else home) / SOCKET_NAME
    return Paths(
        home=home,
        socket=socket,
        db=home / DB_NAME,
        jobs_dir=home / JOBS_DIR_NAME,
        config=config / "gpuwarden" / CONFIG_NAME,
        lock=home / LOCK_NAME,
        configured=False,
        mode=USER,
    )
