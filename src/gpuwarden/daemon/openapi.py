"""The API's OpenAPI document, served at /openapi.json and used by the fuzz tests."""

from __future__ import annotations

from typing import Any

from gpuwarden import __version__
from gpuwarden.jobs.model import STATES
from gpuwarden.jobs.request import EDITABLE, FIELDS, QOS_CLASSES, properties

_ERROR = {"type": "object", "required": ["error"],
          "properties": {"error": {"type": "string"}}}
_EVENT = {"type": "object", "properties": {"at": {"type": "string"}, "kind": {"type": "string"},
                                           "detail": {"type": ["string", "null"]}}}
_JOB = {
    "type": "object",
    "required": ["id", "user", "name", "state", "command", "gpus", "mem", "peak_memory",
                 "exit_code", "submitted_at", "started_at", "ended_at", "reason", "events"],
    "properties": {
        "id": {"type": "integer"}, "user": {"type": "string"},
        "name": {"type": ["string", "null"]}, "state": {"type": "string", "enum": list(STATES)},
        "command": {"type": "array", "items": {"type": "string"}},
        "gpus": {"type": "array", "items": {"type": "integer"}},
        "mem": {"type": ["integer", "null"]}, "peak_memory": {"type": ["integer", "null"]},
        "exit_code": {"type": ["integer", "null"]},
        "submitted_at": {"type": "string"}, "started_at": {"type": ["string", "null"]},
        "ended_at": {"type": ["string", "null"]}, "reason": {"type": ["string", "null"]},
        "events": {"type": "array", "items": _EVENT},
        "qos": {"enum": list(QOS_CLASSES)},
        "mem_limit": {"type": ["integer", "null"]}, "request": {"type": ["integer", "null"]},
        "preemptions": {"type": "integer"}, "oom_retries": {"type": "integer"},
        "retries": {"type": "integer"}, "preempting": {"type": "boolean"},
        "service": {"oneOf": [{"type": "object", "properties": {
            "restart": {"enum": ["on-failure", "always"]},
            "restart_limit": {"type": "integer"}, "restart_window": {"type": "number"},
            "health_cmd": {"type": ["string", "null"]},
            "health_url": {"type": ["string", "null"]},
            "health_interval": {"type": "number"}, "health_grace": {"type": "number"}}},
            {"type": "null"}]},
        "restarts": {"type": "integer"}, "health_failures": {"type": "integer"},
        "array": {"oneOf": [{"type": "object", "properties": {
            "id": {"type": "integer"}, "index": {"type": "integer"},
            "limit": {"type": ["integer", "null"]}, "task": {"type": "string"}}},
            {"type": "null"}]},
    },
}
# One property a field of the request, from the table of fields (jobs/request.py).
_PROPS = properties()
_SUBMIT = {"type": "object", "additionalProperties": False,
           "required": [f.name for f in FIELDS.values() if f.required],
           "properties": _PROPS}
_EDIT = {"type": "object", "additionalProperties": False, "minProperties": 1,
         "properties": {k: _PROPS[k] for k in EDITABLE}}
_STARTED = {"type": "object", "required": ["pid"], "additionalProperties": False,
            "properties": {"pid": {"type": "integer", "minimum": 1}}}
_ENDED = {"type": "object", "additionalProperties": False, "properties": {
    "exit_code": {"type": ["integer", "null"], "minimum": 0, "maximum": 255},
    "signal": {"type": ["integer", "null"], "minimum": 0, "maximum": 255},
    "reason": {"type": "string", "minLength": 1, "maxLength": 500},
    "tree_clean": {"type": "boolean"},
    "survivors": {"type": "array", "items": {"type": "integer", "minimum": 1}},
    "output": {"type": "string", "description": "the tail of the output (CUDA OOM "
                                                "detection; what logs shows)"}}}
_REFS = {"type": "array", "minItems": 1, "maxItems": 10_000, "items": {
    "type": "string", "pattern": "^[0-9][0-9,_ -]*$", "maxLength": 200000}}


def _resp(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": schema}}}


_ERRORS = {str(code): _resp(_ERROR, text) for code, text in (
    (400, "bad request"), (403, "not allowed"), (404, "no such job"), (409, "conflict"),
    (503, "the daemon cannot do it now (its disk is full, its database is unusable)"))}
_ID = {"name": "id", "in": "path", "required": True,
       "schema": {"type": "integer", "minimum": 1}}


_INDEX = {"name": "index", "in": "path", "required": True,
          "schema": {"type": "integer", "minimum": 0, "maximum": 65535}}
_DRAINS = {"type": "object", "required": ["drains"], "properties": {"drains": {
    "type": "array", "items": {"type": "object", "properties": {
        "gpu": {"type": "integer"}, "reason": {"type": ["string", "null"]},
        "by": {"type": "string"}, "at": {"type": "string"}}}}}}


def _job_action(summary: str) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": [_ID],
                     "responses": {"200": _resp(_JOB), **_ERRORS}}}


