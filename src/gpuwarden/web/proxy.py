"""``gpuwarden web``: the web page for one user, without opening a port to everyone. A
small HTTP server on a local address passes the page's GET routes to the daemon's unix
socket, where the daemon knows the caller (this process) by its credentials — so what
it passes on is read as its owner, and it must serve its owner alone:

- only to a browser that brought the random token of the URL it printed (as Jupyter
  does: ``?token=...`` once, then an HttpOnly, SameSite=Strict cookie); anyone else on
  the machine gets 403;
- only the page's own read-only routes, matched on the decoded path, and rebuilt from
  what matched (``/ui/%2e%2e/v1/jobs/12/logs`` never reaches the API); anything else
  is 404."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import signal
from urllib.parse import urlencode

from aiohttp import ClientError, ClientSession, ClientTimeout, UnixConnector, web

PASSED_HEADERS = (
    "Content-Type",
    "Cache-Control",
    "Content-Security-Policy",
    "X-Content-Type-Options",
    "Referrer-Policy",
)
# The page's routes (web/routes.py), nothing else: the decoded path must match whole.
ROUTES = re.compile(
    r"/ui/?|/ui/static/(?:index\.html|app\.js|style\.css)"
    r"|/ui/data/overview|/ui/data/jobs/[0-9]{1,18}"
)
QUERY_KEYS = ("hours", "by")  # what the feeds read


def cookie_name(port: int) -> str:
    """One cookie per proxy: browsers share cookies across a host's ports."""
    return f"gpuwarden_web_{port}"


def make_proxy_app(socket_path: str, token: str, port: int) -> web.Application:
    app = web.Application()
    cookie = cookie_name(port)

    def _is(value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), token.encode())

    async def handle(request: web.Request) -> web.StreamResponse:
        if _is(request.query.get("token")):  # the printed URL: the token becomes a cookie
            rest = {k: v for k, v in request.query.items() if k != "token"}
            where = "/ui/" if request.path in ("/", "/ui") else request.path
            if not ROUTES.fullmatch(where):
                raise web.HTTPNotFound()
            resp = web.HTTPFound(where + (f"?{urlencode(rest)}" if rest else ""))
            resp.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
            raise resp
        if not _is(request.cookies.get(cookie)):
            raise web.HTTPForbidden(
                text="gpuwarden web: open the URL it printed (with its token)\n"
            )
        if request.path == "/":
            raise web.HTTPFound("/ui/")
        if not ROUTES.fullmatch(request.path):
            raise web.HTTPNotFound()
        return await forward(
            request.path, {k: request.query[k] for k in QUERY_KEYS if k in request.query}
        )

    async def forward(path: str, query: dict[str, str]) -> web.Response:
        url = f"http://gpuwarden{path}" + (f"?{urlencode(query)}" if query else "")
        try:
            async with (
                ClientSession(
                    connector=UnixConnector(path=socket_path), timeout=ClientTimeout(total=30)
                ) as session,
                session.get(url, allow_redirects=False) as r,
            ):
                body = await r.read()
                headers = {k: r.headers[k] for k in PASSED_HEADERS if k in r.headers}
                if r.headers.get("Location") == "/ui/":  # the only redirect the page has
                    headers["Location"] = "/ui/"
                return web.Response(status=r.status, body=body, headers=headers)
        except (ClientError, OSError) as e:
            return web.json_response(
                {"error": f"the gpuwarden daemon at {socket_path} is not reachable: {e}"},
                status=502,
            )

    app.router.add_get("/{tail:.*}", handle)
    return app


async def serve(
    socket_path: str, host: str, port: int, token: str, on_ready: object = None
) -> None:
    runner = web.AppRunner(make_proxy_app(socket_path, token, port), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        if callable(on_ready):
            on_ready()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
