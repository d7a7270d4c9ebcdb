"""The daemon process: one per state directory (a lock file says so), serving the API on
the unix socket and running the scheduling loop. Jobs live in their supervisors, so
stopping or killing the daemon stops no job."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import IO, Any

from aiohttp import web

from gpuwarden.client.paths import Paths, resolve_paths
from gpuwarden.daemon.config import Config, load_config
from gpuwarden.daemon.repeated import log_repeated, loop_errors
from gpuwarden.daemon.service import JobService
from gpuwarden.errors import GpuwardenError
from gpuwarden.procs.identity import alive, boot_id

log = logging.getLogger("gpuwarden.daemon")


class AlreadyRunning(GpuwardenError):
    exit_code = 1


LOCK_RELEASE_WAIT = 1.0
"""Seconds a daemon waits for the lock of one that has exited: its pid already reads as
gone (a zombie) while its other threads are still ending, and the lock comes free with
the last of them, some milliseconds later."""


def take_lock(paths: Paths) -> IO[str]:
    """The state directory's lock, held for the daemon's life (one daemon per
    directory), with this daemon's pid written in it; ``AlreadyRunning`` when a daemon
    that runs holds it."""
    paths.home.mkdir(parents=True, exist_ok=True)
    f = open(paths.lock, "a+")  # noqa: SIM115 — held for the daemon's life
    deadline = time.monotonic() + LOCK_RELEASE_WAIT
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if _holder_alive(f) or time.monotonic() > deadline:
                f.close()
                raise AlreadyRunning(f"a gpuwarden daemon already runs for {paths.home}") from None
            time.sleep(0.005)
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _holder_alive(f: IO[str]) -> bool:
    """Does the daemon the lock file names still run (an unreadable pid: it may)?"""
    f.seek(0)
    try:
        pid = int(f.read().split()[0])
    except (ValueError, IndexError):
        return True
    return alive(pid, None)


class ExitWatcher:
    """Wake the scheduling loop the moment a supervisor exits (a pidfd becomes readable),
    so a finished job frees its GPUs at once instead of at the next periodic pass."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]) -> None:
        self.loop = loop
        self.wake = wake
        self.fds: dict[int, int] = {}  # pid -> pidfd

    def watch(self, pids: set[int]) -> None:
        for pid in set(self.fds) - pids:
            self._drop(pid)
        if not hasattr(os, "pidfd_open"):
            return
        for pid in pids - set(self.fds):
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # already gone: the next pass collects it anyway
            self.fds[pid] = fd
            self.loop.add_reader(fd, self._exited, pid)

    def _exited(self, pid: int) -> None:
        self._drop(pid)
        self.wake()

    def _drop(self, pid: int) -> None:
        fd = self.fds.pop(pid, None)
        if fd is not None:
            self.loop.remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        for pid in list(self.fds):
            self._drop(pid)


class DaemonMetrics:
    """/metrics of the daemon (``metrics_listen``): the GPUs and processes, as the
    exporter has them, plus the queue and its jobs. Served by the daemon's event loop
    like the page (bounded connections, timeouts), scrapes collected on the web's
    threads, so a scrape flood cannot delay a pass or hold thousands of threads."""

    def __init__(self, config: Config) -> None:
        from prometheus_client import CollectorRegistry

        from gpuwarden.metrics.jobs import pass_histogram

        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.on_pass = pass_histogram(self.registry)
        self.runner: web.AppRunner | None = None
        self.backend: Any = None

    async def start(self, store: Any, sched: Any, pool: Executor) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST
        from prometheus_client.exposition import gzip_accepted

        from gpuwarden.gpus.backend import open_backend
        from gpuwarden.metrics.collector import SnapshotCollector, render_segments, render_text
        from gpuwarden.metrics.gzipped import GzipSegments
        from gpuwarden.metrics.jobs import JobsCollector
        from gpuwarden.observe.snapshot import take_snapshot
        from gpuwarden.web.routes import off_loop

        assert self.config.metrics_listen is not None
        self.backend = open_backend()  # its own: scrapes run on the web's threads
        backend = self.backend
        # The pass histogram (in self.registry), then the snapshot's series rendered by
        # their collector (the same bytes as generate_latest, cheaper), then the queue's.
        parts = (
            self.registry,
            SnapshotCollector(
                lambda: take_snapshot(backend), cache_seconds=self.config.metrics_cache
            ),
            JobsCollector(store, lambda: sched.last_running),
        )
        gzipped = GzipSegments()

        async def metrics(request: web.Request) -> web.Response:
            headers = {"Content-Type": CONTENT_TYPE_LATEST}
            if gzip_accepted(request.headers.get("Accept-Encoding", "")):
                headers["Content-Encoding"] = "gzip"
                body = await off_loop(pool, lambda: gzipped.compress(render_segments(parts)))
            else:
                body = await off_loop(pool, render_text, parts)
            return web.Response(body=body, headers=headers)

        app = web.Application(client_max_size=1 << 16)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/", metrics)
        self.runner = await _serve_tcp(
            self.config, app, "metrics_listen", self.config.metrics_listen
        )
        log.info("metrics on http://%s/metrics", self.config.metrics_listen)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.backend is not None:
            self.backend.close()


