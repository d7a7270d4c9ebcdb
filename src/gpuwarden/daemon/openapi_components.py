"""The parts the API's OpenAPI document (daemon/openapi.py) is built of, as OpenAPI's
components are: the schemas of the job document and of the request bodies (a submit's
properties come from the table of request fields, jobs/request.py), the error answers,
and the path and query parameters. What a job, a request or a parameter looks like
changes apart from which routes there are and what each one does, so the document
keeps only the routes, their summaries and the answers particular to one route."""

from __future__ import annotations

from typing import Any

from gpuwarden.jobs.model import STATES
from gpuwarden.jobs.request import (
    ARGV,
    BOOLEAN,
    CHOICE,
    DURATION,
    EDITABLE,
    ENV,
    FIELDS,
    IDS,
    INTEGER,
    OPTION_FIELDS,
    QOS_CLASSES,
    SIZE,
    STRING,
    STRINGS,
    Field,
)

_NULL = {"type": "null"}


def field_schema(f: Field) -> dict[str, Any]:
    """The field's JSON Schema (OpenAPI 3.1), as ``request.check`` reads it: null only where
    it stands for absent; the help as its description."""
    s: dict[str, Any]
    if f.kind == INTEGER:
        s = {
            "type": "integer",
            **({} if f.lo is None else {"minimum": f.lo}),
            **({} if f.hi is None else {"maximum": f.hi}),
        }
    elif f.kind == BOOLEAN:
        s = {"type": "boolean"}
    elif f.kind == CHOICE:
        s = {"enum": list(f.choices)}
    elif f.kind == STRING:
        s = {
            "type": "string",
            **({} if f.min_length is None else {"minLength": f.min_length}),
            **({} if f.max_length is None else {"maxLength": f.max_length}),
            **({} if f.pattern is None else {"pattern": f.pattern}),
        }
    elif f.kind == STRINGS:
        s = {"type": "array", "items": {"type": "string"}}
    elif f.kind == ARGV:
        s = {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "prefixItems": [{"type": "string", "minLength": 1}],
        }
    elif f.kind == ENV:
        s = {"type": "object", "additionalProperties": {"type": "string"}}
    elif f.kind == IDS:
        item = {
            "type": "integer",
            **({} if f.lo is None else {"minimum": f.lo}),
            **({} if f.hi is None else {"maximum": f.hi}),
        }
        s = {"type": "array", "items": item, **({"minItems": f.min_items} if f.min_items else {})}
    elif f.kind == SIZE:
        s = {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}]}
    elif f.kind == DURATION:
        s = {
            "oneOf": [
                {"type": "number", **({"exclusiveMinimum": 0} if f.positive else {"minimum": 0})},
                {"type": "string"},
            ]
        }
    else:
        raise AssertionError(f"field {f.name}: unknown kind {f.kind}")
    if f.nullable:
        s = {"oneOf": [*s["oneOf"], _NULL]} if "oneOf" in s else {"oneOf": [s, _NULL]}
    return {**s, "description": f.help}


def properties() -> dict[str, Any]:
    """The submit request's OpenAPI properties, one a field."""
    return {name: field_schema(f) for name, f in FIELDS.items()}


