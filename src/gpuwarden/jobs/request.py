"""The submit request's fields, one table: each field's JSON type, bounds or choices,
default and help. The daemon's per-field checks (``check_fields``, for
``daemon/submission.spec_from_request``), the request's OpenAPI properties
(``daemon/openapi_components.py``), ``submit``'s options (``cli/submit.py``: one a
field, in the table's order, with its help and bounds), the ``JobSpec`` a submit makes
and how the jobs table keeps it (each stored field's ``column``: ``daemon/rows.py``) are
all read from it, so a bound or a column is written once. Rules between fields
(``cpus`` and ``no_numa``, a fractional ``mem``, services) stay code in the daemon.
Standard library and lower layers only: the CLI imports this at start."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.errors import UsageError
from gpuwarden.jobs.services import POLICIES
from gpuwarden.units import bounded_duration, bounded_size

GUARANTEED, BURSTABLE, BESTEFFORT = "guaranteed", "burstable", "besteffort"
QOS_CLASSES = (GUARANTEED, BURSTABLE, BESTEFFORT)
"""The QoS classes a job may ask for (sched/ ranks them; config's [limits] names them)."""

MAX_ID = 2**63 - 1  # a job id is an SQLite integer
MAX_COMMAND = 4096  # characters of a health or notify command
MAX_URL = 2048  # characters of a health URL
_COMMAND = f"a non-empty command of at most {MAX_COMMAND} characters"

# Kinds: how a field is written in JSON.
INTEGER = "integer"  # a whole number from lo to hi
BOOLEAN = "boolean"  # true or false, default false
CHOICE = "choice"  # one of choices
STRING = "string"  # text of min_length to max_length; pattern where shape names it
STRINGS = "strings"  # a list of strings
ARGV = "argv"  # a command: a list of strings, the first not empty, no NUL anywhere
ENV = "env"  # an object of strings
IDS = "ids"  # a list of integers from lo to hi, at least min_items of them
SIZE = "size"  # bytes (at least 1), or text such as 14G that the daemon parses
DURATION = "duration"  # seconds (above 0 when positive), or text such as 2h
KINDS = (INTEGER, BOOLEAN, CHOICE, STRING, STRINGS, ARGV, ENV, IDS, SIZE, DURATION)

OPTIONS = "options"
"""The ``column`` of a field kept in the job's options document (one JSON column, by
field name): a new stored option needs no migration, and a row written before it existed
reads as its default."""


@dataclass(frozen=True)
class Field:
    """One field of the submit request. ``nullable``: null is taken as absent (the
    default); else null is refused. ``shape`` completes "NAME must be ..." in errors (a
    string's pattern is checked only where it is given). ``example``: a size's or a
    duration's, for errors. ``metavar``: what ``submit --help`` shows for the value."""

    name: str
    kind: str
    help: str
    default: Any = None
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    shape: str | None = None
    min_items: int = 0
    positive: bool = False
    example: str = ""
    nullable: bool = True
    required: bool = False
    column: str | None = None
    metavar: str | None = None

    @property
    def stored(self) -> bool:
        return self.column is not None

    @property
    def optional(self) -> bool:
        """Kept in the job's options document, not a column of its own."""
        return self.column == OPTIONS


def _label(name: str, help: str, column: str) -> Field:
    return Field(name, STRING, help, min_length=1, max_length=200, column=column)


FIELDS: dict[str, Field] = {
    f.name: f
    for f in (
        Field(
            "command",
            ARGV,
            "The command and its arguments, run without a shell.",
            required=True,
            nullable=False,
            column="command",
        ),
        Field(
            "env",
            ENV,
            "The job's environment (credential-looking variables are dropped "
            "unless env_keep names them).",
            default={},
            nullable=False,
        ),
        Field(
            "mem",
            SIZE,
            "GPU memory per GPU: a size (14G, 512MiB), a fraction of a GPU "
            "(0.5), or auto: learned from earlier runs with the same "
            "--key/--name. Without: a whole idle GPU.",
            example="14G",
            column="mem",
        ),
        Field(
            "gpus",
            INTEGER,
            "How many GPUs.",
            default=1,
            lo=1,
            hi=64,
            nullable=False,
            column="gpu_count",
        ),
        Field(
            "gpu_ids",
            IDS,
            "Only these GPUs (their indices).",
            lo=0,
            min_items=1,
            shape="a non-empty list of GPU indices",
            column="gpu_ids",
        ),
        _label("name", "A name to recognise the job by.", "name"),
        _label("group", "A group, for `cancel --group` and `ps`.", "job_group"),
        _label("key", "Idempotency key: resubmitting it returns the existing job.", "job_key"),
        Field(
            "after",
            IDS,
            "Start only after these jobs succeeded.",
            default=(),
            lo=1,
            hi=MAX_ID,
            shape="a list of job ids",
            column="after_ids",
        ),
        Field(
            "after_any",
            IDS,
            "Start only after these jobs ended, however they ended.",
            default=(),
            lo=1,
            hi=MAX_ID,
            shape="a list of job ids",
            column="after_any_ids",
        ),
        Field(
            "after_fail",
            IDS,
            "Start only after these jobs ended without succeeding.",
            default=(),
            lo=1,
            hi=MAX_ID,
            shape="a list of job ids",
            column="after_fail_ids",
        ),
        Field(
            "timeout",
            DURATION,
            "Kill the job after this long (2h, 30m).",
            positive=True,
            example="2h",
            column="timeout",
        ),
        Field(
            "exclusive",
            BOOLEAN,
            "Take the GPU(s) alone.",
            default=False,
            nullable=False,
            column="exclusive",
        ),
        Field(
            "cwd",
            STRING,
            "Working directory.",
            default="/",
            pattern="^/",
            shape="an absolute path",
            nullable=False,
            column="cwd",
        ),
        Field(
            "env_keep",
            STRINGS,
            "Keep this credential-looking variable (repeatable).",
            default=(),
            nullable=False,
        ),
        Field(
            "priority",
            INTEGER,
            "Higher starts first.",
            default=0,
            lo=-1000,
            hi=1000,
            nullable=False,
            column="priority",
        ),
        Field(
            "comment",
            STRING,
            "A note for whoever looks at the job (show, ps --json): what it is for, whom to ask.",
            min_length=1,
            max_length=500,
            column=OPTIONS,
            metavar="TEXT",
        ),
        Field(
            "requeue_on_reboot",
            BOOLEAN,
            "Queue the job again if the machine reboots while it runs.",
            default=False,
            nullable=False,
            column="requeue_on_reboot",
        ),
        Field(
            "qos",
            CHOICE,
            "guaranteed: never preempted; burstable (default): may grow to "
            "--mem-limit; besteffort: preempted first.",
            default=BURSTABLE,
            choices=QOS_CLASSES,
            nullable=False,
            column="qos",
        ),
        Field(
            "mem_limit",
            SIZE,
            "Burstable: how far past --mem the job may grow.",
            example="14G",
            column="mem_limit",
        ),
        Field(
            "grace",
            DURATION,
            "SIGTERM to SIGKILL on cancel or preemption (default: the daemon's).",
            example="2h",
            column="grace",
        ),
        Field(
            "no_requeue",
            BOOLEAN,
            "If preempted, end as cancelled instead of queueing again.",
            default=False,
            nullable=False,
            column="no_requeue",
        ),
        Field(
            "retries",
            INTEGER,
            "Retry a CUDA OOM this many times, with the budget it showed "
            "it needs (default: the daemon's oom_retries, 1, for jobs "
            "with --mem; 0: off).",
            lo=0,
            hi=100,
            column="retries",
        ),
        Field(
            "checkpoint",
            BOOLEAN,
            "Set GPUWARDEN_PREEMPT_FILE: it appears before a preemption.",
            default=False,
            nullable=False,
            column="checkpoint",
        ),
        Field(
            "mps",
            BOOLEAN,
            "Run as an MPS client: the driver enforces --mem as a hard limit.",
            default=False,
            nullable=False,
            column="mps",
        ),
        Field(
            "sm_percent",
            INTEGER,
            "With --mps: the share of the GPU's SMs the job may use.",
            lo=1,
            hi=100,
            column="sm_percent",
        ),
        Field(
            "cpus",
            INTEGER,
            "Hold this many CPU cores near the GPUs alone (among gpuwarden jobs).",
            lo=1,
            hi=4096,
            column="cpus",
        ),
        Field(
            "no_numa",
            BOOLEAN,
            "No CPU affinity and no NUMA memory binding.",
            default=False,
            nullable=False,
            column="no_numa",
        ),
        Field(
            "array",
            STRING,
            "An array: one job a task (0-99, 1,3,5-9, 0-20:5), each with "
            "GPUWARDEN_ARRAY_INDEX; %N: at most N at once. Prints the "
            "array's id; a task is ID_INDEX (12_7).",
            min_length=1,
            max_length=1000,
            pattern="^[0-9][0-9,:-]*(%[0-9]+)?$",
            metavar="INDICES[%N]",
        ),
        Field(
            "notify",
            STRING,
            "Run CMD (with /bin/sh, as you) once the job ends, however it "
            "ends, the job's JSON on its standard input.",
            min_length=1,
            max_length=MAX_COMMAND,
            shape=_COMMAND,
            column="notify",
            metavar="CMD",
        ),
        # The daemon checks a profile with gpus/model.MIG_PROFILE (a GPU fact, a layer
        # above); the unit tests hold this pattern to it.
        Field(
            "mig",
            STRING,
            "A MIG instance of this profile (e.g. 3g.40gb): on a GPU in MIG "
            "mode each instance is a place of its own.",
            pattern=r"^[1-8]g\.[1-9][0-9]*gb$",
            column="mig",
            metavar="PROFILE",
        ),
        Field(
            "attach",
            STRING,
            "The caller starts the command itself once the job is "
            "reserved, and reports its start and end; names the launcher "
            '(e.g. "ray job ID").',
            min_length=1,
            max_length=200,
            column="attach",
        ),
        Field(
            "restart",
            CHOICE,
            "A service: start it again after it ends: on-failure "
            "(non-zero exit, a signal, a failed health check) or always "
            "(any end but cancel).",
            choices=(*POLICIES, "no"),
        ),
        Field(
            "restart_limit",
            STRING,
            "Give it up after N restarts within a window (default 5/10m).",
            pattern="^[0-9]+/",
            shape="N/DURATION, e.g. 5/10m",
        ),
        Field(
            "health_cmd",
            STRING,
            "Health check: a shell command run as you; non-zero exit is a failure.",
            min_length=1,
            max_length=MAX_COMMAND,
            shape=_COMMAND,
        ),
        Field(
            "health_url",
            STRING,
            "Health check: an http(s) URL; not 2xx is a failure.",
            max_length=MAX_URL,
            pattern="^https?://",
            shape="an http:// or https:// URL",
        ),
        Field(
            "health_interval",
            DURATION,
            "Between health checks (default 30s).",
            positive=True,
            example="30s",
        ),
        Field(
            "health_grace",
            DURATION,
            "After each start, before the first health check (default 60s).",
            example="60s",
        ),
    )
}
"""Every field of the submit request, in the order the daemon checks them."""

OPTION_FIELDS = tuple(f for f in FIELDS.values() if f.optional)
"""The fields kept in the job's options document (``column=OPTIONS``), in table order."""

OPTION_DEFAULTS = {f.name: f.default for f in OPTION_FIELDS}
"""The options document's fields and their defaults: ``show`` says each one that is not."""

EDITABLE = ("mem", "mem_limit", "priority", "qos", "gpus", "timeout", "name")
"""What ``edit`` may change in a queued or held job (checked as submit checks them)."""


def _int(value: Any, name: str, lo: int | None, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            raise UsageError(f"{name} must be at least {lo}")
        if lo is None:
            raise UsageError(f"{name} must be at most {hi}")
        raise UsageError(f"{name} must be between {lo} and {hi}")
    return value


def _or(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


def _string(f: Field, value: Any) -> str:
    lo, hi = f.min_length or 0, f.max_length
    if (
        not isinstance(value, str)
        or len(value) < lo
        or (hi is not None and len(value) > hi)
        or (f.shape is not None and f.pattern is not None and not re.match(f.pattern, value))
    ):
        what = f.shape or ("a non-empty string" if lo else "a string") + (
            "" if hi is None else f" of at most {hi} characters"
        )
        raise UsageError(f"{f.name} must be {what}")
    return value


def check(f: Field, value: Any) -> Any:
    """One field's value, checked against its entry (not null: ``check_fields`` takes null
    for the default where the field allows it); one UsageError line when it is not."""
    if f.kind == INTEGER:
        return _int(value, f.name, f.lo, f.hi)
    if f.kind == BOOLEAN:
        if not isinstance(value, bool):
            raise UsageError(f"{f.name} must be true or false")
        return value
    if f.kind == CHOICE:
        if not isinstance(value, str) or value not in f.choices:
            raise UsageError(f"{f.name} must be {_or(f.choices)}")
        return value
    if f.kind == STRING:
        return _string(f, value)
    if f.kind in (STRINGS, ARGV):
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{f.name} must be a list of strings")
        if f.kind == ARGV:
            if not value or not value[0]:
                raise UsageError(f"{f.name} must not be empty")
            if any("\0" in arg for arg in value):
                raise UsageError(f"{f.name} must not contain NUL characters")
        return tuple(value)
    if f.kind == ENV:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise UsageError(f"{f.name} must be an object of strings")
        return value
    if f.kind == IDS:
        if not isinstance(value, list) or len(value) < f.min_items:
            raise UsageError(f"{f.name} must be {f.shape}")
        return tuple(_int(i, f.name, f.lo, f.hi) for i in value)
    if f.kind == SIZE:  # text is the daemon's to parse: a fraction needs its GPUs
        return (
            value
            if isinstance(value, str)
            else bounded_size(value, f.name, positive=True, example=f.example)
        )
    if f.kind == DURATION:
        return bounded_duration(value, f.name, positive=f.positive, example=f.example)
    raise AssertionError(f"field {f.name}: unknown kind {f.kind}")


def check_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """Every field of a submit request, checked by the table (unknown fields refused,
    absent ones and allowed nulls given their default): lists as tuples, durations in
    seconds, sizes as bytes or their text. What no one field decides is the caller's."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise UsageError(f"unknown field(s): {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for name, f in FIELDS.items():
        if name not in body:
            if f.required:
                raise UsageError(f"{name} is required")
            out[name] = f.default
        elif body[name] is None and f.nullable:
            out[name] = f.default
        else:
            out[name] = check(f, body[name])
    return out
