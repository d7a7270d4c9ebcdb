"""Typed errors a user can cause; the CLI turns each into one line and an exit code."""

from __future__ import annotations


class GpuwardenError(Exception):
    """Base of every error that should reach the user as one clear line."""

    exit_code = 2


class UsageError(GpuwardenError):
    """Bad input from the user: malformed size, unknown GPU, impossible request."""

    exit_code = 2


class BackendUnavailable(GpuwardenError):
    """No GPU backend could be opened (NVML missing, scenario unreadable)."""

    exit_code = 3


class PermissionDenied(GpuwardenError):
    """The operation needs privileges the caller does not have."""

    exit_code = 4


class NothingFits(GpuwardenError):
    """A placement request that no GPU can satisfy right now."""

    exit_code = 1
