"""A pool of GPU worker processes with the ``concurrent.futures`` interface.

    with GpuPool(gpus=[0, 1], workers_per_gpu=2, memory="20G") as pool:
        results = list(pool.map(score, shards))

Each worker is a fresh interpreter (``spawn``: forking a process that has initialised
CUDA breaks CUDA in the child), started the way gpuwarden starts any command (the same
launch plan as ``gpuwarden exec`` and the job daemon): CUDA_VISIBLE_DEVICES names its one
GPU, the PyTorch cap hook holds it to its memory share once it imports torch, and its
CPU affinity is the GPU's local CPUs. Under the job daemon a worker's default share is
the job's budget split among the workers on that GPU, so the pool stays inside the job.

Unlike ProcessPoolExecutor, a worker that dies (a CUDA OOM that kills the process, a
segfault, SIGKILL) does not break the pool: the task it was running fails with
WorkerDied, saying which worker and why, and a new worker takes its place."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from gpuwarden.errors import GpuwardenError, UsageError
from gpuwarden.guard.memory import DriverProbe, MemoryProbe, job_budget
from gpuwarden.units import format_bytes, parse_size

# Several pools may start workers from several threads; os.environ is the spawned
# interpreter's environment, so it is swapped for one start at a time.
_SPAWN_LOCK = threading.Lock()
_GIVE_UP_AFTER = 3  # workers in a row that die before taking a task: the pool is broken


class WorkerDied(GpuwardenError):
    """The worker running a task died (killed, crashed); the pool replaced it."""


class BrokenPool(GpuwardenError):
    """Workers die as they start (a failing initializer, a bad environment)."""


class RemoteTraceback(Exception):
    """The worker-side traceback, attached as ``__cause__`` of a task's exception."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "for an unknown reason"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _worker_main(
    conn: Connection,
    cpus: frozenset[int] | None,
    initializer: Callable[..., Any] | None,
    initargs: tuple[Any, ...],
) -> None:
    """A worker: pin CPUs, run the initializer, then run tasks until told to stop."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException:
            conn.send(("init-failed", traceback.format_exc()))
            return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the pool is gone
        if not message:
            return
        task_id = None
        try:
            task_id, fn, args, kwargs = pickle.loads(message)
            reply: tuple[Any, ...] = (task_id, True, fn(*args, **kwargs))
        except BaseException as exc:
            reply = (task_id, False, exc, traceback.format_exc())
        try:
            conn.send(reply)
        except Exception as exc:  # the result or the exception does not pickle
            conn.send(
                (
                    task_id,
                    False,
                    None,
                    f"the task's {'result' if reply[1] else 'exception'} could not be "
                    f"sent back: {type(exc).__name__}: {exc}\n"
                    + (reply[3] if not reply[1] else ""),
                )
            )
        del reply


@dataclass(eq=False)
class _Task:
    id: int
    payload: bytes
    future: Future[Any]
    label: str
    device: int | None  # a GPU asked for (submit_to), else any


@dataclass(eq=False)
class _Worker:
    slot: int
    device: int  # visible ordinal in the pool's process
    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    ready: bool = False
    task: _Task | None = None
    init_error: str | None = None  # the initializer's traceback, when it failed


@dataclass(frozen=True)
class WorkerInfo:
    """A worker as the pool's user may see it."""

    slot: int
    device: int  # visible ordinal in this process
    gpu_index: int  # the machine's index, which the worker sees as cuda:0
    pid: int | None
    memory_limit: int | None  # bytes, its cap; None: uncapped
    cpus: frozenset[int] | None