_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_EVENT = {
    "type": "object",
    "properties": {
        "at": {"type": "string"},
        "kind": {"type": "string"},
        "detail": {"type": ["string", "null"]},
    },
}
JOB = {
    "type": "object",
    "required": [
        "id",
        "user",
        "name",
        "state",
        "command",
        "gpus",
        "mem",
        "peak_memory",
        "exit_code",
        "submitted_at",
        "started_at",
        "ended_at",
        "reason",
        "events",
    ],
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "name": {"type": ["string", "null"]},
        "state": {"type": "string", "enum": list(STATES)},
        "command": {"type": "array", "items": {"type": "string"}},
        "gpus": {"type": "array", "items": {"type": "integer"}},
        "mem": {"type": ["integer", "null"]},
        "peak_memory": {"type": ["integer", "null"]},
        "exit_code": {"type": ["integer", "null"]},
        "submitted_at": {"type": "string"},
        "started_at": {"type": ["string", "null"]},
        "ended_at": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
        "events": {"type": "array", "items": _EVENT},
        "qos": {"enum": list(QOS_CLASSES)},
        "mem_limit": {"type": ["integer", "null"]},
        "request": {"type": ["integer", "null"]},
        "preemptions": {"type": "integer"},
        "oom_retries": {"type": "integer"},
        "retries": {"type": "integer"},
        "preempting": {"type": "boolean"},
        "service": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "restart": {"enum": ["on-failure", "always"]},
                        "restart_limit": {"type": "integer"},
                        "restart_window": {"type": "number"},
                        "health_cmd": {"type": ["string", "null"]},
                        "health_url": {"type": ["string", "null"]},
                        "health_interval": {"type": "number"},
                        "health_grace": {"type": "number"},
                    },
                },
                {"type": "null"},
            ]
        },
        "restarts": {"type": "integer"},
        "health_failures": {"type": "integer"},
        "array": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "index": {"type": "integer"},
                        "limit": {"type": ["integer", "null"]},
                        "task": {"type": "string"},
                    },
                },
                {"type": "null"},
            ]
        },
        # The options document's fields, as the request has them (jobs/request.OPTIONS).
        **{f.name: field_schema(f) for f in OPTION_FIELDS},
    },
}
# One property a field of the request, from the table of fields (jobs/request.py).
PROPERTIES = properties()
SUBMIT = {
    "type": "object",
    "additionalProperties": False,
    "required": [f.name for f in FIELDS.values() if f.required],
    "properties": PROPERTIES,
}
EDIT = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {k: PROPERTIES[k] for k in EDITABLE},
}
STARTED = {
    "type": "object",
    "required": ["pid"],
    "additionalProperties": False,
    "properties": {"pid": {"type": "integer", "minimum": 1}},
}
ENDED = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "exit_code": {"type": ["integer", "null"], "minimum": 0, "maximum": 255},
        "signal": {"type": ["integer", "null"], "minimum": 0, "maximum": 255},
        "reason": {"type": "string", "minLength": 1, "maxLength": 500},
        "tree_clean": {"type": "boolean"},
        "survivors": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        "output": {
            "type": "string",
            "description": "the tail of the output (CUDA OOM detection; what logs shows)",
        },
    },
}
REFS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 10_000,
    "items": {"type": "string", "pattern": "^[0-9][0-9,_ -]*$", "maxLength": 200000},
}
DRAINS = {
    "type": "object",
    "required": ["drains"],
    "properties": {
        "drains": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "gpu": {"type": "integer"},
                    "reason": {"type": ["string", "null"]},
                    "by": {"type": "string"},
                    "at": {"type": "string"},
                },
            },
        }
    },
}


def response(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    """A JSON answer of this schema."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    str(code): response(_ERROR, text)
    for code, text in (
        (400, "bad request"),
        (403, "not allowed"),
        (404, "no such job"),
        (409, "conflict"),
        (503, "the daemon cannot do it now (its disk is full, its database is unusable)"),
    )
}
# The path parameters.
JOB_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}}
GPU_INDEX = {
    "name": "index",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 0, "maximum": 65535},
}
# The query parameters, one list a route.
LIST_QUERY = [
    {"name": "all", "in": "query", "schema": {"type": "boolean"}},
    {"name": "user", "in": "query", "schema": {"type": "string"}},
    {"name": "group", "in": "query", "schema": {"type": "string"}},
    {
        "name": "state",
        "in": "query",
        "schema": {"type": "string"},
        "description": "only jobs in these states (comma-separated), ended ones too: "
        + ", ".join(STATES),
    },
    {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 5000},
        "description": "jobs in the page (default 1000)",
    },
    {
        "name": "before",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
        "description": "the latest jobs with smaller ids (the default: the latest of all); "
        "the next older page is before the first id of this one",
    },
    {
        "name": "after",
        "in": "query",
        "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "description": "the first jobs with larger ids; the next page is after the last id "
        "of this one (not with before)",
    },
    {
        "name": "array",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
        "description": "only the tasks of this array (its id)",
    },
]
CANCEL_QUERY = [
    {
        "name": "kill",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["0", "1"]},
    }
]
WAIT_QUERY = [
    {"name": "timeout", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": 3600}}
]
LOGS_QUERY = [
    {"name": "stream", "in": "query", "schema": {"type": "string", "enum": ["stdout", "stderr"]}},
    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
    {
        "name": "attempt",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1},
        "description": "which run of the job, counted from 1 (default: the latest); "
        "X-Attempt names the one served, X-Attempts how many there were",
    },
]
REPORT_QUERY = [
    {
        "name": "since",
        "in": "query",
        "schema": {"type": "string"},
        "description": "a duration back from now (7d, 12h); default: every ended job kept",
    },
    {"name": "by", "in": "query", "schema": {"type": "string", "enum": ["user", "group", "key"]}},
]
SNAPSHOT_QUERY = [
    {
        "name": "gpu",
        "in": "query",
        "schema": {"type": "string", "pattern": "^[0-9]{1,5}(,[0-9]{1,5})*$"},
        "description": "GPU indices, separated by commas",
    },
    {"name": "user", "in": "query", "schema": {"type": "string"}},
    {
        "name": "pid",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    },
    {
        "name": "leaks",
        "in": "query",
        "schema": {"type": "string", "enum": ["true", "false"]},
        "description": "true: leaks found in every snapshot kept",
    },
    {
        "name": "view",
        "in": "query",
        "schema": {"type": "string", "enum": ["status", "leaks"]},
        "description": "leaks: the document of `leaks --json` (found in every snapshot "
        "kept) instead of `status --json`'s",
    },
]
