"""gpuwarden.guard: guard rails to use inside a job's own Python code — OOM retry,
memory budgets, a GPU worker pool and budget-aware model loading. Importing it does not
import torch; what needs torch imports it when called."""

from gpuwarden.guard.budgets import Budget, BudgetExceeded, BudgetUsage, MemoryBudgets
from gpuwarden.guard.loading import DoesNotFit, Loaded, MissingDependency, load_within_budget
from gpuwarden.guard.oom import OomRetry, free_memory, is_oom, oom_retry
from gpuwarden.guard.pool import BrokenPool, GpuPool, WorkerDied

__all__ = [
    "BrokenPool",
    "Budget",
    "BudgetExceeded",
    "BudgetUsage",
    "DoesNotFit",
    "GpuPool",
    "Loaded",
    "MemoryBudgets",
    "MissingDependency",
    "OomRetry",
    "WorkerDied",
    "free_memory",
    "is_oom",
    "load_within_budget",
    "oom_retry",
]
