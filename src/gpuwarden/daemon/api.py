"""HTTP + JSON over the unix socket (aiohttp). Handlers take the caller from the
socket's peer credentials, call the JobService in a worker thread, and turn typed errors
into 4xx answers: bad input never reaches the daemon as an exception."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gpuwarden import __version__
from gpuwarden.client.api import MAX_PAGE, PAGE
from gpuwarden.daemon.auth import Caller
from gpuwarden.daemon.connections import PEERS, caller_of
from gpuwarden.daemon.openapi import document
from gpuwarden.daemon.repeated import log_repeated
from gpuwarden.daemon.service import JobService
from gpuwarden.daemon.store_errors import Conflict, JobNotFound, StoreError
from gpuwarden.errors import GpuwardenError, PermissionDenied, UsageError
from gpuwarden.printable import visible
from gpuwarden.units import parse_duration

log = logging.getLogger("gpuwarden.api")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SERVICE = web.AppKey("service", JobService)
STARTED = web.AppKey("started", float)
MAX_BODY = 4 << 20
REQUEST_TIMEOUT = web.AppKey("request_timeout", float)  # for a request's body
# One job listing at a time per user (uid -> its turn): a page is up to 60 ms of CPU.
LISTING = web.AppKey("listing", dict[int, asyncio.Semaphore])


def _status_for(e: Exception) -> int:
    if isinstance(e, PermissionDenied):
        return 403
    if isinstance(e, JobNotFound):
        return 404
    if isinstance(e, Conflict):
        return 409
    if isinstance(e, StoreError):  # the daemon's side: a full disk, a broken database
        return 503
    return 400


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except GpuwardenError as e:
        return web.json_response({"error": str(e)}, status=_status_for(e))
    except Exception as e:  # the daemon must outlive any one request
        log_repeated(
            log,
            logging.ERROR,
            f"internal:{type(e).__name__}",
            "internal error on %s %s",
            request.method,
            request.path,
            exc_info=True,
        )
        return web.json_response({"error": f"internal error: {type(e).__name__}: {e}"}, status=500)


def job_id_of(request: web.Request) -> int:
    """The job id of the path (``/v1/jobs/{id}``), ASCII digits only (never "²")."""
    raw = request.match_info["id"]
    if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) < 2**63:  # not "²"
        raise UsageError(f"invalid job id {raw!r}")
    return int(raw)


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name)
    if value is None:
        return False
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise UsageError(f"{name} must be true or false")


async def _body(request: web.Request, carried: tuple[str, ...] = ()) -> Any:
    """The request's JSON. ``carried``: the keys of a top-level object whose strings may
    hold bytes that are not UTF-8 (argv and environment values may, on Linux), as
    Python's surrogateescape writes them (U+DC80-U+DCFF, JSON "\\udcff")."""
    if request.content_length and request.content_length > MAX_BODY:
        raise UsageError("request body too large")
    timeout = request.app.get(REQUEST_TIMEOUT, 5.0)
    try:
        data = await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:  # a slow body: the connection goes with it
        if request.transport is not None:
            request.transport.abort()
        raise UsageError(f"the request body did not arrive within {timeout:g}s") from None
    try:
        body = json.loads(data or b"null", parse_constant=_no_constant, parse_float=_finite_float)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError("the request body is nested too deeply") from None
    try:  # "\ud800" parses, but is no character: no argv, path or name can hold it
        json.dumps(body, ensure_ascii=False).encode(errors="surrogateescape")
    except RecursionError:
        raise UsageError("the request body is nested too deeply") from None
    except UnicodeEncodeError:
        raise UsageError(
            "the request body is not valid JSON: a string holds a lone surrogate (\\ud800-\\udfff)"
        ) from None
    for key, value in body.items() if isinstance(body, dict) else [(None, body)]:
        if key in carried:
            continue
        try:
            json.dumps([key, value], ensure_ascii=False).encode()
        except UnicodeEncodeError:
            what = "the request body" if key is None else visible(key)
            raise UsageError(
                f"{what} is not UTF-8"
                + (f" (only {' and '.join(carried)} may hold other bytes)" if carried else "")
            ) from None
    return body


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (Python's parser accepts them by default)."""
    raise UsageError(f"the request body is not valid JSON: {name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise UsageError(f"the request body is not valid JSON: {text} is out of range")
    return value


THREADS_PER_USER = 2  # a user's requests in the worker threads at once; the rest wait
_slots: dict[int, asyncio.Semaphore] = {}


def _slot(caller: Caller) -> asyncio.Semaphore:
    return _slots.setdefault(caller.uid, asyncio.Semaphore(THREADS_PER_USER))


async def call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn`` in a worker thread; a call for a caller (the first argument) waits until
    that user has fewer than THREADS_PER_USER there, so that one user's request loop
    cannot occupy every thread while another user's ``ps`` waits in line."""
    if not args or not isinstance(args[0], Caller):
        return await asyncio.to_thread(fn, *args, **kw)
    async with _slot(args[0]):
        return await asyncio.to_thread(fn, *args, **kw)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__, "uptime": time.time() - request.app[STARTED]})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


