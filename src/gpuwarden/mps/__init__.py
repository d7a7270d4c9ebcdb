"""MPS: its facts (state.py), its spellings (limits.py) and its control daemons
(control.py), below the daemon, which runs one per user and GPU set for --mps jobs."""
