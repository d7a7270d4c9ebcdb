"""The API's OpenAPI document, served at /openapi.json and used by the fuzz tests: its
routes, what each one does, takes and answers. The schemas and parameters they share are
its components (daemon/openapi_components.py)."""

from __future__ import annotations

from typing import Any

from gpuwarden import __version__
from gpuwarden.daemon.openapi_components import (
    CANCEL_QUERY,
    DRAINS,
    EDIT,
    ENDED,
    ERRORS,
    GPU_INDEX,
    JOB,
    JOB_ID,
    LIST_QUERY,
    LOGS_QUERY,
    PROPERTIES,
    REFS,
    REPORT_QUERY,
    SNAPSHOT_QUERY,
    STARTED,
    SUBMIT,
    WAIT_QUERY,
    response,
)


def _job_action(summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [JOB_ID],
            "responses": {"200": response(JOB), **ERRORS},
        }
    }


def _report(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [JOB_ID],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": response(JOB), **ERRORS},
        }
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpuwarden daemon",
            "version": __version__,
            "description": "Job queue API over a unix socket. The caller's identity "
            "comes from the socket's peer credentials.",
        },
        "paths": {
            "/v1/health": {
                "get": {
                    "summary": "daemon liveness",
                    "responses": {"200": response({"type": "object"})},
                }
            },
            "/v1/jobs": {
                "get": {
                    "summary": "the queue",
                    "parameters": LIST_QUERY,
                    "responses": {
                        "200": response(
                            {
                                "type": "object",
                                "required": ["jobs", "more"],
                                "properties": {
                                    "jobs": {
                                        "type": "array",
                                        "items": JOB,
                                        "description": "one page, in id order",
                                    },
                                    "more": {
                                        "type": "boolean",
                                        "description": "the listing goes on past this page",
                                    },
                                },
                            }
                        ),
                        **ERRORS,
                    },
                },
                "post": {
                    "summary": "submit a job",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": SUBMIT}},
                    },
                    "responses": {
                        "200": response(JOB, "an existing job with that key"),
                        "201": response(JOB, "created"),
                        **ERRORS,
                    },
                },
            },
            "/v1/jobs/{id}": {
                "get": {
                    "summary": "one job",
                    "parameters": [JOB_ID],
                    "responses": {"200": response(JOB), **ERRORS},
                },
                "delete": {
                    "summary": "remove an ended job",
                    "parameters": [JOB_ID],
                    "responses": {"200": response({"type": "object"}), **ERRORS},
                },
            },
            "/v1/jobs/{id}/cancel": {
                "post": {
                    "summary": "cancel a job (its whole process tree: SIGTERM, its grace, "
                    "SIGKILL; kill=1: SIGKILL at once)",
                    "parameters": [JOB_ID, *CANCEL_QUERY],
                    "responses": {"200": response(JOB), **ERRORS},
                }
            },
            "/v1/jobs/{id}/edit": _report(
                "change a queued or held job's request (owner or admin; checked as at submit)", EDIT
            ),
            "/v1/jobs/{id}/hold": _job_action("keep a queued job from starting"),
            "/v1/jobs/{id}/release": _job_action("let a held job start"),
            "/v1/jobs/{id}/retry": _job_action("queue a failed or cancelled job again"),
            "/v1/jobs/{id}/unreserve": _job_action(
                "admins: clear the memory an ended job holds because it was not verified back"
            ),
            "/v1/jobs/{id}/started": _report(
                "attached jobs: the launcher started the command (a process of its own)", STARTED
            ),
            "/v1/jobs/{id}/ended": _report(
                "attached jobs: the launcher reports how the command ended", ENDED
            ),
            "/v1/jobs/{id}/wait": {
                "get": {
                    "summary": "block until the job ends or the timeout passes",
                    "parameters": [JOB_ID, *WAIT_QUERY],
                    "responses": {"200": response(JOB), **ERRORS},
                }
            },
            "/v1/jobs/{id}/logs": {
                "get": {
                    "summary": "a chunk of a job's stdout or stderr",
                    "parameters": [JOB_ID, *LOGS_QUERY],
                    "responses": {
                        "200": {
                            "description": "bytes from offset",
                            "content": {
                                "application/octet-stream": {
                                    "schema": {"type": "string", "format": "binary"}
                                }
                            },
                        },
                        **ERRORS,
                    },
                }
            },
            "/v1/cancel": {
                "post": {
                    "summary": "cancel many jobs in one request: these ids, and the caller's "
                    "waiting and running jobs of a group (kill: SIGKILL at once)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "anyOf": [
                                        {"required": ["ids"]},
                                        {"required": ["refs"]},
                                        {"required": ["group"]},
                                    ],
                                    "properties": {
                                        "ids": {
                                            "type": "array",
                                            "items": {
                                                "type": "integer",
                                                "minimum": 1,
                                                "maximum": 2**63 - 1,
                                            },
                                        },
                                        "refs": {**REFS, "minItems": 0},
                                        "group": PROPERTIES["group"],
                                        "kill": {"type": "boolean"},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": response(
                            {
                                "type": "object",
                                "properties": {
                                    "jobs": {"type": "array", "items": JOB},
                                    "errors": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "id": {"type": "integer"},
                                                "error": {"type": "string"},
                                            },
                                        },
                                    },
                                    "missing": {
                                        "type": "array",
                                        "items": {"type": ["integer", "string"]},
                                    },
                                },
                            }
                        ),
                        **ERRORS,
                    },
                }
            },
            "/v1/resolve": {
                "post": {
                    "summary": "the job ids that references name: ids, ranges (3-7), an "
                    "array's id (each of its tasks) and tasks (12_7)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["refs"],
                                    "properties": {"refs": REFS},
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": response(
                            {
                                "type": "object",
                                "properties": {
                                    "ids": {"type": "array", "items": {"type": "integer"}},
                                    "missing": {
                                        "type": "array",
                                        "items": {"type": ["integer", "string"]},
                                    },
                                },
                            }
                        ),
                        **ERRORS,
                    },
                }
            },
            "/v1/clean": {
                "post": {
                    "summary": "remove ended jobs older than a duration",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["older_than"],
                                    "properties": {
                                        "older_than": {
                                            "oneOf": [
                                                {"type": "number", "minimum": 0},
                                                {"type": "string"},
                                            ]
                                        }
                                    },
                                }
                            }
                        },
                    },
                    "responses": {"200": response({"type": "object"}), **ERRORS},
                }
            },
            "/v1/report": {
                "get": {
                    "summary": "accounting: the jobs that ended in a period, summed per user, "
                    "group or key (any user may read it)",
                    "parameters": REPORT_QUERY,
                    "responses": {
                        "200": response(
                            {
                                "type": "object",
                                "required": ["by", "rows"],
                                "properties": {
                                    "by": {"type": "string"},
                                    "since": {"type": ["string", "null"]},
                                    "until": {"type": "string"},
                                    "rows": {"type": "array", "items": {"type": "object"}},
                                },
                            }
                        ),
                        **ERRORS,
                    },
                }
            },
            "/v1/drains": {
                "get": {
                    "summary": "the drained GPUs (no new placement there), to any user",
                    "responses": {"200": response(DRAINS), **ERRORS},
                }
            },
            "/v1/gpus/{index}/drain": {
                "post": {
                    "summary": "admins: no new placement on this GPU; its running jobs finish",
                    "parameters": [GPU_INDEX],
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": ["object", "null"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "reason": {
                                            "type": ["string", "null"],
                                            "minLength": 1,
                                            "maxLength": 200,
                                        }
                                    },
                                }
                            }
                        },
                    },
                    "responses": {"200": response(DRAINS), **ERRORS},
                }
            },
            "/v1/gpus/{index}/undrain": {
                "post": {
                    "summary": "admins: let placement use a drained GPU again",
                    "parameters": [GPU_INDEX],
                    "responses": {"200": response(DRAINS), **ERRORS},
                }
            },
            "/v1/job-pids": {
                "get": {
                    "summary": "the job id of each process of the running jobs (any user's)",
                    "responses": {
                        "200": response(
                            {
                                "type": "object",
                                "required": ["pids"],
                                "properties": {
                                    "pids": {
                                        "type": "object",
                                        "additionalProperties": {"type": "integer"},
                                    }
                                },
                            }
                        ),
                        **ERRORS,
                    },
                }
            },
            "/v1/snapshot": {
                "get": {
                    "summary": "the daemon's latest full snapshot as `status --json` shows it, "
                    "to any user as that user's own status would see it (null when "
                    "none is young enough: take one yourself)",
                    "parameters": SNAPSHOT_QUERY,
                    "responses": {
                        "200": response(
                            {
                                "type": "object",
                                "required": ["snapshot", "gpus", "samples"],
                                "properties": {
                                    "snapshot": {"type": ["object", "null"]},
                                    "backend": {"type": ["string", "null"]},
                                    "taken_at": {"type": ["number", "null"]},
                                    "gpus": {"type": "array", "items": {"type": "integer"}},
                                    "samples": {"type": "integer"},
                                    "span": {"type": "number"},
                                    "drains": {"type": "array", "items": {"type": "object"}},
                                },
                            }
                        ),
                        **ERRORS,
                    },
                }
            },
        },
    }
