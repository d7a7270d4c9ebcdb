"""gpuwarden.guard: guard rails to use inside a job's own Python code. Importing it does
not import torch; what needs torch imports it when called."""

from gpuwarden.guard.oom import OomRetry, free_memory, is_oom, oom_retry

__all__ = ["OomRetry", "free_memory", "is_oom", "oom_retry"]
