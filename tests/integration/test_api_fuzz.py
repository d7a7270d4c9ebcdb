"""Bad input against a live daemon: schemathesis fuzzes every operation of the OpenAPI
document the daemon serves (/openapi.json), and hand-written raw requests cover what a
schema cannot describe (malformed JSON, a huge body, a client that hangs up mid-request).
After each run the daemon must still answer and its database must be sound.

Schemathesis speaks HTTP through ``requests``; the daemon listens on a unix socket, so
the test mounts a small ``requests`` transport adapter that connects every
``http://gpuwarden/...`` URL to the socket. The requests are real HTTP on the real
server: nothing is run in-process or mocked."""

from __future__ import annotations

import copy
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.client.api import Client
from gpuwarden.daemon.openapi import document
from gpuwarden.daemon.store import Store
from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import (
    PY,
    Daemon,
    http_request,
    raw_http,
    start_daemon,
)

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")
requests = pytest.importorskip("requests")

import urllib3  # noqa: E402 — a dependency of requests, present once it is
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

BASE_URL = "http://gpuwarden"
EXAMPLES_PER_OPERATION = 25  # per generation mode; the whole run stays well under 60 s
# A PATH where nothing can be found: fuzzed jobs run for real (as the test's user, root
# in CI), so no generated argv[0] may resolve to a real program.
NO_PROGRAMS = "/nonexistent/gpuwarden-fuzz"
KNOWN_IDS = 16  # seeded jobs take the first ids; fuzzed submissions the next ones


