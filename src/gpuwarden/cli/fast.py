"""``gpuwarden status`` answered from the daemon's snapshot (``GET /v1/snapshot``), before
click or any backend is imported: the standard library and the plain renderer of
``render/statusview.py``. Anything it does not handle, or no daemon answering within ``GLANCE``,
goes the usual way (``cli/main.py``), which takes a snapshot here."""

from __future__ import annotations

import json
import os
import sys
import time

TYPE_CHECKING = False  # nor typing, nor urllib, nor pathlib: each costs a start-up
if TYPE_CHECKING:
    from typing import Any

GLANCE = 0.1  # seconds the daemon may take to answer before status takes its own snapshot
SAMPLES = 3  # leaks --samples' default: the snapshots a leak must be found in
STATUS_VALUED = ("--format", "--gpu", "--user", "--pid")  # the status options with a value


def _parse(args: list[str], valued: tuple[str, ...]) -> dict[str, Any] | None:
    """The options this path serves (``--json`` and those of ``valued`` among
    ``--format table|json``, ``--gpu``, ``--user``, ``--pid``), or None for anything
    else (``--fresh``, ``--watch``, CSV, ``leaks --samples``, help, a value click would
    refuse): the usual path then."""
    opts: dict[str, Any] = {"json": False, "gpus": [], "user": None, "pid": None}
    i = 0
    while i < len(args):
        arg, value = args[i], None
        name, eq, inline = arg.partition("=")
        if name in valued:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                return None
        elif eq or arg != "--json":
            return None
        if arg == "--json" or (name == "--format" and value == "json"):
            opts["json"] = True
        elif name == "--format":
            if value != "table":
                return None
        elif name == "--user":
            opts["user"] = value
        else:
            assert value is not None
            if not (value.isascii() and value.isdigit()):
                return None
            if name == "--gpu":
                opts["gpus"].append(int(value))
            else:
                opts["pid"] = int(value)
        i += 1
    return opts


def _quote(value: str) -> str:
    """``urllib.parse.quote(value, safe="")``."""
    return "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-._~") else f"%{b:02X}"
        for b in value.encode("utf-8", "surrogateescape")
    )


def socket_path() -> str:
    """The daemon's socket, as ``client.paths.resolve_paths`` finds it; the home and
    system modes without importing it (pathlib and dataclasses cost more than the rest
    of this path)."""
    home = os.environ.get("GPUWARDEN_HOME")
    if home:
        return os.path.join(os.getcwd(), home, "gpuwarden.sock")
    if os.geteuid() == 0 or os.path.isfile("/etc/gpuwarden/config.toml"):
        return "/run/gpuwarden.sock"
    from gpuwarden.client.paths import resolve_paths

    return str(resolve_paths().socket)


def _get(sock: str, path: str, query: dict[str, Any]) -> bytes | None:
    """GET ``path`` on the daemon's socket, HTTP/1.1 by hand (``http.client`` costs more
    to import than the whole answer takes): the body of a 200 answer, else None.
    Raises OSError when no daemon answers within ``GLANCE`` seconds in all."""
    import socket

    qs = "&".join(f"{k}={_quote(str(v))}" for k, v in query.items() if v is not None)
    deadline = time.monotonic() + GLANCE
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(GLANCE)
        s.connect(sock)
        s.sendall(
            f"GET {path}{'?' + qs if qs else ''} HTTP/1.1\r\nHost: localhost\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the daemon did not answer in time")
            s.settimeout(left)
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not sep or lines[0].split()[1:2] != ["200"]:
        return None
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    if "chunked" in headers.get("transfer-encoding", "") or len(body) != int(
        headers.get("content-length", -1)
    ):
        return None
    return body


def _emit_json(doc: Any) -> None:
    """As ``cli.plain.emit_json`` (whose module imports typing, which this path
    does not): indented on a terminal, compact when piped."""
    if sys.stdout.isatty():
        sys.stdout.write(json.dumps(doc, indent=2, default=str))
    else:
        sys.stdout.write(json.dumps(doc, separators=(",", ":"), default=str))
    sys.stdout.write("\n")