def _int_query(request: web.Request, name: str, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or not lo <= int(raw) <= hi:
        raise UsageError(f"{name} must be a whole number from {lo} to {hi}")
    return int(raw)


async def list_jobs(request: web.Request) -> web.Response:
    """One page: at most ``limit`` jobs, the first after the job id ``after``, else the
    latest before ``before`` (or the latest of all), in id order; ``more`` says whether
    the listing goes on past it. 10,000 jobs in one answer, asked for in a loop, kept
    the daemon's threads busy for everyone. A page (up to 60 ms of CPU) is read and
    encoded in one worker thread, one listing of a user's at a time: a user's eight
    listing loops then cost another user's submit one thread's share of the
    interpreter, not three (two of the lister's threads, and the serving loop encoding
    pages), and the other user's own listing waits for none of them."""
    svc, caller = request.app[SERVICE], caller_of(request)
    states = [s for v in request.query.getall("state", []) for s in v.split(",") if s]
    limit = _int_query(request, "limit", 1, MAX_PAGE) or PAGE
    before = _int_query(request, "before", 1, 2**63 - 1)
    after = _int_query(request, "after", 0, 2**63 - 1)
    if before is not None and after is not None:
        raise UsageError("give before or after, not both")
    all_jobs, user = _flag(request, "all"), request.query.get("user") or None
    group, array = request.query.get("group") or None, _int_query(request, "array", 1, 2**63 - 1)

    def page() -> bytes:
        jobs = svc.list(
            caller,
            all_jobs=all_jobs,
            user=user,
            group=group,
            states=states or None,
            limit=limit + 1,
            before=before,
            after=after,
            array=array,
        )
        more = len(jobs) > limit
        if more:  # the one past the page: the next after it, or the one before it
            jobs = jobs[:limit] if after is not None else jobs[1:]
        return json.dumps({"jobs": jobs, "more": more}).encode()

    # The listing's turn first: a listing waiting for it holds none of the user's
    # threads, which the user's other requests (a submit, a show) can have meanwhile.
    turn = request.app[LISTING].setdefault(caller.uid, asyncio.Semaphore(1))
    async with turn, _slot(caller):
        body = await asyncio.to_thread(page)
    return web.Response(body=body, content_type="application/json")


async def submit(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    body = await _body(request, carried=("command", "env"))
    out = await call(svc.admission.submit, caller, body)
    return web.json_response(out, status=201 if out["created"] else 200)


async def show(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    return web.json_response(await call(svc.show, caller, job_id_of(request)))


async def remove(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    job_id = job_id_of(request)
    await call(svc.actions.remove, caller, job_id)
    return web.json_response({"id": job_id, "removed": True})


def _action(name: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        svc, caller = request.app[SERVICE], caller_of(request)
        action = getattr(svc.actions, name)
        return web.json_response(await call(action, caller, job_id_of(request)))

    return handler


async def cancel(request: web.Request) -> web.Response:
    """``?kill=1``: SIGKILL a running job's tree at once instead of SIGTERM and grace."""
    svc, caller = request.app[SERVICE], caller_of(request)
    kill = request.query.get("kill", "0")
    if kill not in ("0", "1"):
        raise UsageError("kill must be 0 or 1")
    job_id = job_id_of(request)
    return web.json_response(await call(svc.actions.cancel, caller, job_id, kill == "1"))


async def cancel_many(request: web.Request) -> web.Response:
    """Many jobs in one request (``cancel 1-100000``, ``cancel --group``)."""
    svc, caller = request.app[SERVICE], caller_of(request)
    body = await _body(request)
    if not isinstance(body, dict) or set(body) - {"ids", "refs", "group", "kill"}:
        raise UsageError("the body is an object with ids, refs, group and kill")
    # A field given must hold what the document says (a list may be empty: `cancel
    # --group` sends no refs as []); null is no list.
    ids, group, kill = body.get("ids", []), body.get("group"), body.get("kill", False)
    refs = body.get("refs", [])
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in ids
    ):
        raise UsageError("ids must be a list of job ids")
    if not isinstance(refs, list):
        raise UsageError("refs must be a list of job references such as 3, 3-7 or 12_7")
    if group is not None and (not isinstance(group, str) or not 0 < len(group) <= 200):
        raise UsageError("group must be a group name")
    if not isinstance(kill, bool):
        raise UsageError("kill must be true or false")
    if not ids and not refs and group is None:
        raise UsageError("name job ids or a group")
    return web.json_response(await call(svc.actions.cancel_many, caller, ids, group, kill, refs))


async def resolve(request: web.Request) -> web.Response:
    """The job ids that references such as ``3-7`` and ``12_7`` name (jobs/arrays.py)."""
    svc, caller = request.app[SERVICE], caller_of(request)
    body = await _body(request)
    if not isinstance(body, dict) or set(body) != {"refs"}:
        raise UsageError("the body is an object with refs")
    return web.json_response(await call(svc.actions.resolve, caller, body["refs"]))


async def wait(request: web.Request) -> web.Response:
    """Long poll: answers as soon as the job has ended, or after ``timeout`` seconds."""
    svc, caller = request.app[SERVICE], caller_of(request)
    job_id = job_id_of(request)
    try:
        timeout = float(request.query.get("timeout", "30"))
    except ValueError:
        timeout = math.nan
    if not 0 <= timeout <= 3600:  # as documented; NaN would never reach the deadline
        raise UsageError("timeout must be a number of seconds from 0 to 3600")
    deadline = time.monotonic() + timeout
    while True:
        job = await call(svc.show, caller, job_id)
        if (
            job["state"] in ("succeeded", "failed", "cancelled", "infeasible")
            or time.monotonic() >= deadline
        ):
            return web.json_response(job)
        if request.transport is None or request.transport.is_closing():
            return web.json_response(job)  # the client has gone: stop polling for it
        await asyncio.sleep(min(0.1, max(deadline - time.monotonic(), 0)))


def _report(name: str) -> Handler:
    """An attached job's launcher reports its start or its end (daemon/attached.py)."""

    async def handler(request: web.Request) -> web.Response:
        svc, caller = request.app[SERVICE], caller_of(request)
        job_id, body = job_id_of(request), await _body(request)
        return web.json_response(await call(getattr(svc, name), caller, job_id, body))

    return handler


async def logs(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    try:
        offset = int(request.query.get("offset", "0"))
        attempt = None if "attempt" not in request.query else int(request.query["attempt"])
    except ValueError:
        raise UsageError("offset and attempt must be integers") from None
    got = await call(
        svc.logs, caller, job_id_of(request), request.query.get("stream", "stdout"), offset, attempt
    )
    return web.Response(
        body=got.data,
        content_type="application/octet-stream",
        headers={
            "X-Next-Offset": str(got.next_offset),
            "X-Job-Ended": str(got.job_ended).lower(),
            "X-Attempt": str(got.attempt),
            "X-Attempts": str(got.attempts),
            "X-Attempt-Ended": str(got.ended).lower(),
        },
    )


async def job_pids(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    return web.json_response(await call(svc.job_pids, caller))


async def clean(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    body = await _body(request)
    if not isinstance(body, dict) or "older_than" not in body:
        raise UsageError("older_than is required")
    raw = body["older_than"]
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise UsageError("older_than must be a duration")
    removed = await call(svc.actions.clean, caller, parse_duration(raw))
    return web.json_response({"removed": removed})


async def edit(request: web.Request) -> web.Response:
    """Change a queued or held job's request (``gpuwarden edit``)."""
    svc, caller = request.app[SERVICE], caller_of(request)
    job_id, body = job_id_of(request), await _body(request)
    return web.json_response(await call(svc.admission.edit, caller, job_id, body))


def _gpu_index(request: web.Request) -> int:
    raw = request.match_info["index"]
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= 1 << 16:
        raise UsageError(f"invalid GPU index {raw!r}")
    return int(raw)


async def drains(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    return web.json_response(await call(svc.drains.list, caller))


async def drain(request: web.Request) -> web.Response:
    """Admins: no new placement on this GPU; the body may give a reason."""
    svc, caller = request.app[SERVICE], caller_of(request)
    index, body = _gpu_index(request), await _body(request)
    if body is None:
        body = {}
    if not isinstance(body, dict) or set(body) - {"reason"}:
        raise UsageError("the body is an object with an optional reason")
    return web.json_response(await call(svc.drains.drain, caller, index, body.get("reason")))


async def undrain(request: web.Request) -> web.Response:
    svc, caller = request.app[SERVICE], caller_of(request)
    return web.json_response(await call(svc.drains.undrain, caller, _gpu_index(request)))


async def accounting(request: web.Request) -> web.Response:
    """Accounting per user, group or key (``?by=``) over ``?since=`` (a duration)."""
    svc, caller = request.app[SERVICE], caller_of(request)
    raw = request.query.get("since")
    since = None if raw is None else parse_duration(raw)
    return web.json_response(await call(svc.report, caller, since, request.query.get("by", "user")))


def make_app(service: JobService) -> web.Application:
    """The API's routes; the composition root (daemon/main.py) adds the web page's and
    the served snapshot's beside them."""
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app[SERVICE] = service
    app[STARTED] = time.time()
    app[PEERS] = {}
    app[LISTING] = {}
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/report", accounting)  # accounting (gpuwarden report)
    app.router.add_get("/v1/drains", drains)  # drained GPUs (gpu drain)
    app.router.add_post("/v1/gpus/{index}/drain", drain)
    app.router.add_post("/v1/gpus/{index}/undrain", undrain)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_post("/v1/jobs", submit)
    app[REQUEST_TIMEOUT] = service.config.request_timeout
    app.router.add_get("/v1/jobs/{id}", show)
    app.router.add_delete("/v1/jobs/{id}", remove)
    app.router.add_post("/v1/jobs/{id}/cancel", cancel)
    app.router.add_post("/v1/jobs/{id}/edit", edit)
    for verb in ("hold", "release", "retry", "unreserve"):
        app.router.add_post(f"/v1/jobs/{{id}}/{verb}", _action(verb))
    for report in ("started", "ended"):
        app.router.add_post(f"/v1/jobs/{{id}}/{report}", _report(report))
    app.router.add_get("/v1/jobs/{id}/wait", wait)
    app.router.add_get("/v1/jobs/{id}/logs", logs)
    app.router.add_post("/v1/clean", clean)
    app.router.add_get("/v1/job-pids", job_pids)
    app.router.add_post("/v1/cancel", cancel_many)
    app.router.add_post("/v1/resolve", resolve)
    return app
