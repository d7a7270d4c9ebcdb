"""The job daemon: state store, API and scheduling loop; it starts and signals the per-job
supervisors of ``gpuwarden.supervisor``."""