class _UnixConnection(urllib3.connection.HTTPConnection):
    def __init__(self, *args: Any, unix_path: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.unix_path = unix_path

    def _new_conn(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout if isinstance(self.timeout, (int, float)) else 30)
        s.connect(self.unix_path)
        return s


class _UnixPool(urllib3.connectionpool.HTTPConnectionPool):
    def __init__(self, unix_path: str) -> None:
        super().__init__("localhost")
        self.unix_path = unix_path

    def _new_conn(self) -> _UnixConnection:
        return _UnixConnection(
            host="localhost",
            port=80,
            timeout=self.timeout.connect_timeout,
            unix_path=self.unix_path,
        )


class UnixAdapter(HTTPAdapter):
    """``requests`` transport: every URL goes to one unix socket."""

    def __init__(self, unix_path: Path) -> None:
        super().__init__()
        self.pool = _UnixPool(str(unix_path))

    def get_connection_with_tls_context(
        self, request: Any, verify: Any, proxies: Any = None, cert: Any = None
    ) -> _UnixPool:
        return self.pool

    def get_connection(self, url: Any, proxies: Any = None) -> _UnixPool:
        return self.pool

    def close(self) -> None:
        self.pool.close()
        super().close()


@pytest.fixture
def fuzz_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon of its own for the schemathesis run, which changes the queue."""
    yield from start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json")


@pytest.fixture(scope="module")
def bad_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for all the hand-written bad requests (none of which makes a job)."""
    yield from start_daemon(tmp_path_factory.mktemp("bad"), EXAMPLES / "idle-2gpu.json")


def _assert_healthy(daemon: Daemon) -> None:
    client = Client(str(daemon.socket), timeout=10)
    assert client.alive(), "the daemon stopped answering"
    assert client.request("GET", "/v1/jobs", query={"all": "1"}) is not None
    store = Store(daemon.home / "state.db")
    try:
        assert store.integrity() == "ok"
        assert store.audit() == []
    finally:
        store.close()


def _defuse(case: Any) -> None:
    """Fuzzed jobs are started for real: keep their commands from finding any program,
    and keep long polls short. Types are left as generated (negative cases stay so).
    No fuzzed job is ever attached: ``attach`` makes the caller (this test process) the
    job's launcher, and a fuzzed cancel or preemption would then SIGTERM the test run.
    The document the fuzzer reads has no ``attach`` (``_without_attach``); a body that
    names it anyway (an unknown property made up by a negative case) gets a value the
    daemon refuses, so it stays invalid and attaches nothing."""
    body = case.body
    if isinstance(body, dict) and "attach" in body:
        body["attach"] = 0
    if case.method == "POST" and case.path == "/v1/jobs" and isinstance(body, dict):
        env = body.get("env")
        if isinstance(env, dict) and all(isinstance(v, str) for v in env.values()):
            env["PATH"] = NO_PROGRAMS  # (an env made invalid on purpose stays invalid)
        elif "env" not in body:
            body["env"] = {"PATH": NO_PROGRAMS}
    if case.path.endswith("/wait") and isinstance(case.query, dict):
        # Absent (30 s by default) or valid and long: shortened, still valid.
        timeout = case.query.get("timeout", 30)
        if (
            isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and 0.2 < timeout <= 3600
        ):
            case.query["timeout"] = 0.2


def _seed_jobs(daemon: Daemon) -> None:
    """Jobs in several states, so that fuzzed ids find jobs to cancel, hold, retry, read
    and remove (and the handlers' logic runs, not only their 404)."""
    sim = [PY, "-m", "gpuwarden.sim.job", "--mem", "1G", "--seconds"]
    running = daemon.submit("--mem", "2G", cmd=[*sim, "300"])
    daemon.submit("--mem", "2G", cmd=[*sim, "0"])
    failed = daemon.submit("--mem", "2G", cmd=[*sim, "0", "--exit-code", "3"])
    daemon.submit("--after", str(running), cmd=[*sim, "0"])  # queued behind it
    held = daemon.submit("--after", str(running), cmd=[*sim, "0"])
    daemon.cli("hold", str(held), check=True)
    # A job that could never run is refused at submit now; a cancelled one stands in.
    daemon.cli("cancel", str(daemon.submit("--after", str(running), cmd=[*sim, "0"])), check=True)
    daemon.wait_state(running, "running")
    daemon.wait_state(failed, "failed")


def _without_attach(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without the ``attach`` field of a submission (see ``_defuse``);
    attached jobs have their own tests (test_attached.py)."""
    doc = copy.deepcopy(doc)
    found = 0
    for schema in doc.get("components", {}).get("schemas", {}).values():
        if "attach" in schema.get("properties", {}):
            del schema["properties"]["attach"]
            found += 1
    for item in doc["paths"].values():
        for op in item.values():
            content = op.get("requestBody", {}).get("content", {})
            for media in content.values():
                props = media.get("schema", {}).get("properties", {})
                if "attach" in props:
                    del props["attach"]
                    found += 1
    assert found, "the document names no attach field: update _without_attach"
    return doc


def _with_known_ids(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with job ids narrowed to the range the seeded and fuzzed jobs use.
    Ids outside it are still sent by the negative cases (and must be rejected)."""
    doc = copy.deepcopy(doc)
    for item in doc["paths"].values():
        for op in item.values():
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"] == "id":
                    param["schema"] = {**param["schema"], "maximum": KNOWN_IDS}
    return doc


def _fuzz(operation: Any, mode: Any, checks: list[Any], session: Any) -> None:
    """Send up to EXAMPLES_PER_OPERATION generated requests; raise on the first failure."""

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),  # the first failure, unshrunk
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        _defuse(case)
        case.call_and_validate(base_url=BASE_URL, session=session, checks=checks, timeout=15)

    run()


def test_schemathesis_fuzz_of_the_openapi_document(fuzz_daemon: Daemon) -> None:
    client = Client(str(fuzz_daemon.socket))
    doc = _without_attach(client.request("GET", "/openapi.json"))
    _seed_jobs(fuzz_daemon)
    # Positive cases use ids that exist; negative ones the document as served (with the
    # narrowed ids, an existing id past the range would count as "invalid data accepted").
    schemas = {
        schemathesis.GenerationMode.POSITIVE: schemathesis.openapi.from_dict(_with_known_ids(doc)),
        schemathesis.GenerationMode.NEGATIVE: schemathesis.openapi.from_dict(doc),
    }
    session = requests.Session()
    session.mount(BASE_URL, UnixAdapter(fuzz_daemon.socket))
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    modes = {
        schemathesis.GenerationMode.POSITIVE: checks,
        schemathesis.GenerationMode.NEGATIVE: [*checks, negative_data_rejection],
    }
    failures: list[str] = []
    started = time.monotonic()
    for mode, mode_checks in modes.items():
        operations = [r.ok() for r in schemas[mode].get_all_operations()]
        # every operation in the document, none skipped (unreserve, cancel many included)
        assert len(operations) == sum(len(ops) for ops in document()["paths"].values())
        for operation in operations:
            try:
                _fuzz(operation, mode, mode_checks, session)
            except Unsatisfiable:  # nothing to make invalid (an operation without inputs)
                assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # schemathesis raises a BaseExceptionGroup; one
                # operation's failure should not hide the others'
                failures.append(f"{operation.label} ({mode.value}): {e}")
    session.close()
    assert not failures, "\n\n".join(failures)
    assert not [j["id"] for j in _all_jobs(fuzz_daemon) if j.get("attach")], (
        "a fuzzed submission made this test process a job's launcher"
    )
    assert time.monotonic() - started < 60
    _assert_healthy(fuzz_daemon)


# ------------------------------------------------------------------ hand-written cases


def _all_jobs(daemon: Daemon) -> list[Any]:
    jobs = Client(str(daemon.socket)).request("GET", "/v1/jobs", query={"all": "1"})["jobs"]
    return list(jobs)


def _error_of(body: bytes) -> str:
    message = json.loads(body)["error"]
    assert isinstance(message, str) and message and "\n" not in message
    return message


@pytest.mark.parametrize(
    ("request_bytes", "status", "needle"),
    [
        pytest.param(
            http_request(
                "POST", "/v1/jobs", b'{"command": ["true"', {"Content-Type": "application/json"}
            ),
            400,
            "not valid JSON",
            id="malformed-json",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b"\xff\xfe\x00garbage"),
            400,
            "not valid JSON",
            id="not-utf8",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b"[1, 2, 3]"),
            400,
            "JSON object",
            id="body-not-an-object",
        ),
        pytest.param(http_request("POST", "/v1/jobs", b""), 400, "JSON object", id="empty-body"),
        pytest.param(
            http_request("POST", "/v1/jobs", json.dumps({"command": "true"}).encode()),
            400,
            "command",
            id="command-not-a-list",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "gpus": "two"}).encode()
            ),
            400,
            "gpus",
            id="gpus-a-string",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "mem": [1]}).encode()
            ),
            400,
            "mem",
            id="mem-a-list",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "mem": "1e999G"}).encode()
            ),
            400,
            "",
            id="mem-absurd",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "gpu_ids": [True]}).encode()
            ),
            400,
            "gpu_ids",
            id="bool-ids",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "after": 3}).encode()
            ),
            400,
            "after",
            id="after-not-a-list",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "after": False}).encode()
            ),
            400,
            "after",
            id="after-false",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "priority": 10**30}).encode()
            ),
            400,
            "priority",
            id="huge-priority",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "timeout": -1}).encode()
            ),
            400,
            "negative",
            id="neg-timeout",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["true"], "timeout": NaN}'),
            400,
            "not valid JSON",
            id="nan-timeout",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["true"], "timeout": Infinity}'),
            400,
            "not valid JSON",
            id="infinite-timeout",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["true"], "timeout": 1e400}'),
            400,
            "not valid JSON",
            id="overflowing-timeout",
        ),
        pytest.param(
            http_request(
                "POST",
                "/v1/jobs",
                json.dumps({"command": ["true"], "timeout": "9" * 400 + "h"}).encode(),
            ),
            400,
            "finite",
            id="infinite-timeout-string",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "mem": 10**30}).encode()
            ),
            400,
            "",
            id="huge-mem",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "after": [10**30]}).encode()
            ),
            400,
            "",
            id="huge-dependency",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "after": [424242]}).encode()
            ),
            400,
            "424242",
            id="missing-dependency",
        ),
        pytest.param(
            http_request(
                "POST",
                "/v1/jobs",
                json.dumps({"command": ["true"], "user": "root", "uid": 0}).encode(),
            ),
            400,
            "unknown field",
            id="identity-fields",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["a\\u0000b"]}'),
            400,
            "NUL",
            id="nul-in-argv",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["\\udafa"]}'),
            400,
            "surrogate",
            id="lone-surrogate-in-argv",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["true"], "env": {"\\ud800": ""}}'),
            400,
            "surrogate",
            id="lone-surrogate-in-env",
        ),
        pytest.param(
            http_request("POST", "/v1/jobs", b'{"command": ["true"], "cwd": "/a\\u0000"}'),
            400,
            "",
            id="nul-in-cwd",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "env": {"A=B": "x"}}).encode()
            ),
            400,
            "environment",
            id="bad-env-name",
        ),
        pytest.param(
            http_request(
                "POST", "/v1/jobs", json.dumps({"command": ["true"], "env": {"A": "x\0"}}).encode()
            ),
            400,
            "environment",
            id="nul-in-env",
        ),
        pytest.param(http_request("GET", "/v1/jobs/99999999"), 404, "99999999", id="unknown-job"),
        pytest.param(http_request("GET", "/v1/jobs/-1"), 400, "invalid job id", id="negative-id"),
        pytest.param(
            http_request("GET", "/v1/jobs/" + "9" * 40), 400, "invalid job id", id="id-overflow"
        ),
        pytest.param(
            http_request("POST", "/v1/jobs/%C3%A9/cancel"), 400, "invalid job id", id="unicode-id"
        ),
        pytest.param(
            http_request("GET", "/v1/jobs/%C2%B2"), 400, "invalid job id", id="superscript-digit-id"
        ),
        pytest.param(
            http_request("GET", "/v1/jobs/%D9%A1"),
            400,
            "invalid job id",
            id="arabic-indic-digit-id",
        ),
        pytest.param(http_request("GET", "/v1/jobs/1/logs?offset=x"), None, "", id="bad-offset"),
        pytest.param(
            http_request("GET", "/v1/jobs/1/wait?timeout=nan"),
            400,
            "timeout",
            id="nan-wait-timeout",
        ),
        pytest.param(
            http_request("GET", "/v1/jobs/1/wait?timeout=1e9"),
            400,
            "timeout",
            id="wait-timeout-too-long",
        ),
        pytest.param(
            http_request("GET", "/v1/jobs/1/wait?timeout=-1"),
            400,
            "timeout",
            id="negative-wait-timeout",
        ),
        pytest.param(http_request("GET", "/v1/jobs?all=maybe"), 400, "all", id="bad-flag"),
        pytest.param(
            http_request("GET", "/v1/jobs/1/logs?offset=" + "9" * 30), 404, "", id="huge-offset"
        ),
        pytest.param(
            http_request("POST", "/v1/clean", b'{"older_than": "forever"}'),
            400,
            "",
            id="bad-duration",
        ),
        pytest.param(
            http_request("POST", "/v1/clean", b'{"older_than": 1e400}'),
            400,
            "",
            id="infinite-duration",
        ),
        pytest.param(
            http_request("POST", "/v1/clean", b'{"older_than": [1]}'),
            400,
            "duration",
            id="duration-a-list",
        ),
    ],
)
def test_bad_input_is_a_clear_4xx(
    bad_daemon: Daemon, request_bytes: bytes, status: int | None, needle: str
) -> None:
    before = _all_jobs(bad_daemon)
    code, body = raw_http(bad_daemon.socket, request_bytes)
    if status is None:
        assert 400 <= code < 500 or code == 200, (code, body)
    else:
        assert code == status, (code, body)
    if code >= 400:
        assert needle in _error_of(body)
    assert _all_jobs(bad_daemon) == before  # bad input made no job
    _assert_healthy(bad_daemon)