async def _serve_tcp(config: Config, app: web.Application, name: str, listen: str) -> web.AppRunner:
    """Serve ``app`` on ``listen`` (the setting ``name``), its connections bounded in
    all (``max_connections_tcp``) and timed out like the socket's."""
    from gpuwarden.daemon.connections import guard_connections
    from gpuwarden.metrics.exporter import parse_listen

    host, port = parse_listen(listen)
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=config.idle_timeout
    )
    await runner.setup()
    assert runner.server is not None
    guard_connections(
        runner.server,
        name,
        limit=config.max_connections_tcp,
        per_user=False,
        request_timeout=config.request_timeout,
    )
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        raise GpuwardenError(f"{name} {listen}: {e.strerror or e}") from None
    return runner


def _metrics_registry(config: Config) -> DaemonMetrics | None:
    return None if config.metrics_listen is None else DaemonMetrics(config)


async def _start_public_web(config: Config, store: Any, pool: Executor) -> web.AppRunner | None:
    """The read-only web page on ``web_listen`` for anyone who can reach it."""
    if config.web_listen is None:
        return None
    from gpuwarden.web.routes import make_public_app

    runner = await _serve_tcp(config, make_public_app(store, pool), "web_listen", config.web_listen)
    log.info("web page on http://%s/ui/ (read-only)", config.web_listen)
    return runner


WEB_THREADS = 2  # the page's and /metrics' reads and chart draws, at most this many at once


async def _close_web(
    metrics: DaemonMetrics | None, public: web.AppRunner | None, pool: Executor, store: Any
) -> None:
    if metrics is not None:
        await metrics.stop()
    if public is not None:
        await public.cleanup()
    pool.shutdown(wait=False, cancel_futures=True)
    store.close()


