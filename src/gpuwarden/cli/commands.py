"""Every command: its module, its attribute and its one-line help, so the group imports a
command's module only when it is invoked and ``--help`` stays fast."""

# name -> (module, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "status": ("gpuwarden.cli.status", "status", "Every GPU and GPU process, with leaks."),
    "leaks": ("gpuwarden.cli.leaks", "leaks", "Find leaked GPU memory and hidden holders."),
    "reap": ("gpuwarden.cli.leaks", "reap", "Kill what leaks memory and prove it came back."),
    "doctor": ("gpuwarden.cli.doctor", "doctor", "Diagnose the machine: findings and fixes."),
    "select": ("gpuwarden.cli.select", "select", "Print CUDA_VISIBLE_DEVICES for the best GPUs."),
    "exec": ("gpuwarden.cli.select", "exec_", "Run a command on the best GPUs, capped."),
    "gpu": ("gpuwarden.cli.settings", "gpu", "GPU settings (root): compute mode; drain a GPU."),
    "mps": ("gpuwarden.cli.mps", "mps", "Start, stop and inspect the MPS daemon (root)."),
    "daemon": ("gpuwarden.cli.daemon", "daemon", "Start, stop or check the job daemon."),
    "config": ("gpuwarden.cli.config", "config", "Check the daemon's config file."),
    "completion": (
        "gpuwarden.cli.completion",
        "completion",
        "Shell completion script: bash, zsh or fish.",
    ),
    "man": ("gpuwarden.cli.manpage", "man", "The manual page: every command, exit codes."),
    "submit": ("gpuwarden.cli.submit", "submit", "Queue a command; prints its job id."),
    "ps": ("gpuwarden.cli.ps", "ps", "The job queue."),
    "show": ("gpuwarden.cli.jobs", "show", "One job, with its events."),
    "logs": ("gpuwarden.cli.jobs", "logs", "A job's stdout or stderr (-f to follow)."),
    "cancel": ("gpuwarden.cli.jobs", "cancel", "Cancel jobs and their process trees."),
    "wait": ("gpuwarden.cli.jobs", "wait", "Wait for jobs; exit with their exit code."),
    "hold": ("gpuwarden.cli.jobs", "hold", "Keep queued jobs from starting."),
    "edit": ("gpuwarden.cli.edit", "edit", "Change a queued or held job's request."),
    "release": ("gpuwarden.cli.jobs", "release", "Let held jobs start."),
    "retry": ("gpuwarden.cli.jobs", "retry", "Queue failed or cancelled jobs again."),
    "unreserve": (
        "gpuwarden.cli.jobs",
        "unreserve",
        "Admins: clear memory a job holds after a leak.",
    ),
    "report": (
        "gpuwarden.cli.report",
        "report",
        "Accounting: GPU-hours, memory, OOMs, waits per user.",
    ),
    "rm": ("gpuwarden.cli.jobs", "rm", "Remove ended jobs (cancel waiting ones first)."),
    "exporter": ("gpuwarden.cli.exporter", "exporter", "Prometheus metrics on HTTP."),
    "clean": ("gpuwarden.cli.jobs", "clean", "Remove ended jobs older than a duration."),
    "top": ("gpuwarden.cli.top", "top", "Live view of GPUs, processes and jobs."),
    "web": ("gpuwarden.cli.web", "web", "The daemon's web page, for you, on a local port."),
    "cluster": ("gpuwarden.cli.cluster", "cluster", "Budgets on a Ray cluster (gpuwarden[ray])."),
}
