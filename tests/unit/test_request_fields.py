"""The table of submit request fields (jobs/request.py) and what is made from it: the
OpenAPI document's request properties, the submit options' bounds and help, and the
daemon's checks (``spec_from_request``, called here directly). Each test fails when the
table and one of them disagree."""

from __future__ import annotations

import re
from typing import Any

import click
import pytest

from gpuwarden.cli.submit import NO_OPTION, NOT_ONE_FIELD, submit
from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.openapi import document
from gpuwarden.daemon.restart import SERVICE_FIELDS
from gpuwarden.daemon.submission import spec_from_request
from gpuwarden.errors import UsageError
from gpuwarden.gpus.model import MIG_PROFILE
from gpuwarden.jobs import request
from gpuwarden.jobs.request import EDITABLE, FIELDS, MAX_ID, Field
from tests.helpers.builders import non_default

ME = Caller(pid=1, uid=1000, gid=1000, user="alice", groups=(1000,))
BASE = {"command": ["python", "train.py"], "cwd": "/home/a", "env": {"PATH": "/usr/bin"}}
# What the rules between fields ask of a value of this field to be accepted at all.
NEEDS: dict[str, dict[str, Any]] = {
    "sm_percent": {"mps": True, "mem": "1G"},
    "mem_limit": {"mem": "1G"},
    "restart_limit": {"restart": "always"},
    "health_cmd": {"restart": "always"},
    "health_url": {"restart": "always"},
    "health_interval": {"restart": "always", "health_cmd": "true"},
    "health_grace": {"restart": "always", "health_cmd": "true"},
}


def spec(**body: Any) -> Any:
    return spec_from_request({**BASE, **body}, ME, 4, max_grace=3600.0)[0]


def refused(body: dict[str, Any]) -> str:
    with pytest.raises(UsageError) as err:
        spec_from_request({**BASE, **body}, ME, 4, max_grace=3600.0)
    message = str(err.value)
    assert message and "\n" not in message
    return message


def _submit_props() -> dict[str, Any]:
    body = document()["paths"]["/v1/jobs"]["post"]["requestBody"]
    schema: dict[str, Any] = body["content"]["application/json"]["schema"]
    return schema


def _branches(s: dict[str, Any]) -> list[dict[str, Any]]:
    return list(s.get("oneOf", [s]))


# -- the OpenAPI document ---------------------------------------------------------------
def test_every_field_is_a_property_of_the_request_and_nothing_else_is() -> None:
    schema = _submit_props()
    assert set(schema["properties"]) == set(FIELDS)
    assert schema["additionalProperties"] is False
    assert schema["required"] == [n for n, f in FIELDS.items() if f.required] == ["command"]


@pytest.mark.parametrize("f", FIELDS.values(), ids=list(FIELDS))
def test_each_property_has_the_tables_type_and_bounds(f: Field) -> None:
    s = _submit_props()["properties"][f.name]
    branches = _branches({k: v for k, v in s.items() if k != "description"})
    assert ({"type": "null"} in branches) == f.nullable
    (main, *rest) = [b for b in branches if b != {"type": "null"}]
    assert s["description"] == f.help
    if f.kind == request.INTEGER:
        assert (main["type"], main.get("minimum"), main.get("maximum")) == ("integer", f.lo, f.hi)
    elif f.kind == request.BOOLEAN:
        assert main == {"type": "boolean"}
    elif f.kind == request.CHOICE:
        assert main == {"enum": list(f.choices)}
    elif f.kind == request.STRING:
        assert (
            main["type"],
            main.get("minLength"),
            main.get("maxLength"),
            main.get("pattern"),
        ) == ("string", f.min_length, f.max_length, f.pattern)
    elif f.kind == request.IDS:
        assert main["items"] == {
            "type": "integer",
            "minimum": f.lo,
            **({} if f.hi is None else {"maximum": f.hi}),
        }
        assert main.get("minItems", 0) == f.min_items
    elif f.kind in (request.SIZE, request.DURATION):
        assert rest == [{"type": "string"}]
        if f.kind == request.SIZE:
            assert main == {"type": "integer", "minimum": 1}
        else:
            low = "exclusiveMinimum" if f.positive else "minimum"
            assert main == {"type": "number", low: 0}
    else:
        assert f.kind in (request.STRINGS, request.ARGV, request.ENV)