def test_unknown_routes_and_methods_are_4xx(bad_daemon: Daemon) -> None:
    for method, path in (
        ("GET", "/nope"),
        ("GET", "/v1/jobs/1/nope"),
        ("GET", "/v2/jobs"),
        ("PUT", "/v1/jobs"),
        ("PATCH", "/v1/jobs/1"),
        ("GET", "/v1/clean"),
        ("BREW", "/v1/jobs"),
        ("GET", "/../../etc/passwd"),
    ):
        code, _ = raw_http(bad_daemon.socket, http_request(method, path))
        assert 400 <= code < 500, (method, path, code)
    _assert_healthy(bad_daemon)


def test_garbage_instead_of_http_and_a_huge_body(bad_daemon: Daemon) -> None:
    code, _ = raw_http(bad_daemon.socket, b"\x00\x01 hello daemon\r\n\r\n")
    assert 400 <= code < 500
    code, _ = raw_http(
        bad_daemon.socket,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"
        + b"X-Long: "
        + b"a" * 200_000
        + b"\r\nConnection: close\r\n\r\n",
    )
    assert 400 <= code < 500
    # A body over the limit, announced honestly: refused without reading it all.
    huge = b'{"command": ["true"], "name": "' + b"x" * (8 << 20) + b'"}'
    code, body = raw_http(bad_daemon.socket, http_request("POST", "/v1/jobs", huge))
    assert code in (400, 413) and "too large" in _error_of(body)
    # The same body sent chunked (no Content-Length to refuse it by).
    chunked = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    )
    for i in range(0, len(huge), 1 << 20):
        piece = huge[i : i + (1 << 20)]
        chunked += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    try:
        code, _ = raw_http(bad_daemon.socket, chunked + b"0\r\n\r\n")
        assert code == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon may hang up on a body it will not read: also a refusal
    # A Content-Length that lies (longer than what comes).
    code, _ = raw_http(
        bad_daemon.socket,
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\nConnection: close\r\n\r\n{}",
    )
    assert 400 <= code < 500
    _assert_healthy(bad_daemon)


