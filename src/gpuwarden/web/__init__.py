"""The web page: GPU memory over time stacked by job and user, the queue, and a page per
job with its memory against its budget and its events. Served by the daemon (on its
unix socket, and read-only to anyone on ``web_listen`` when set) and, for one user, by
the local proxy ``gpuwarden web``."""
