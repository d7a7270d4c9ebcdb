"""Between SQLite rows and the model's values: a job or a hold read from its row and
written to it (one encoder a column), and a request refused when the database could not
hold it faithfully. Apart from the store, so that its transactions read as the SQL they run."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from gpuwarden.errors import UsageError
from gpuwarden.jobs.arrays import Member
from gpuwarden.jobs.model import (
    ENV_NOT_READ,
    STATES,
    TERMINAL,
    AttemptUse,
    Event,
    Hold,
    Job,
    JobSpec,
    NewHold,
)
from gpuwarden.jobs.request import ARGV, BOOLEAN, FIELDS, IDS, OPTION_FIELDS, OPTIONS, Field
from gpuwarden.jobs.services import Service

# Transition fields stored as JSON lists (the others as they are).
_JSON_FIELDS = frozenset({"gpus", "gpu_uuids", "cpu_set"})
_INT64 = (-(1 << 63), (1 << 63) - 1)


def json_ids(values: Iterable[Any]) -> str:
    return json.dumps(list(values))


def _json_list(name: str, value: object) -> str:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence")
    return json.dumps(list(value))


def field_value(name: str, value: object) -> object:
    """A transition field's value as its column stores it."""
    return _json_list(name, value) if name in _JSON_FIELDS else value


def ints_ok(*values: int | None) -> bool:
    return all(v is None or _INT64[0] <= v <= _INT64[1] for v in values)


def check_spec(spec: JobSpec) -> None:
    """Reject what the database cannot hold faithfully (bad input, not a crash)."""
    if not spec.command or not all(isinstance(a, str) for a in spec.command):
        raise UsageError("a job needs a command (a non-empty list of strings)")
    for label, text in (
        ("user", spec.user),
        ("cwd", spec.cwd),
        ("name", spec.name),
        ("group", spec.group),
        ("key", spec.key),
        ("attach", spec.attach),
        ("notify", spec.notify),
    ):
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"job {label} is not valid UTF-8") from None
        if "\0" in text:
            raise UsageError(f"job {label} contains a NUL character")
    ints = (
        spec.uid,
        spec.gid,
        spec.mem,
        spec.gpus,
        spec.priority,
        spec.mem_limit,
        spec.retries,
        spec.sm_percent,
        spec.cpus,
        *spec.groups,
        *(spec.gpu_ids or ()),
        *spec.after,
        *spec.after_any,
        *spec.after_fail,
    )
    if not ints_ok(*ints):
        raise UsageError("a number in the job request is out of range")


# The request's fields that a column keeps as their JobSpec attribute, by how the
# column holds them (jobs/request.py names each one's column): as they are, 0 or 1, or
# a JSON list (an absent one: the field's default). The rest of the stored fields are
# kept in the options document, by name.
_STORED = [(f, f.column) for f in FIELDS.values() if f.column is not None and not f.optional]
_AS_IS = [(f.name, c) for f, c in _STORED if f.kind not in (BOOLEAN, ARGV, IDS)]
_FLAGS = [(f.name, c) for f, c in _STORED if f.kind == BOOLEAN]
_LISTS = [(f.name, c, f.default) for f, c in _STORED if f.kind in (ARGV, IDS)]


def spec_columns(spec: JobSpec) -> dict[str, object]:
    """A job's request as its columns store it (``row_to_job`` reads them back)."""
    return {
        "user": spec.user,
        "uid": spec.uid,
        "gid": spec.gid,
        "groups": json_ids(spec.groups),
        "env": json.dumps(dict(spec.env), sort_keys=True),
        "mem_auto": int(spec.mem_auto),
        "service": None if spec.service is None else spec.service.dumps(),
        **{column: getattr(spec, name) for name, column in _AS_IS},
        **{column: int(getattr(spec, name)) for name, column in _FLAGS},
        **{
            column: None if (v := getattr(spec, name)) is None else json_ids(v)
            for name, column, _ in _LISTS
        },
        OPTIONS: json.dumps(option_values(spec), sort_keys=True),
    }


def option_values(spec: JobSpec, *, defaults: bool = False) -> dict[str, Any]:
    """The fields of the options document as JSON values: those that are not their
    default (what the column keeps), or with ``defaults`` every one (the job's JSON)."""
    out: dict[str, Any] = {}
    for f in OPTION_FIELDS:
        value = getattr(spec, f.name)
        if defaults or value != f.default:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _option(f: Field, doc: dict[str, Any]) -> Any:
    if f.name not in doc:  # a row from before the field existed, or its default
        return f.default
    value = doc[f.name]
    return tuple(value) if isinstance(value, list) else value


def hold_columns(hold: NewHold) -> dict[str, object]:
    """What an ended attempt leaves reserved as its columns store it (``row_to_hold``
    reads them back)."""
    return {
        "gpu_uuids": json_ids(hold.gpu_uuids),
        "budget": hold.budget,
        "pids": json_ids(sorted(hold.pids)),
        "baseline": json.dumps(dict(hold.baseline)),
        "exited_at": hold.exited_at,
        "starts": json.dumps({str(k): v for k, v in sorted(hold.starts.items())}),
    }