def test_clients_that_disconnect_mid_request(bad_daemon: Daemon) -> None:
    before = _all_jobs(bad_daemon)
    body = json.dumps({"command": ["/bin/true"], "env": {"PATH": NO_PROGRAMS}}).encode()
    full = http_request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
    end_of_head = full.index(b"\r\n\r\n")
    for cut in (5, end_of_head, end_of_head + 4 + len(body) // 2):
        for _ in range(5):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(bad_daemon.socket))
                s.sendall(full[:cut])
    # None of the cut submissions made a job: a request is acted on only when complete.
    assert _all_jobs(bad_daemon) == before
    # Long polls on a running job whose clients go away.
    sleeper = bad_daemon.submit(cmd=[PY, "-m", "gpuwarden.sim.job", "--seconds", "300"])
    for _ in range(5):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(bad_daemon.socket))
            s.sendall(http_request("GET", f"/v1/jobs/{sleeper}/wait?timeout=60"))
            time.sleep(0.05)
    # Clients that read nothing of a large answer.
    for _ in range(5):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(bad_daemon.socket))
            s.sendall(http_request("GET", "/openapi.json"))
    _assert_healthy(bad_daemon)
    bad_daemon.cli("cancel", str(sleeper), check=True)
    assert bad_daemon.wait_state(sleeper, "cancelled")["state"] == "cancelled"
    _assert_healthy(bad_daemon)


