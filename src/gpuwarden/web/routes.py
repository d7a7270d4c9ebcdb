"""The web page's routes (aiohttp): the page itself, its two static files and its two
JSON feeds. The same routes serve the daemon's unix socket (local users, who see
command lines as ``gpuwarden ps`` shows them) and the optional public ``web_listen``
address (anonymous: read-only, no command lines). Only GET exists here."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from gpuwarden.daemon.store import Store
from gpuwarden.web.views import ChartCache, job_page, overview, parse_hours

STATIC = Path(__file__).resolve().parent / "static"
FILES = {"index.html": "text/html", "app.js": "application/javascript", "style.css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


T = TypeVar("T")


async def off_loop(pool: Executor | None, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """Run ``fn`` on ``pool`` (the web's and metrics' own threads, so that no page or
    scrape waits in line with, or delays, a scheduling pass or another user's API
    request), or in asyncio's default threads without one."""
    if pool is None:
        return await asyncio.to_thread(fn, *args, **kw)
    return await asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(fn, *args, **kw)
    )


def _file(name: str) -> web.Response:
    return web.Response(
        body=(STATIC / name).read_bytes(),
        content_type=FILES[name],
        charset="utf-8",
        headers=HEADERS,
    )


def add_web_routes(
    app: web.Application, store: Store, *, anonymous: bool, pool: Executor | None = None
) -> None:
    """``store``: a connection of the web's own (its reads never hold the scheduler's);
    ``pool``: the threads that read and draw (``off_loop``)."""
    cache = ChartCache()

    async def index(_: web.Request) -> web.Response:
        return _file("index.html")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in FILES:
            raise web.HTTPNotFound()
        return _file(name)

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def data_overview(request: web.Request) -> web.Response:
        hours = parse_hours(request.query.get("hours"))
        by = request.query.get("by", "job")
        data = await off_loop(
            pool, overview, store, hours=hours, by=by, anonymous=anonymous, cache=cache
        )
        return web.json_response(data, headers={"Cache-Control": "no-store"})

    async def data_job(request: web.Request) -> web.Response:
        from gpuwarden.daemon.api import job_id_of  # the API's rule: "²" is no job id

        data = await off_loop(pool, job_page, store, job_id_of(request), anonymous=anonymous)
        return web.json_response(data, headers={"Cache-Control": "no-store"})

    app.router.add_get("/ui", redirect)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/static/{name}", static)
    app.router.add_get("/ui/data/overview", data_overview)
    app.router.add_get("/ui/data/jobs/{id}", data_job)


def make_public_app(store: Store, pool: Executor | None = None) -> web.Application:
    """The app behind ``web_listen``: the page and its feeds, anonymous, nothing else."""
    from gpuwarden.daemon.api import errors

    app = web.Application(middlewares=[errors], client_max_size=1 << 16)

    async def root(_: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    app.router.add_get("/", root)
    add_web_routes(app, store, anonymous=True, pool=pool)
    return app
