"""Scheduling policy: pure functions from (GPU state, queue) to decisions."""
