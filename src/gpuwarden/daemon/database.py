"""The daemon's SQLite file: created owner-only, opened in WAL mode with the schema
migrated, and used one transaction at a time. ``Store`` (``daemon/store.py``) runs its
job queries on it.

Decisions, and why:

* WAL journal: readers never block the writer and a crash leaves the database at the
  last commit.
* ``synchronous=FULL`` (the default here): each commit fsyncs the WAL, so a transition
  survives a power loss or kernel crash too, not just a daemon crash. With ``NORMAL``
  the last commits could roll back after a power loss while the world already saw their
  action (a job started, a job finished and wrote results), and after reboot the job
  would run again: exactly the duplicate invariant 3 forbids. The price is one fsync
  per transition (around a millisecond on an SSD), far under the 30 ms submit→start
  goal. ``NORMAL`` is still accepted for throwaway stores (benchmarks, property tests).
* Threads: one shared connection (``check_same_thread=False``) behind a lock, not one
  connection per thread. SQLite admits one writer at a time anyway, so per-thread
  connections would only trade our lock for SQLite's busy handler (sleep and retry,
  with latency spikes and ``database is locked`` under load); a thread pool that
  churns threads would also leak connections. Behind the lock each call is short, sees
  every earlier commit, and never waits on itself. Other *processes* (the CLI in tests,
  a second daemon that lost the lock race) are handled by ``BEGIN IMMEDIATE`` plus a
  busy timeout: the write lock is taken before the compare in compare-and-set.
  After ``fork`` the child opens its own connection (SQLite connections must not
  cross a fork).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpuwarden.daemon.schema import MIGRATIONS, Migration, migrate
from gpuwarden.daemon.store_errors import StoreError


class Database:
    """One SQLite file, migrated to this version's schema, and its transactions: one
    connection behind a lock (thread-safe), a fresh one after fork; several processes
    may open the same file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 10.0,
        migrations: Sequence[Migration] | None = None,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        self.path = Path(path)
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._migrations = list(MIGRATIONS if migrations is None else migrations)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._create_file()
        self._conn: sqlite3.Connection | None = None
        self._conn = self._open()

    def _create_file(self) -> None:
        """Create the database owner-only (it holds job environments), and only create
        it: closing a descriptor of a file this process has open in SQLite drops every
        POSIX lock the process holds on it (the daemon opens two stores), and the next
        process to close a connection would delete the WAL under the daemon's writes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return
        except OSError as e:
            raise StoreError(f"cannot open state database {self.path}: {e.strerror or e}") from None
        os.close(fd)

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open state database {self.path}: {e}") from None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"state database {self.path} cannot use WAL mode "
                    f"(got {mode}); is it on a network filesystem?"
                )
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, self._migrations, self.path)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise StoreError(f"state database {self.path} is unusable: {e}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held by a thread
        that does not exist here) and a fresh connection (SQLite's must not cross a
        fork; the inherited one is left alone, not closed, so the parent's locks hold)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conn = self._open()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("the state store is closed")
        return self._conn

    @contextmanager
    def _tx(self, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction under the lock. Writes take the write lock up front
        (``BEGIN IMMEDIATE``) so a compare-and-set cannot interleave with another
        process; reads are one snapshot, so a job and its events agree."""
        if os.getpid() != self._pid:
            self._after_fork()
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError as e:
                raise StoreError(f"state database {self.path}: {e}") from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                self._roll_back(conn)
                # Locked too long, disk full, I/O error, corrupt file: the database's
                # trouble, not a bug here (integrity and programming errors stay as they are).
                if type(e) in (sqlite3.OperationalError, sqlite3.DatabaseError):
                    raise StoreError(f"state database {self.path}: {e}") from None
                raise

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        """End a failed transaction. If even that fails (the disk is full, the file is
        gone), the connection is replaced, so one bad moment cannot leave every later
        transaction failing with "cannot start a transaction within a transaction"."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            self._conn = None
            with contextlib.suppress(StoreError):
                self._conn = self._open()

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child never opened one of its own
            self._conn = None
            return
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
