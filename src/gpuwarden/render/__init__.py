"""Screens drawn from the ``--json`` documents, with the standard library alone: the
same lines whether the CLI took the snapshot or the daemon drew them for its caller."""
