"""The job daemon: state store, API, scheduling loop and per-job supervisors."""
