"""Screens drawn from the ``--json`` documents: the same lines whether the CLI took the
snapshot, ``top`` shows it, or the daemon drew them for its caller. The status screens
(on the path people run all day) use the standard library alone."""