def test_edit_takes_the_submit_properties_of_the_editable_fields() -> None:
    edit = document()["paths"]["/v1/jobs/{id}/edit"]["post"]["requestBody"]
    props = edit["content"]["application/json"]["schema"]["properties"]
    assert props == {k: _submit_props()["properties"][k] for k in EDITABLE}


# Per field: values the schema allows and values it refuses, beside the base request.
SAMPLES: dict[str, tuple[list[Any], list[Any]]] = {
    request.INTEGER: ([], ["1", 1.5, True, [1]]),
    request.BOOLEAN: ([True, False], [1, "true", None]),
    request.CHOICE: ([], ["nope", 1, True]),
    request.STRING: ([], [1, True, [], {}]),
    request.IDS: ([], [3, "1", [True], ["1"], False]),
    request.SIZE: ([1, "14G"], [0, -1, True, [1]]),
    request.DURATION: (["2h", 1, 0.5], [-1, True, [1]]),
}


def _cases() -> list[tuple[str, Any, bool]]:
    out: list[tuple[str, Any, bool]] = []
    for name, f in FIELDS.items():
        good, bad = SAMPLES.get(f.kind, ([], []))
        if f.kind == request.INTEGER:  # every integer field has both bounds
            assert f.lo is not None and f.hi is not None
            good, bad = [f.lo, f.hi], [*bad, f.lo - 1, f.hi + 1]
        elif f.kind == request.CHOICE:
            good = list(f.choices)
        out += [(name, v, True) for v in good] + [(name, v, False) for v in bad]
        out.append((name, None, f.nullable))
    return out