def _stored_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The JobSpec attributes of the request's stored fields, from their columns."""
    out: dict[str, Any] = {name: row[column] for name, column in _AS_IS}
    out.update((name, bool(row[column])) for name, column in _FLAGS)
    out.update(
        (
            name,
            (None if default is None else tuple(default))
            if row[column] is None
            else _loads_tuple(row[column]),
        )
        for name, column, default in _LISTS
    )
    options = row[OPTIONS]
    doc = {} if options == "{}" else json.loads(options)  # the common case, no parser
    out.update((f.name, _option(f, doc)) for f in OPTION_FIELDS)
    return out


def _loads_tuple(text: str | None) -> tuple[Any, ...]:
    if text is None or text == "[]":  # the common case, without the JSON parser
        return ()
    return tuple(json.loads(text))


def row_to_hold(row: sqlite3.Row) -> Hold:
    return Hold(
        id=row["id"],
        job_id=row["job_id"],
        attempt=row["attempt"],
        gpu_uuids=tuple(json.loads(row["gpu_uuids"])),
        budget=row["budget"],
        pids=tuple(json.loads(row["pids"])),
        baseline={str(k): int(v) for k, v in json.loads(row["baseline"]).items()},
        exited_at=row["exited_at"],
        released_at=row["released_at"],
        how=row["how"],
        leak=row["leak"],
        starts={int(k): float(v) for k, v in json.loads(row["starts"] or "{}").items()},
    )


def row_to_job(raw: sqlite3.Row, events: Sequence[Event], hold: Hold | None = None) -> Job:
    # A Row finds a column by name by comparing it with every column's name in turn:
    # 60 lookups over 60 columns were most of the time of listing 10,000 jobs.
    row = dict(zip(raw.keys(), raw, strict=True))
    spec = JobSpec(
        user=row["user"],
        uid=row["uid"],
        gid=row["gid"],
        groups=_loads_tuple(row["groups"]),
        env=ENV_NOT_READ
        if row["env"] is None
        else {}
        if row["env"] == "{}"
        else dict(json.loads(row["env"])),
        mem_auto=bool(row["mem_auto"]),
        service=Service.loads(row["service"]),
        array=None
        if row["array_id"] is None
        else Member(row["array_id"], row["array_index"], row["array_limit"]),
        **_stored_fields(row),
    )
    return Job(
        id=row["id"],
        spec=spec,
        state=row["state"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        gpus=_loads_tuple(row["gpus"]),
        gpu_uuids=_loads_tuple(row["gpu_uuids"]),
        budget=row["budget"],
        peak_memory=row["peak_memory"],
        allocated_peak=row["allocated_peak"],
        exit_code=row["exit_code"],
        reason=row["reason"],
        supervisor_pid=row["supervisor_pid"],
        supervisor_start=row["supervisor_start"],
        boot_id=row["boot_id"],
        attempts=row["attempts"],
        preempting_at=row["preempting_at"],
        preemptions=row["preemptions"],
        oom_retries=row["oom_retries"],
        retry_mem=row["retry_mem"],
        retry_ceiling=row["retry_ceiling"],
        ceiling_until=row["ceiling_until"],
        oom_tried=row["oom_tried"],
        oom_need=row["oom_need"],
        context=row["context"],
        not_before=row["not_before"],
        kill_reason=row["kill_reason"],
        release=hold,
        cpu_set=_loads_tuple(row["cpu_set"]),
        restarts=row["restarts"],
        health_failures=row["health_failures"],
        earlier=AttemptUse(
            row["earlier_gpu_seconds"], row["earlier_reserved"], row["earlier_used"]
        ),
        events=tuple(events),
    )


def keep_attempt_use(
    row: sqlite3.Row, state: str, now: float, sets: list[str], args: list[Any]
) -> tuple[list[str], list[Any]]:
    """Add what the attempt being cleared used (its start to its end, or to now while it
    still runs) to the job's earlier attempts' figures, in the same UPDATE."""
    end = row["ended_at"] if state in TERMINAL and row["ended_at"] is not None else now
    seconds = max(end - row["started_at"], 0.0)
    gpus = max(len(json.loads(row["gpus"] or "[]")), 1)
    return (
        [
            *sets,
            "earlier_gpu_seconds = earlier_gpu_seconds + ?",
            "earlier_reserved = earlier_reserved + ?",
            "earlier_used = earlier_used + ?",
        ],
        [
            *args,
            seconds * gpus,
            seconds * gpus * (row["budget"] or 0),
            seconds * gpus * (row["peak_memory"] or 0),
        ],
    )


def states_arg(states: str | Iterable[str]) -> tuple[str, ...]:
    """One state or several; a bare string is one state, not its characters."""
    out = (states,) if isinstance(states, str) else tuple(states)
    unknown = [s for s in out if s not in STATES]
    if unknown:
        raise ValueError(f"unknown job state(s): {', '.join(unknown)}")
    return out