class GpuPool(Executor):
    """``gpus``: visible ordinals to run workers on (default: every GPU this process
    sees). ``memory``: each worker's cap — bytes, "20G", or a fraction of the GPU such as
    0.25; default: the job's budget split among the GPU's workers under the daemon, else
    no cap. ``numa``: pin workers to their GPU's local CPUs."""

    def __init__(
        self,
        gpus: Sequence[int] | None = None,
        *,
        workers_per_gpu: int = 1,
        memory: int | str | None = None,
        numa: bool = True,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        probe: MemoryProbe | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        from gpuwarden.launch import plan_launch, probe_host

        if workers_per_gpu < 1:
            raise UsageError("workers_per_gpu must be at least 1")
        base_env = dict(os.environ if env is None else env)
        probe = probe if probe is not None else DriverProbe(base_env)
        devices = list(range(probe.device_count())) if gpus is None else list(gpus)
        if not devices:
            raise UsageError("no GPU to run workers on")
        if len(set(devices)) != len(devices):
            raise UsageError(f"a GPU is named twice in {devices}")
        host = probe_host(base_env)
        budget = job_budget(base_env)
        self._plans: dict[int, Any] = {}
        self._infos: dict[int, tuple[int, int | None]] = {}
        for device in devices:
            facts = probe.gpu(device)
            if memory is not None:
                limit: int | None = parse_size(memory, total=facts.memory_total)
            elif budget is not None:
                limit = budget // workers_per_gpu
            else:
                limit = None
            if limit is not None and limit > facts.memory_total:
                raise UsageError(
                    f"memory {format_bytes(limit)} per worker is more than GPU "
                    f"{facts.index} has ({format_bytes(facts.memory_total)})"
                )
            self._plans[device] = plan_launch(
                (sys.executable,), [facts], base_env=base_env, host=host, mem_limit=limit, bind=numa
            )
            self._infos[device] = (facts.index, limit)
        self._initializer = initializer
        self._initargs = initargs
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._pending: deque[_Task] = deque()
        self._workers: list[_Worker] = []
        self._ids = itertools.count()
        self._shutdown = False
        self._broken: str | None = None
        self._early_deaths = 0
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        for slot, device in enumerate(d for d in devices for _ in range(workers_per_gpu)):
            self._workers.append(self._start(slot, device))
        self._thread = threading.Thread(target=self._manage, name="gpuwarden-pool", daemon=True)
        self._thread.start()

    # -- the user's side -------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._submit(None, fn, args, kwargs)

    def submit_to(
        self, device: int, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Future[Any]:
        """Run ``fn`` on a worker of GPU ``device`` (a visible ordinal of this pool)."""
        if device not in self._plans:
            raise UsageError(
                f"this pool has no worker on cuda:{device} (it has {sorted(self._plans)})"
            )
        return self._submit(device, fn, args, kwargs)

    def _submit(
        self,
        device: int | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Future[Any]:
        future: Future[Any] = Future()
        label = getattr(fn, "__qualname__", None) or repr(fn)
        with self._lock:
            if self._broken:
                raise BrokenPool(self._broken)
            if self._shutdown:
                raise RuntimeError("cannot submit to a pool that is shut down")
            task_id = next(self._ids)
            try:
                payload = pickle.dumps((task_id, fn, args, kwargs))
            except Exception as exc:
                future.set_exception(exc)
                return future
            self._pending.append(_Task(task_id, payload, future, label, device))
        self._wake()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._pending:
                    self._pending.popleft().future.cancel()
        self._wake()
        if wait:
            self._thread.join()

    def workers(self) -> list[WorkerInfo]:
        """The live workers: GPU, pid, cap and CPUs."""
        with self._lock:
            return [
                WorkerInfo(
                    slot=w.slot,
                    device=w.device,
                    gpu_index=self._infos[w.device][0],
                    pid=w.process.pid,
                    memory_limit=self._infos[w.device][1],
                    cpus=self._plans[w.device].cpus,
                )
                for w in self._workers
            ]

    # -- the manager thread ----------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"x")

    def _start(self, slot: int, device: int) -> _Worker:
        plan = self._plans[device]
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main,
            args=(child, plan.cpus, self._initializer, self._initargs),
            name=f"gpuwarden-worker-{slot}",
            daemon=True,
        )
        with _SPAWN_LOCK:
            saved = {
                k: os.environ.get(k)
                for k in set(os.environ) | set(plan.env)
                if os.environ.get(k) != plan.env.get(k)
            }
            try:
                for key in saved:
                    if key in plan.env:
                        os.environ[key] = plan.env[key]
                    else:
                        del os.environ[key]
                process.start()
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        child.close()
        return _Worker(slot=slot, device=device, process=process, conn=parent)

    def _next_for(self, worker: _Worker) -> _Task | None:
        for task in self._pending:
            if task.device is None or task.device == worker.device:
                self._pending.remove(task)
                return task
        return None

    def _dispatch(self) -> None:
        with self._lock:
            for w in self._workers:
                while w.ready and w.task is None:
                    task = self._next_for(w)
                    if task is None:
                        break
                    if not task.future.set_running_or_notify_cancel():
                        continue
                    try:
                        w.conn.send_bytes(task.payload)
                    except OSError:  # the worker is dying; its sentinel says so next
                        self._pending.appendleft(task)
                        break
                    w.task = task

    def _receive(self, w: _Worker) -> bool:
        """Take one message from a worker; False when there is none to take (EOF)."""
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            return False  # dead: the sentinel handles it
        if message[0] == "ready":
            w.ready = True
            self._early_deaths = 0
            return True
        if message[0] == "init-failed":
            w.init_error = message[1]
            return True
        task, w.task = w.task, None
        if task is None or task.id != message[0]:
            return True
        if message[1]:
            task.future.set_result(message[2])
            return True
        exc, text = message[2], message[3]
        if not isinstance(exc, BaseException):
            exc = RuntimeError(text.strip().splitlines()[-1] if text.strip() else "failed")
        exc.__cause__ = RemoteTraceback(text)
        task.future.set_exception(exc)
        return True

    @staticmethod
    def _poll(w: _Worker) -> bool:
        try:
            return w.conn.poll()
        except (EOFError, OSError):
            return False

    def _bury(self, w: _Worker) -> None:
        """A worker's process ended: fail its task, start another in its place."""
        w.process.join()
        why = _death(w.process.exitcode)
        gpu = self._infos[w.device][0]
        if w.task is not None:
            w.task.future.set_exception(
                WorkerDied(
                    f"worker {w.slot} on GPU {gpu} (pid {w.process.pid}) {why} while running "
                    f"{w.task.label}; a new worker took its place"
                )
            )
            w.task = None
        elif not w.ready or w.init_error is not None:
            self._early_deaths += 1
            if self._early_deaths >= _GIVE_UP_AFTER:
                detail = (w.init_error or "").strip().splitlines()
                self._broken = (
                    f"{_GIVE_UP_AFTER} workers in a row died as they started "
                    f"(last: GPU {gpu}, {why}" + (f": {detail[-1]}" if detail else "") + ")"
                )
        w.conn.close()
        with self._lock:
            index = self._workers.index(w)
            if self._shutdown or self._broken:
                del self._workers[index]
            else:
                self._workers[index] = self._start(w.slot, w.device)

    def _fail_pending(self, error: BaseException) -> None:
        with self._lock:
            while self._pending:
                task = self._pending.popleft()
                if task.future.set_running_or_notify_cancel():
                    task.future.set_exception(error)

    def _manage(self) -> None:
        while True:
            with self._lock:
                workers = list(self._workers)
                idle = self._shutdown and not self._pending and all(w.task is None for w in workers)
            if idle or (self._broken and not workers):
                break
            ready = wait(
                [self._wake_r, *(w.conn for w in workers), *(w.process.sentinel for w in workers)]
            )
            if self._wake_r in ready:
                while self._wake_r.poll():
                    self._wake_r.recv_bytes()
            for w in workers:
                if w.process.sentinel in ready:  # read what it sent before it ended
                    while self._poll(w) and self._receive(w):
                        pass
                    self._bury(w)
                elif w.conn in ready:
                    self._receive(w)
            if self._broken:
                self._fail_pending(BrokenPool(self._broken))
                with self._lock:
                    if not any(w.task for w in self._workers):
                        break
            self._dispatch()
        self._stop_workers()

    def _stop_workers(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.send_bytes(b"")
        for w in workers:
            w.process.join(timeout=5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        if self._broken:
            self._fail_pending(BrokenPool(self._broken))