async def serve(paths: Paths, config: Config) -> None:
    from gpuwarden.daemon.api import make_app
    from gpuwarden.daemon.connections import guard_connections, identify_peers
    from gpuwarden.daemon.loop import Scheduler
    from gpuwarden.daemon.store import Store
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.procs.holders import keep_fd_tables
    from gpuwarden.supervisor.forkserver import ForkServer

    asyncio.get_running_loop().set_exception_handler(loop_errors)
    keep_fd_tables()  # its snapshots scan /proc for device holders every few seconds
    store = Store(paths.db)
    paths.jobs_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.jobs_dir, 0o711)  # job directories hold each owner's private logs
    highest = paths.highest_job_dir()
    issued = store.ids_above(highest)
    if issued is not None:
        log.warning(
            "state database %s knows jobs up to %s only, but %s holds job "
            "directories up to %s (was the database reset?); new job ids start "
            "at %s and those directories are left as they are",
            paths.db,
            issued,
            paths.jobs_dir,
            highest,
            highest + 1,
        )
    launcher = ForkServer()
    metrics = _metrics_registry(config)
    sched = Scheduler(
        store,
        paths.jobs_dir,
        config,
        open_backend,
        boot_id(),
        spawn=launcher.spawn,
        on_pass=None if metrics is None else metrics.on_pass,
    )
    # The page and /metrics: a connection and threads of their own (``off_loop``).
    web_store = Store(paths.db)
    web_pool = ThreadPoolExecutor(WEB_THREADS, thread_name_prefix="gpuwarden-web")
    passes = ThreadPoolExecutor(1, thread_name_prefix="gpuwarden-pass")

    def in_pass(fn: Callable[[], Any]) -> Awaitable[Any]:
        """Scheduling work runs on a thread no request can occupy."""
        return loop.run_in_executor(passes, fn)

    loop = asyncio.get_running_loop()
    try:
        if metrics is not None:
            await metrics.start(web_store, sched, web_pool)
    except BaseException:  # a taken port: nothing of this daemon may stay behind
        await _close_web(metrics, None, web_pool, web_store)
        raise
    await asyncio.to_thread(launcher.warm)
    wake = asyncio.Event()

    def nudge() -> None:
        loop.call_soon_threadsafe(wake.set)

    service = JobService(
        store,
        paths.jobs_dir,
        config,
        wake=nudge,
        gpus=lambda: sched.last_states,
        cancel_running=sched.cancel_running,
    )
    await in_pass(sched.recover)
    await in_pass(sched.tick)

    try:
        public = await _start_public_web(config, web_store, web_pool)
    except BaseException:  # a taken port: nothing of this daemon may stay behind
        launcher.close()
        await _close_web(metrics, None, web_pool, web_store)
        raise
    app = make_app(service)
    from gpuwarden.web.routes import add_web_routes

    add_web_routes(app, web_store, anonymous=False, pool=web_pool)  # `gpuwarden web`
    from gpuwarden.daemon.auth import Caller
    from gpuwarden.daemon.snapview import SnapshotKeeper, add_snapshot_route

    me = Caller(pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), user="gpuwarden", groups=())
    add_snapshot_route(
        app,
        SnapshotKeeper(
            open_backend,
            lambda: {  # `status`, served
                int(pid): job for pid, job in service.job_pids(me)["pids"].items()
            },
        ),
    )
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=config.idle_timeout
    )
    await runner.setup()
    assert runner.server is not None
    identify_peers(app, runner.server)
    guard_connections(
        runner.server,
        "socket",
        limit=config.max_connections_per_user,
        per_user=True,
        request_timeout=config.request_timeout,
    )
    sock = paths.socket
    sock.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    site = web.UnixSite(runner, str(sock))
    await site.start()
    os.chmod(sock, 0o666)  # every local user may connect; each request is authorized
    log.info("gpuwarden daemon %s serving on %s", os.getpid(), sock)

    from gpuwarden.daemon.heap import HeapTrimmer

    trimmer = HeapTrimmer()
    watcher = ExitWatcher(loop, nudge)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                waiter = asyncio.ensure_future(wake.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait(
                    {waiter, stopper}, timeout=config.interval, return_when=asyncio.FIRST_COMPLETED
                )
                waiter.cancel()
                stopper.cancel()
            wake.clear()
            if stop.is_set():
                break
            try:
                await in_pass(sched.tick)
                pids = await in_pass(
                    lambda: {j.supervisor_pid for j in store.active() if j.supervisor_pid}
                )
                watcher.watch(pids)
                await in_pass(trimmer.maybe_trim)  # what passes and pages freed
            except Exception as e:
                log_repeated(
                    log,
                    logging.ERROR,
                    f"pass:{type(e).__name__}",
                    "scheduling pass failed; trying again",
                    exc_info=True,
                )
    finally:
        watcher.close()
        launcher.close()
        sched.health.close()  # services' checks in flight: not waited for
        sched.notifier.close(wait=2.0)  # a moment for the word of jobs that just ended
        await _close_web(metrics, public, web_pool, web_store)
        await runner.cleanup()
        passes.shutdown(wait=False)
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        log.info("gpuwarden daemon %s stopped; running jobs continue", os.getpid())


def run(paths: Paths | None = None) -> int:
    paths = paths or resolve_paths()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        lock = take_lock(paths)
    except AlreadyRunning as e:
        print(f"gpuwarden: {e}", file=sys.stderr)
        return 1
    try:
        config = load_config(paths)
        asyncio.run(serve(paths, config))
    except GpuwardenError as e:
        log.error("%s", e)
        return e.exit_code
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