def test_many_concurrent_bad_clients(bad_daemon: Daemon) -> None:
    """A burst of half-open connections and bad requests at once must not starve a good
    client: the daemon answers it while the others hang."""
    hanging = []
    try:
        for _ in range(50):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(bad_daemon.socket))
            s.sendall(b"POST /v1/jobs HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            hanging.append(s)
        started = time.monotonic()
        _assert_healthy(bad_daemon)
        assert time.monotonic() - started < 5
    finally:
        for s in hanging:
            s.close()
    _assert_healthy(bad_daemon)


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=st.one_of(
        st.binary(max_size=400),
        st.builds(
            lambda line, rest: line + b"\r\n" + rest,
            st.sampled_from(
                [
                    b"GET /v1/jobs HTTP/1.1",
                    b"POST /v1/jobs HTTP/1.1",
                    b"POST /v1/jobs/1/cancel HTTP/1.0",
                    b"GET / HTTP/9.9",
                ]
            ),
            st.binary(max_size=400),
        ),
    )
)
def test_random_bytes_on_the_socket(bad_daemon: Daemon, data: bytes) -> None:
    """Whatever arrives, the daemon answers or hangs up; it never dies."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(bad_daemon.socket))
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except (OSError, TimeoutError):
            pass
    assert Client(str(bad_daemon.socket), timeout=10).alive()