@pytest.mark.parametrize(("name", "value", "valid"), _cases())
def test_the_schema_and_the_daemon_agree_on_each_fields_values(
    name: str, value: Any, valid: bool
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    body = {**BASE, **NEEDS.get(name, {}), name: value}
    validator = jsonschema.Draft202012Validator(_submit_props())
    assert validator.is_valid(body) == valid, (name, value)
    try:
        request.check_fields(body)
        daemon_ok = True
    except UsageError:
        daemon_ok = False
    assert daemon_ok == valid, (name, value)


# -- the submit options -----------------------------------------------------------------
def _field_options() -> list[click.Option]:
    return [
        p
        for p in submit.params
        if isinstance(p, click.Option) and p.name in FIELDS and p.name not in NOT_ONE_FIELD
    ]


def test_the_submit_options_that_are_one_field_each() -> None:
    names = {p.name for p in _field_options()}
    assert "priority" in names and "qos" in names and "no_numa" in names
    assert set(NOT_ONE_FIELD) <= set(FIELDS)
    for p in _field_options():
        assert p.opts == ["--" + str(p.name).replace("_", "-")]


def test_every_field_but_a_few_is_a_submit_option_in_the_tables_order() -> None:
    """A field added to the table is a submit option, placed where the table puts it;
    only the command, the environment and attach's field have none."""
    assert set(NO_OPTION) == {"command", "env", "attach"}
    options = [str(p.name) for p in submit.params if isinstance(p, click.Option)]
    fields = [o for o in options if o in FIELDS]
    assert fields == [name for name in FIELDS if name not in NO_OPTION]
    assert not set(options) - set(FIELDS) - {"cluster", "as_json", "help"}


@pytest.mark.parametrize("option", _field_options(), ids=lambda p: str(p.name))
def test_each_one_field_option_has_the_tables_bounds_choices_and_help(option: click.Option) -> None:
    f = FIELDS[str(option.name)]
    assert option.help == f.help
    default = submit.make_context("submit", ["true"]).params[f.name]  # as the CLI gets it
    if f.kind == request.INTEGER:
        assert isinstance(option.type, click.IntRange)
        assert (option.type.min, option.type.max) == (f.lo, f.hi)
        assert default == f.default
    elif f.kind == request.CHOICE and f.name != "restart":
        assert isinstance(option.type, click.Choice)
        assert tuple(option.type.choices) == f.choices
    elif f.kind == request.BOOLEAN:
        assert option.is_flag and default is False
    elif f.kind == request.DURATION:
        assert option.type.name == "DURATION"  # parsed here, as the daemon parses it
    assert option.metavar == f.metavar


# -- spec_from_request ------------------------------------------------------------------
INTEGERS = [f for f in FIELDS.values() if f.kind == request.INTEGER]


@pytest.mark.parametrize("f", INTEGERS, ids=[f.name for f in INTEGERS])
def test_each_integer_bound_is_its_edge(f: Field) -> None:
    assert f.lo is not None and f.hi is not None
    needs = NEEDS.get(f.name, {})
    assert getattr(spec(**needs, **{f.name: f.lo}), f.name) == f.lo
    assert getattr(spec(**needs, **{f.name: f.hi}), f.name) == f.hi
    for outside in (f.lo - 1, f.hi + 1):
        assert refused({**needs, f.name: outside}) == f"{f.name} must be between {f.lo} and {f.hi}"
    for wrong in ("1", 1.0, True):
        assert refused({**needs, f.name: wrong}) == f"{f.name} must be an integer"


def test_the_known_bounds() -> None:
    assert (FIELDS["priority"].lo, FIELDS["priority"].hi) == (-1000, 1000)
    assert (FIELDS["gpus"].lo, FIELDS["gpus"].hi) == (1, 64)
    assert (FIELDS["retries"].lo, FIELDS["retries"].hi) == (0, 100)


def test_defaults_of_absent_and_null_fields() -> None:
    s = spec()
    assert (s.gpus, s.priority, s.qos, s.exclusive, s.no_numa) == (1, 0, "burstable", False, False)
    assert spec(cpus=None, retries=None, name=None).cpus is None
    assert refused({"priority": None}) == "priority must be an integer"
    assert refused({"exclusive": None}) == "exclusive must be true or false"


def test_booleans_choices_and_strings() -> None:
    for flag in [n for n, f in FIELDS.items() if f.kind == request.BOOLEAN]:
        assert refused({flag: "yes"}) == f"{flag} must be true or false"
        assert refused({flag: 1}) == f"{flag} must be true or false"
    for qos in request.QOS_CLASSES:
        assert spec(qos=qos).qos == qos
    assert refused({"qos": "gold"}) == "qos must be guaranteed, burstable or besteffort"
    assert refused({"restart": "sometimes"}) == "restart must be on-failure, always or no"
    assert spec(name="x" * 200).name == "x" * 200
    assert (
        refused({"name": "x" * 201}) == "name must be a non-empty string of at most 200 characters"
    )
    assert refused({"cwd": 3}) == "cwd must be an absolute path"
    assert (
        refused({"notify": ""}) == "notify must be a non-empty command of at most 4096 characters"
    )
    assert (
        refused({"restart": "always", "health_url": "ftp://x"})
        == "health_url must be an http:// or https:// URL"
    )


def test_ids_lists_and_their_bounds() -> None:
    assert spec(after=[]).after == ()
    assert spec(after=[1, MAX_ID]).after == (1, MAX_ID)  # the store says if they exist
    assert refused({"after": [0]}) == f"after must be between 1 and {MAX_ID}"
    assert refused({"after": [MAX_ID + 1]}) == f"after must be between 1 and {MAX_ID}"
    assert refused({"after_any": 3}) == "after_any must be a list of job ids"
    assert spec(gpu_ids=[0, 3]).gpu_ids == (0, 3)
    assert refused({"gpu_ids": [-1]}) == "gpu_ids must be at least 0"
    assert refused({"gpu_ids": []}) == "gpu_ids must be a non-empty list of GPU indices"
    assert refused({"command": ["a", 1]}) == "command must be a list of strings"
    assert refused({"env_keep": "HOME"}) == "env_keep must be a list of strings"


def test_unknown_and_missing_fields() -> None:
    assert refused({"uid": 0, "zzz": 1}) == "unknown field(s): uid, zzz"
    with pytest.raises(UsageError) as err:
        spec_from_request({"cwd": "/"}, ME, 4)
    assert str(err.value) == "command is required"


def test_durations_and_sizes() -> None:
    assert spec(timeout=0.5).timeout == 0.5 and spec(grace=0).grace == 0.0
    assert refused({"timeout": 0}) == "timeout must be positive"
    assert spec(mem=1).mem == 1
    assert refused({"mem": 0}) == "mem must be positive"
    assert refused({"mem": True}) == "mem must be a size like 14G or a number of bytes"


# -- the table and its neighbours --------------------------------------------------------
def test_the_fields_of_services_and_edit_are_the_tables() -> None:
    assert set(FIELDS) >= SERVICE_FIELDS | set(EDITABLE)


@pytest.mark.parametrize(
    "profile",
    [
        "1g.10gb",
        "3g.40gb",
        "7g.80gb",
        "8g.1gb",
        "0g.10gb",
        "9g.10gb",
        "1g.0gb",
        "1g.10GB",
        "1g.10gb ",
        "huge",
    ],
)
def test_the_mig_pattern_is_the_gpu_models(profile: str) -> None:
    pattern = FIELDS["mig"].pattern
    assert pattern is not None
    assert bool(re.match(pattern, profile)) == bool(MIG_PROFILE.match(profile))


# -- the store ------------------------------------------------------------------------

# The JobSpec attributes that are no request field of their own name: who asked (from the
# caller), the environment (an object filtered by env_keep), what submit decided or
# built from several fields. Every other attribute is a stored field of the table.
NOT_STORED_AS_A_FIELD = {"user", "uid", "gid", "groups", "env", "mem_auto", "service", "array"}


def test_each_stored_field_is_a_spec_attribute_kept_in_a_column_or_the_options(
    tmp_path: Any,
) -> None:
    """``daemon/rows.py`` writes and reads a stored field by its entry: its column (or
    the options document's) must exist once the migrations ran, and JobSpec must have
    the attribute. ``edit`` writes columns: an editable field has one of its own."""
    import dataclasses

    from gpuwarden.daemon.store import Store
    from gpuwarden.jobs.model import JobSpec

    with Store(tmp_path / "state.db") as store, store._tx(write=False) as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
    stored = {f.name: f.column for f in FIELDS.values() if f.stored}
    assert not set(stored.values()) - columns
    own = [c for c in stored.values() if c != request.OPTIONS]
    assert len(set(own)) == len(own)  # one column a field
    attributes = {f.name for f in dataclasses.fields(JobSpec)}
    assert set(stored) == attributes - NOT_STORED_AS_A_FIELD
    assert not [name for name in EDITABLE if FIELDS[name].optional]


@pytest.mark.parametrize("f", request.OPTION_FIELDS, ids=lambda f: f.name)
def test_a_field_of_the_options_document_goes_from_submit_to_show_by_its_entry(
    f: Field, tmp_path: Any
) -> None:
    """What adding an option takes is its entry (``column=OPTIONS``) and its JobSpec
    attribute: the store keeps it, a row from before it existed reads as its default,
    and the job's JSON and ``show`` say it."""
    from gpuwarden.daemon.jobjson import job_json
    from gpuwarden.daemon.store import Store
    from gpuwarden.render.jobtext import job_lines

    value = non_default(f)
    with Store(tmp_path / "state.db") as store:
        asked, _ = store.submit(spec(**{**NEEDS.get(f.name, {}), f.name: value}), 1.0)
        plain, _ = store.submit(spec(), 2.0)
        with store._tx(write=True) as conn:  # as a row written before the field existed
            conn.execute("UPDATE jobs SET options = '{}' WHERE id = ?", (plain.id,))
        kept, old = store.get(asked.id), store.get(plain.id)
    want = tuple(value) if isinstance(value, list) else value
    assert getattr(kept.spec, f.name) == want != getattr(old.spec, f.name) == f.default
    doc = job_json(kept)
    assert doc[f.name] == value  # type: ignore[literal-required]
    lines = dict(job_lines(doc, request.OPTION_DEFAULTS))
    assert f.name.replace("_", " ") in lines
    assert "\x1b" not in lines[f.name.replace("_", " ")]  # made visible
    assert f.name.replace("_", " ") not in dict(job_lines(job_json(old), request.OPTION_DEFAULTS))


def test_each_stored_field_is_in_the_jobs_json() -> None:
    """``show --json``, ``ps --json`` and the API say what was asked: each stored field
    under its name (but ``gpus``, the count asked for, which is ``gpu_count`` there:
    ``gpus`` lists the GPUs it got), in the typed view clients read it through."""
    from gpuwarden.client.views import JobDoc
    from gpuwarden.daemon.jobjson import job_json
    from gpuwarden.jobs.model import Job

    out = job_json(Job(id=1, spec=spec(), state="queued", submitted_at=0.0))
    shown = {"gpus": "gpu_count"}
    for f in FIELDS.values():
        if f.stored:
            key = shown.get(f.name, f.name)
            assert key in out, f.name
            # a field of the options document is shown by name, typed where read
            assert f.optional or key in JobDoc.__annotations__, f.name
