"""The per-job supervisor: the shim that runs one job and outlives the daemon.

``shim`` is the running supervisor, ``detach`` how a process becomes one, ``spawn`` how
the daemon starts one (``forkserver`` faster), ``control`` what the daemon asks of a
running one, ``__main__`` the entry point (``python -m gpuwarden.supervisor JOBDIR``).
It speaks to the daemon only through the job directory (``jobs/jobdir.py``) and signals,
and imports nothing of the daemon.
"""
