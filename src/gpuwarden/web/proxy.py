"""``gpuwarden web``: the web page for one user, without opening a port to everyone. A
small HTTP server on a local address passes each GET under /ui/ to the daemon's unix
socket, where the daemon knows the caller (this process) by its credentials. Nothing
but GET is passed on, so the page stays read-only."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from aiohttp import ClientError, ClientSession, ClientTimeout, UnixConnector, web

PASSED_HEADERS = ("Content-Type", "Cache-Control", "Content-Security-Policy",
                  "X-Content-Type-Options", "Referrer-Policy")


def make_proxy_app(socket_path: str) -> web.Application:
    app = web.Application()

    async def root(_: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def forward(request: web.Request) -> web.Response:
        path = request.rel_url.raw_path_qs  # as asked: /ui/... with its query
        try:
            async with ClientSession(connector=UnixConnector(path=socket_path),
                                     timeout=ClientTimeout(total=30)) as session, \
                    session.get(f"http://gpuwarden{path}", allow_redirects=False) as r:
                body = await r.read()
                headers = {k: r.headers[k] for k in PASSED_HEADERS if k in r.headers}
                if "Location" in r.headers:
                    headers["Location"] = r.headers["Location"]
                return web.Response(status=r.status, body=body, headers=headers)
        except (ClientError, OSError) as e:
            return web.json_response(
                {"error": f"the gpuwarden daemon at {socket_path} is not reachable: {e}"},
                status=502)

    app.router.add_get("/", root)
    app.router.add_get("/ui", forward)
    app.router.add_get("/ui/{tail:.*}", forward)
    return app


async def serve(socket_path: str, host: str, port: int, on_ready: object = None) -> None:
    runner = web.AppRunner(make_proxy_app(socket_path), access_log=None)
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
