"""The simulated GPU world: scenario files, the allocation registry, and the job helper."""