def _leaks(
    found: list[dict[str, Any]], opts: dict[str, Any], answer: dict[str, Any], age: float
) -> None:
    """``leaks`` from the daemon's last snapshots; exits 1 when one is a leak."""
    if opts["gpus"]:
        found = [lk for lk in found if lk["gpu"] in opts["gpus"] or lk["gpu"] is None]
    if opts["json"]:
        _emit_json(
            {
                "leaks": found,
                "daemon": {
                    "age": round(age, 3),
                    "samples": answer["samples"],
                    "span": round(answer["span"], 3),
                },
            }
        )
    else:
        from gpuwarden.render.ink import for_stream
        from gpuwarden.render.statusview import emit, leak_lines

        ink, width = for_stream(sys.stdout)
        emit(
            [
                *leak_lines(found, width, ink),
                ink(
                    f"from the daemon's last {answer['samples']} snapshots over "
                    f"{answer['span']:.1f} s, the latest {age:.1f} s old "
                    "(--samples or --interval: sample now)",
                    "dim",
                ),
            ]
        )
    if any(lk["kind"] != "monitor" for lk in found):
        sys.stdout.flush()
        sys.exit(1)


def served(argv: list[str]) -> bool:
    """Print ``status`` (or ``leaks``) from the daemon's snapshots if ``argv`` asks for
    one this path serves and a daemon answers in time with a young enough snapshot (for
    ``leaks``, as many as its ``--samples``) of the backend this process would open;
    False (having printed nothing) otherwise. ``leaks`` exits 1 on a leak, as ever."""
    if not argv or argv[0] not in ("status", "leaks"):
        return False
    leaks = argv[0] == "leaks"
    opts = _parse(argv[1:], ("--gpu",) if leaks else STATUS_VALUED)
    if opts is None:
        return False
    try:
        sock = socket_path()
        if not os.path.exists(sock):
            return False
        query = (
            {"view": "leaks"}
            if leaks
            else {
                "gpu": ",".join(map(str, opts["gpus"])) or None,
                "user": opts["user"],
                "pid": opts["pid"],
            }
        )
        body = None
        if not leaks and not opts["json"]:  # the screen, drawn by the daemon for us
            from gpuwarden.render.ink import for_stream

            ink, width = for_stream(sys.stdout)
            if width >= 20:
                body = _get(
                    sock,
                    "/v1/snapshot",
                    {**query, "view": "table", "width": width, "colour": int(ink.colour)},
                )
        if body is None:  # leaks, JSON, or a daemon that draws no tables: the document
            body = _get(sock, "/v1/snapshot", query)
        if body is None:
            return False
        at = body.find(b',"snapshot":')  # the last key: the document as --json prints it
        raw = body[at + len(b',"snapshot":') : -1]
        if at < 0 or raw == b"null":
            return False
        answer = json.loads(body[:at] + b"}")
        if (answer["backend"] == "sim") != bool(os.environ.get("GPUWARDEN_SIM")):
            return False  # not the machine this process would see
        if any(g not in set(answer["gpus"]) for g in opts["gpus"]):
            return False  # the usual path names the GPU that is not there
        if leaks and answer["samples"] < SAMPLES:
            return False  # not yet the consecutive samples a leak must persist over
        age = max(time.time() - float(answer["taken_at"]), 0.0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    if leaks:
        _leaks(json.loads(raw)["leaks"], opts, answer, age)
    if opts["json"]:
        stamp = b',"daemon":{"age":' + json.dumps(round(age, 3)).encode() + b"}}"
        if sys.stdout.isatty():
            _emit_json(json.loads(raw[:-1] + stamp))
        else:  # as emit_json writes it into a pipe, without parsing it
            sys.stdout.flush()
            sys.stdout.buffer.write(raw[:-1] + stamp + b"\n")
        return True
    from gpuwarden.render.statusview import drain_lines, emit, render_doc

    doc = json.loads(raw)
    if isinstance(doc, str):  # the lines themselves (``view=table``)
        sys.stdout.write(doc)
        lines = []
    else:
        lines = render_doc(doc, matching=bool(opts["user"] or opts["pid"]), width=width, ink=ink)
    emit(
        [
            *lines,
            *(ink(line, "yellow") for line in drain_lines(answer.get("drains") or [])),
            ink(f"from the daemon's snapshot, {age:.1f} s old (--fresh: take one now)", "dim"),
        ]
    )
    return True


def plain_status(argv: list[str]) -> dict[str, Any] | None:
    """The options of a ``status`` this path would serve (``_parse``), for
    ``cli/statusonce.py`` to answer without click when no daemon did; None otherwise."""
    if not argv or argv[0] != "status":
        return None
    return _parse(argv[1:], STATUS_VALUED)
