"""OOM self-healing inside a job: catch a CUDA out-of-memory error, free what can be
freed, back off, retry — optionally with a batch size that halves on each OOM and grows
back after a run of successes.

    @oom_retry(retries=3, batch_size=64, min_batch_size=4)
    def step(batch, *, batch_size): ...

    retry = OomRetry(retries=3)
    for attempt in retry.attempts():
        with attempt:
            run_step()

torch is never imported here: an error is recognised by its type's name and message, and
memory is freed through torch only when the program has imported it already."""

from __future__ import annotations

import functools
import gc
import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

log = logging.getLogger("gpuwarden.guard")
F = TypeVar("F", bound=Callable[..., Any])
_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
)


def is_oom(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``exc`` is a GPU out-of-memory error: torch's OutOfMemoryError (any
    version), the RuntimeError older torch raises, or one of ``extra``."""
    if extra and isinstance(exc, extra):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _MESSAGES)


def free_memory() -> None:
    """Drop what is unreachable and hand PyTorch's cached blocks back to the driver.
    Only where the program has CUDA up: without it no tensor holds GPU memory, and a
    full collection of a large heap costs tens of milliseconds for nothing."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            gc.collect()
            cuda.empty_cache()
    except Exception:  # a broken CUDA state must not hide the OOM being handled
        log.debug("empty_cache failed", exc_info=True)


def memory_figures() -> str:
    """This process's allocator figures, for log lines ("" without torch/CUDA)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return ""
        mib = 1 << 20
        return (
            f"allocated {cuda.memory_allocated() // mib} MiB, "
            f"reserved {cuda.memory_reserved() // mib} MiB"
        )
    except Exception:
        return ""


class OomRetry:
    """Retry policy and state. ``batch_size``: the current batch size (halved on each
    OOM down to ``min_batch_size``; after ``grow_after`` successes in a row it doubles
    again, up to where it started). ``sleep`` and ``errors`` are injectable for tests."""

    def __init__(
        self,
        retries: int = 3,
        *,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        batch_size: int | None = None,
        min_batch_size: int = 1,
        grow_after: int | None = None,
        errors: tuple[type[BaseException], ...] = (),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if retries < 0 or backoff < 0 or min_batch_size < 1:
            raise ValueError("retries and backoff must be ≥ 0 and min_batch_size ≥ 1")
        if batch_size is not None and batch_size < min_batch_size:
            raise ValueError(f"batch_size {batch_size} is below min_batch_size {min_batch_size}")
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.start_batch = batch_size
        self.batch_size = batch_size
        self.min_batch_size = min_batch_size
        self.grow_after = grow_after
        self.errors = errors
        self.sleep = sleep
        self.ooms = 0  # OOMs caught over this object's life
        self._streak = 0

    def _on_oom(self, exc: BaseException, attempt: int) -> None:
        """Free memory, shrink the batch, back off; raises ``exc`` when out of retries
        or when the batch cannot shrink and there is no retry to spend."""
        self.ooms += 1
        self._streak = 0
        if exc.__traceback__ is not None:
            # The failed step's frames hold its tensors: clear their locals (the
            # traceback keeps its lines) so that the memory can actually come back.
            traceback.clear_frames(exc.__traceback__)
        free_memory()
        if attempt >= self.retries:
            log.warning("CUDA OOM, out of retries (%d): %s", self.retries, exc)
            raise exc
        shrunk = ""
        if self.batch_size is not None:
            if self.batch_size <= self.min_batch_size:
                log.warning("CUDA OOM at the smallest batch size %d: giving up", self.batch_size)
                raise exc
            old = self.batch_size
            self.batch_size = max(self.min_batch_size, self.batch_size // 2)
            shrunk = f"; batch size {old} -> {self.batch_size}"
        delay = min(self.backoff * (2**attempt), self.max_backoff)
        figures = memory_figures()
        log.warning(
            "CUDA OOM (attempt %d of %d)%s; retrying in %.2fs%s",
            attempt + 1,
            self.retries + 1,
            shrunk,
            delay,
            f" [{figures}]" if figures else "",
        )
        self.sleep(delay)

    def _on_success(self) -> None:
        self._streak += 1
        if (
            self.grow_after
            and self.batch_size is not None
            and self.start_batch is not None
            and self._streak >= self.grow_after
            and self.batch_size < self.start_batch
        ):
            self.batch_size = min(self.start_batch, self.batch_size * 2)
            self._streak = 0
            log.info(
                "no OOM for %d steps: batch size back up to %d", self.grow_after, self.batch_size
            )

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` under the policy (``batch_size=`` passed when one is managed)."""
        attempt = 0
        while True:
            if self.batch_size is not None:
                kwargs["batch_size"] = self.batch_size
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                if not is_oom(exc, self.errors):
                    raise
                self._on_oom(exc, attempt)
                attempt += 1
                continue
            self._on_success()
            return result

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self.call(fn, *args, **kwargs)

        wrapper.retry = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    def attempts(self) -> Iterator[Attempt]:
        """The context-manager form: ``for a in retry.attempts(): with a: ...`` runs the
        block until it finishes without an OOM (or re-raises when out of retries)."""
        attempt = 0
        while True:
            a = Attempt(self, attempt)
            yield a
            if not a.failed:
                self._on_success()
                return
            attempt += 1


class Attempt:
    """One try of a ``with`` block under an OomRetry."""

    def __init__(self, policy: OomRetry, number: int) -> None:
        self.policy = policy
        self.number = number
        self.failed = False

    @property
    def batch_size(self) -> int | None:
        return self.policy.batch_size

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None or not is_oom(exc, self.policy.errors):
            return False
        del tb  # the traceback holds the failed step's tensors
        self.policy._on_oom(exc, self.number)  # raises when out of retries
        self.failed = True
        return True


def oom_retry(retries: int = 3, **options: Any) -> OomRetry:
    """A decorator (and policy object) retrying CUDA OOMs; see OomRetry."""
    return OomRetry(retries, **options)
