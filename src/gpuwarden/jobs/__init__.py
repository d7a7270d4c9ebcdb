"""The job domain, below the daemon: what a job's states and events are."""
