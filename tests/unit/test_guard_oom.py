"""oom_retry without torch: an injected OOM type, an injected sleep; retries, backoff,
batch halving to a floor, growing back, and errors that are not OOMs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuwarden.guard import OomRetry, is_oom, oom_retry


class FakeOOM(Exception):
    pass


def test_is_oom_knows_torch_errors_by_name_and_message() -> None:
    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})
    assert is_oom(OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("CUDA out of memory"))
    assert is_oom(FakeOOM(), (FakeOOM,))


def test_retries_with_exponential_backoff_then_succeeds() -> None:
    slept: list[float] = []
    calls = []

    @oom_retry(3, backoff=0.5, errors=(FakeOOM,), sleep=slept.append)
    def step(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise FakeOOM
        return x * 2

    assert step(21) == 42
    assert calls == [21, 21, 21] and slept == [0.5, 1.0]


def test_out_of_retries_reraises_the_oom() -> None:
    r = OomRetry(2, backoff=0, errors=(FakeOOM,), sleep=lambda s: None)
    with pytest.raises(FakeOOM):
        r.call(lambda: (_ for _ in ()).throw(FakeOOM()))
    assert r.ooms == 3


def test_other_errors_are_not_retried() -> None:
    r = OomRetry(5, errors=(FakeOOM,), sleep=lambda s: None)
    calls = []

    def bad() -> None:
        calls.append(1)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        r.call(bad)
    assert calls == [1] and r.ooms == 0


def test_batch_halves_to_the_floor_and_grows_back() -> None:
    seen: list[int] = []
    fits = [16]  # the largest batch that fits

    @oom_retry(
        10,
        backoff=0,
        batch_size=64,
        min_batch_size=8,
        grow_after=2,
        errors=(FakeOOM,),
        sleep=lambda s: None,
    )
    def step(*, batch_size: int) -> int:
        seen.append(batch_size)
        if batch_size > fits[0]:
            raise FakeOOM
        return batch_size

    assert step() == 16 and seen == [64, 32, 16]
    fits[0] = 64  # memory frees up: every two successes in a row double the batch
    assert [step() for _ in range(4)] == [16, 32, 32, 64]
    fits[0] = 4  # below the floor: give up at 8
    with pytest.raises(FakeOOM):
        step()
    assert seen[-1] == 8


def test_context_manager_form_reruns_the_block() -> None:
    r = OomRetry(3, backoff=0, batch_size=8, errors=(FakeOOM,), sleep=lambda s: None)
    tried = []
    for attempt in r.attempts():
        with attempt:
            tried.append(attempt.batch_size)
            if attempt.batch_size and attempt.batch_size > 2:
                raise FakeOOM
    assert tried == [8, 4, 2]


def test_bad_options_are_clear() -> None:
    with pytest.raises(ValueError, match="below min_batch_size"):
        OomRetry(batch_size=2, min_batch_size=4)


def test_importing_guard_does_not_import_torch() -> None:
    code = "import sys, gpuwarden.guard; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"


def test_the_failed_steps_locals_are_freed_before_the_retry() -> None:
    """What the failed call held (its tensors) must be gone when the retry starts; the
    exception's traceback would otherwise keep it alive."""
    import weakref

    class Tensor:
        pass

    refs: list[weakref.ref[Tensor]] = []
    alive_at_sleep: list[bool] = []

    def step() -> str:
        activations = Tensor()
        refs.append(weakref.ref(activations))
        if len(refs) == 1:
            raise FakeOOM("CUDA out of memory")
        return "ok"

    retry = OomRetry(
        2, errors=(FakeOOM,), sleep=lambda s: alive_at_sleep.append(refs[0]() is not None)
    )
    assert retry.call(step) == "ok"
    assert alive_at_sleep == [False]
