"""What the state store raises: a job or dependency that is not there, a compare-and-set
that lost (invariant 2), a database that cannot be used. Apart from ``store.py`` so that
the modules holding the store's SQL raise them without importing the store."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.errors import GpuwardenError, UsageError


class JobNotFound(UsageError):
    """No job with this id (never existed, or removed)."""

    exit_code = 2

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


class DependencyNotFound(UsageError):
    """``--after`` names a job that does not exist."""

    exit_code = 2

    def __init__(self, missing: Sequence[int]) -> None:
        ids = ", ".join(str(i) for i in missing)
        super().__init__(f"cannot depend on job {ids}: no such job")
        self.missing = tuple(missing)


class Conflict(GpuwardenError):
    """The job is not in a state that allows this (it moved on, or never could):
    compare-and-set lost, or the operation is wrong for the job's state."""

    exit_code = 1

    def __init__(
        self, message: str, *, job_id: int | None = None, state: str | None = None
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state


class StoreError(GpuwardenError):
    """The database cannot be used: not ours, newer than this code, disk full, locked."""

    exit_code = 3


class SchemaTooNew(StoreError):
    """The database was written by a newer gpuwarden; refusing to guess its meaning."""