def _report(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": [_ID],
                     "requestBody": {"required": True, "content": {
                         "application/json": {"schema": body}}},
                     "responses": {"200": _resp(_JOB), **_ERRORS}}}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpuwarden daemon", "version": __version__,
                 "description": "Job queue API over a unix socket. The caller's identity "
                                "comes from the socket's peer credentials."},
        "paths": {
            "/v1/health": {"get": {"summary": "daemon liveness", "responses": {
                "200": _resp({"type": "object"})}}},
            "/v1/jobs": {
                "get": {"summary": "the queue", "parameters": [
                    {"name": "all", "in": "query", "schema": {"type": "boolean"}},
                    {"name": "user", "in": "query", "schema": {"type": "string"}},
                    {"name": "group", "in": "query", "schema": {"type": "string"}},
                    {"name": "state", "in": "query", "schema": {"type": "string"},
                     "description": "only jobs in these states (comma-separated), ended "
                                    "ones too: " + ", ".join(STATES)},
                    {"name": "limit", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 5000},
                     "description": "jobs in the page (default 1000)"},
                    {"name": "before", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                     "description": "the latest jobs with smaller ids (the default: the "
                                    "latest of all); the next older page is before the "
                                    "first id of this one"},
                    {"name": "after", "in": "query",
                     "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                     "description": "the first jobs with larger ids; the next page is "
                                    "after the last id of this one (not with before)"},
                    {"name": "array", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                     "description": "only the tasks of this array (its id)"}],
                    "responses": {"200": _resp({"type": "object", "required": ["jobs", "more"],
                                                "properties": {
                        "jobs": {"type": "array", "items": _JOB,
                                 "description": "one page, in id order"},
                        "more": {"type": "boolean",
                                 "description": "the listing goes on past this page"}}}),
                                  **_ERRORS}},
                "post": {"summary": "submit a job",
                         "requestBody": {"required": True, "content": {
                             "application/json": {"schema": _SUBMIT}}},
                         "responses": {"200": _resp(_JOB, "an existing job with that key"),
                                       "201": _resp(_JOB, "created"), **_ERRORS}},
            },
            "/v1/jobs/{id}": {
                "get": {"summary": "one job", "parameters": [_ID],
                        "responses": {"200": _resp(_JOB), **_ERRORS}},
                "delete": {"summary": "remove an ended job", "parameters": [_ID],
                           "responses": {"200": _resp({"type": "object"}), **_ERRORS}},
            },
            "/v1/jobs/{id}/cancel": {"post": {
                "summary": "cancel a job (its whole process tree: SIGTERM, its grace, "
                           "SIGKILL; kill=1: SIGKILL at once)",
                "parameters": [_ID, {"name": "kill", "in": "query", "required": False,
                                     "schema": {"type": "string", "enum": ["0", "1"]}}],
                "responses": {"200": _resp(_JOB), **_ERRORS}}},
            "/v1/jobs/{id}/edit": _report(
                "change a queued or held job's request (owner or admin; checked as at "
                "submit)", _EDIT),
            "/v1/jobs/{id}/hold": _job_action("keep a queued job from starting"),
            "/v1/jobs/{id}/release": _job_action("let a held job start"),
            "/v1/jobs/{id}/retry": _job_action("queue a failed or cancelled job again"),
            "/v1/jobs/{id}/unreserve": _job_action(
                "admins: clear the memory an ended job holds because it was not verified "
                "back"),
            "/v1/jobs/{id}/started": _report(
                "attached jobs: the launcher started the command (a process of its own)",
                _STARTED),
            "/v1/jobs/{id}/ended": _report(
                "attached jobs: the launcher reports how the command ended", _ENDED),
            "/v1/jobs/{id}/wait": {"get": {
                "summary": "block until the job ends or the timeout passes",
                "parameters": [_ID, {"name": "timeout", "in": "query",
                                     "schema": {"type": "number", "minimum": 0,
                                                "maximum": 3600}}],
                "responses": {"200": _resp(_JOB), **_ERRORS}}},
            "/v1/jobs/{id}/logs": {"get": {
                "summary": "a chunk of a job's stdout or stderr",
                "parameters": [_ID,
                               {"name": "stream", "in": "query",
                                "schema": {"type": "string", "enum": ["stdout", "stderr"]}},
                               {"name": "offset", "in": "query",
                                "schema": {"type": "integer", "minimum": 0}},
                               {"name": "attempt", "in": "query",
                                "schema": {"type": "integer", "minimum": 1},
                                "description": "which run of the job, counted from 1 "
                                               "(default: the latest); X-Attempt names "
                                               "the one served, X-Attempts how many "
                                               "there were"}],
                "responses": {"200": {"description": "bytes from offset",
                                      "content": {"application/octet-stream": {
                                          "schema": {"type": "string", "format": "binary"}}}},
                              **_ERRORS}}},
            "/v1/cancel": {"post": {
                "summary": "cancel many jobs in one request: these ids, and the caller's "
                           "waiting and running jobs of a group (kill: SIGKILL at once)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "additionalProperties": False,
                               "anyOf": [{"required": ["ids"]}, {"required": ["refs"]},
                                         {"required": ["group"]}],
                               "properties": {
                                   "ids": {"type": "array", "minItems": 1, "items": {
                                       "type": "integer", "minimum": 1,
                                       "maximum": 2**63 - 1}},
                                   "refs": _REFS,
                                   "group": _PROPS["group"], "kill": {"type": "boolean"}}}}}},
                "responses": {"200": _resp({"type": "object", "properties": {
                    "jobs": {"type": "array", "items": _JOB},
                    "errors": {"type": "array", "items": {
                        "type": "object", "properties": {"id": {"type": "integer"},
                                                         "error": {"type": "string"}}}},
                    "missing": {"type": "array", "items": {
                        "type": ["integer", "string"]}}}}),
                    **_ERRORS}}},
            "/v1/resolve": {"post": {
                "summary": "the job ids that references name: ids, ranges (3-7), an "
                           "array's id (each of its tasks) and tasks (12_7)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "additionalProperties": False,
                               "required": ["refs"], "properties": {"refs": _REFS}}}}},
                "responses": {"200": _resp({"type": "object", "properties": {
                    "ids": {"type": "array", "items": {"type": "integer"}},
                    "missing": {"type": "array", "items": {
                        "type": ["integer", "string"]}}}}),
                    **_ERRORS}}},
            "/v1/clean": {"post": {
                "summary": "remove ended jobs older than a duration",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "required": ["older_than"],
                               "properties": {"older_than": {
                                   "oneOf": [{"type": "number", "minimum": 0},
                                             {"type": "string"}]}}}}}},
                "responses": {"200": _resp({"type": "object"}), **_ERRORS}}},
            "/v1/report": {"get": {
                "summary": "accounting: the jobs that ended in a period, summed per user, "
                           "group or key (any user may read it)",
                "parameters": [
                    {"name": "since", "in": "query", "schema": {"type": "string"},
                     "description": "a duration back from now (7d, 12h); default: every "
                                    "ended job kept"},
                    {"name": "by", "in": "query",
                     "schema": {"type": "string", "enum": ["user", "group", "key"]}}],
                "responses": {"200": _resp({"type": "object", "required": ["by", "rows"],
                                            "properties": {
                    "by": {"type": "string"}, "since": {"type": ["string", "null"]},
                    "until": {"type": "string"},
                    "rows": {"type": "array", "items": {"type": "object"}}}}),
                    **_ERRORS}}},
            "/v1/drains": {"get": {
                "summary": "the drained GPUs (no new placement there), to any user",
                "responses": {"200": _resp(_DRAINS), **_ERRORS}}},
            "/v1/gpus/{index}/drain": {"post": {
                "summary": "admins: no new placement on this GPU; its running jobs finish",
                "parameters": [_INDEX],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"type": ["object", "null"], "additionalProperties": False,
                               "properties": {"reason": {
                                   "type": ["string", "null"], "minLength": 1,
                                   "maxLength": 200}}}}}},
                "responses": {"200": _resp(_DRAINS), **_ERRORS}}},
            "/v1/gpus/{index}/undrain": {"post": {
                "summary": "admins: let placement use a drained GPU again",
                "parameters": [_INDEX], "responses": {"200": _resp(_DRAINS), **_ERRORS}}},
            "/v1/job-pids": {"get": {
                "summary": "the job id of each process of the running jobs (any user's)",
                "responses": {"200": _resp({"type": "object", "required": ["pids"],
                                            "properties": {"pids": {
                                                "type": "object",
                                                "additionalProperties": {
                                                    "type": "integer"}}}}),
                              **_ERRORS}}},
            "/v1/snapshot": {"get": {
                "summary": "the daemon's latest full snapshot as `status --json` shows it, "
                           "to any user as that user's own status would see it (null when "
                           "none is young enough: take one yourself)",
                "parameters": [
                    {"name": "gpu", "in": "query",
                     "schema": {"type": "string", "pattern": "^[0-9]{1,5}(,[0-9]{1,5})*$"},
                     "description": "GPU indices, separated by commas"},
                    {"name": "user", "in": "query", "schema": {"type": "string"}},
                    {"name": "pid", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}},
                    {"name": "leaks", "in": "query",
                     "schema": {"type": "string", "enum": ["true", "false"]},
                     "description": "true: leaks found in every snapshot kept"},
                    {"name": "view", "in": "query",
                     "schema": {"type": "string", "enum": ["status", "leaks"]},
                     "description": "leaks: the document of `leaks --json` (found in "
                                    "every snapshot kept) instead of `status --json`'s"}],
                "responses": {"200": _resp({"type": "object",
                                            "required": ["snapshot", "gpus", "samples"],
                                            "properties": {
                    "snapshot": {"type": ["object", "null"]},
                    "backend": {"type": ["string", "null"]},
                    "taken_at": {"type": ["number", "null"]},
                    "gpus": {"type": "array", "items": {"type": "integer"}},
                    "samples": {"type": "integer"}, "span": {"type": "number"},
                    "drains": {"type": "array", "items": {"type": "object"}}}}),
                    **_ERRORS}}},
        },
    }
