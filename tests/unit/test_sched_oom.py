"""The daemon's OOM decisions (sched/oom.py): PyTorch's message parsed, the retry budget
from what the job was shown to need, and when a retry waits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.sched.oom import (
    GROWTH,
    GiveUp,
    OomAsk,
    Retry,
    after_oom,
    parse_oom,
    retry_budget,
    shown_need,
)
from gpuwarden.sim.job import torch_oom
from gpuwarden.units import GiB, MiB

# Real messages, as torch 2.x prints them (one line each).
CAPPED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.00 GiB. GPU 0 "
    "has a total capacity of 139.72 GiB of which 120.01 GiB is free. Including "
    "non-PyTorch memory, this process has 10.52 GiB memory in use. 9.50 GiB allowed; "
    "Of the allocated memory 9.75 GiB is allocated by PyTorch, and 256.00 MiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
NEIGHBOUR = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 "
    "has a total capacity of 93.02 GiB of which 1.18 GiB is free. Process 2752205 "
    "has 91.82 GiB memory in use. Of the allocated memory 90.63 GiB is allocated by "
    "PyTorch, and 120.54 MiB is reserved by PyTorch but unallocated."
)
GRAPHS = (
    "Out of memory. Tried to allocate 512.00 KiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 0 bytes is free. Of the allocated memory 2.00 GiB is allocated "
    "by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and "
    "1.00 MiB is reserved by PyTorch but unallocated."
)
BEFORE_2_1 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB "
    "total capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB "
    "reserved in total by PyTorch) If reserved memory is >> allocated memory try "
    "setting max_split_size_mb to avoid fragmentation."
)
CTX = 512 * MiB


def test_torch_messages_are_parsed_to_what_the_allocator_needed() -> None:
    ask = parse_oom("step 3\nTraceback (most recent call last):\n" + CAPPED + "\n")
    assert ask == OomAsk(
        tried=15 * GiB,
        in_use=int(10.52 * GiB),
        allocated=int(9.75 * GiB),
        cached=256 * MiB,
        allowed=int(9.5 * GiB),
    )
    assert ask.need(CTX) == 25 * GiB  # allocated + cached + tried: the context is not in it
    other = parse_oom(NEIGHBOUR)  # another process's figure is not this one's
    assert other is not None and other.in_use is None
    assert other.need(CTX) == int(90.63 * GiB) + int(120.54 * MiB) + int(1.25 * GiB)
    graphs = parse_oom(GRAPHS)
    assert graphs is not None and (graphs.tried, graphs.allocated, graphs.cached) == (
        512 * 1024,
        2 * GiB,
        MiB,
    )
    old = parse_oom(BEFORE_2_1)
    assert old is not None and old.need(CTX) == int(188 * MiB) + 36 * MiB
    assert parse_oom("RuntimeError: CUDA error: out of memory\n") is None
    assert parse_oom("loss 0.3\nValueError: bad shape\n") is None


def test_in_use_less_the_context_when_the_allocator_says_nothing() -> None:
    ask = parse_oom(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 24.00 GiB of which 1.00 GiB is free. Including non-PyTorch "
        "memory, this process has 4.50 GiB memory in use."
    )
    assert ask is not None and ask.need(CTX) == 6 * GiB and ask.need(0) == int(6.5 * GiB)
    assert OomAsk(tried=GiB).need(CTX) == GiB  # nothing said of what was held


def test_the_rank_that_asked_for_most_counts() -> None:
    small = CAPPED.replace("15.00 GiB", "1.00 GiB")
    ask = parse_oom(small + "\n[rank1]: " + CAPPED + "\n" + small)
    assert ask is not None and ask.tried == 15 * GiB


def test_a_bigger_budget_is_what_the_message_shows_plus_a_margin_at_once() -> None:
    ask = parse_oom(
        torch_oom(
            tried=6 * GiB,
            ordinal=0,
            total=24 * GiB,
            free=20 * GiB,
            in_use=4 * GiB + CTX,
            allocated=4 * GiB,
            allowed=4 * GiB,
        )
    )
    r = after_oom(
        old_budget=4 * GiB,
        peak=4 * GiB + CTX,
        largest=23 * GiB,
        used=0,
        allowed=1,
        backoff=10,
        ask=ask,
        context=CTX,
    )
    assert r == Retry(budget=11 * GiB, delay=0.0, need=10 * GiB)  # 10G + 10%, no backoff


def test_the_peak_less_the_context_counts_when_it_is_more() -> None:
    ask = OomAsk(tried=GiB, allocated=GiB, cached=0)
    r = after_oom(
        old_budget=2 * GiB,
        peak=8 * GiB + CTX,
        largest=80 * GiB,
        used=0,
        allowed=1,
        backoff=10,
        ask=ask,
        context=CTX,
    )
    assert isinstance(r, Retry) and r.need == 8 * GiB and r.delay == 0
    assert r.budget == retry_budget(old_budget=2 * GiB, need=8 * GiB, largest=80 * GiB)
    assert shown_need(None, None, CTX) is None
    assert shown_need(None, CTX // 2, CTX) == 0


def test_at_least_a_quarter_more_and_never_past_the_largest_gpu() -> None:
    r = after_oom(old_budget=8 * GiB, peak=None, largest=80 * GiB, used=0, allowed=2, backoff=10)
    assert r == Retry(budget=10 * GiB, delay=0.0)  # nothing said: 1.25 x the budget
    r = after_oom(
        old_budget=8 * GiB,
        peak=None,
        largest=80 * GiB,
        used=0,
        allowed=2,
        backoff=10,
        ask=OomAsk(tried=100 * GiB, allocated=8 * GiB, cached=0),
    )
    assert r == Retry(budget=80 * GiB, delay=0.0, need=108 * GiB)  # capped


def test_the_backoff_stays_for_a_retry_at_the_same_budget() -> None:
    # At the largest budget already, yet within it: the GPU ran out, not the budget.
    within = OomAsk(tried=GiB, allocated=60 * GiB, cached=0)
    for used, delay in ((0, 10), (1, 20)):
        r = after_oom(
            old_budget=80 * GiB,
            peak=None,
            largest=80 * GiB,
            used=used,
            allowed=3,
            backoff=10,
            ask=within,
        )
        assert r == Retry(budget=80 * GiB, delay=delay, need=61 * GiB)
    over = OomAsk(tried=30 * GiB, allocated=60 * GiB, cached=0)
    r = after_oom(
        old_budget=80 * GiB, peak=None, largest=80 * GiB, used=0, allowed=3, backoff=10, ask=over
    )
    assert isinstance(r, GiveUp) and "largest" in r.reason and "90" in r.reason


def test_no_retry_when_none_is_left_or_the_job_had_a_whole_gpu() -> None:
    for kw, why in (
        (dict(old_budget=80 * GiB), "largest"),
        (dict(old_budget=None), "whole GPU"),
        (dict(old_budget=GiB, used=2), "out of retries"),
        (dict(old_budget=GiB, allowed=0), "no retries asked for"),
    ):
        args = dict(old_budget=GiB, peak=None, largest=80 * GiB, used=0, allowed=2, backoff=1)
        args.update(kw)
        d = after_oom(**args)  # type: ignore[arg-type]
        assert isinstance(d, GiveUp) and why in d.reason, (kw, d)


SIZES = st.integers(min_value=0, max_value=200 * GiB)


@given(
    tried=st.integers(1, 200 * GiB),
    allocated=SIZES,
    cached=SIZES,
    in_use=SIZES,
    allowed=st.none() | SIZES,
)
def test_the_simulated_message_parses_back_to_its_figures(
    tried: int, allocated: int, cached: int, in_use: int, allowed: int | None
) -> None:
    text = torch_oom(
        tried=tried,
        ordinal=0,
        total=256 * GiB,
        free=GiB,
        in_use=in_use,
        allocated=allocated,
        cached=cached,
        allowed=allowed,
    )
    ask = parse_oom(text)
    assert ask is not None

    def close(got: int | None, want: int) -> bool:  # two decimals of the printed unit
        return got is not None and abs(got - want) <= max(want * 0.005, 8)

    assert close(ask.tried, tried) and close(ask.allocated, allocated)
    assert close(ask.cached, cached) and close(ask.in_use, in_use)
    assert (ask.allowed is None) == (allowed is None)


@given(old=st.integers(1, 100 * GiB), need=st.none() | SIZES, largest=st.integers(1, 200 * GiB))
def test_retry_budget_bounds(old: int, need: int | None, largest: int) -> None:
    b = retry_budget(old_budget=old, need=need, largest=largest)
    assert b <= largest
    assert b >= min(largest, int(GROWTH * old))
    if need is not None:
        assert b >= min(largest, need)


@given(
    old=st.integers(MiB, 100 * GiB),
    peak=st.none() | SIZES,
    tried=st.none() | st.integers(1, 100 * GiB),
    held=SIZES,
    largest=st.integers(MiB, 200 * GiB),
    used=st.integers(0, 3),
)
def test_a_retry_waits_only_when_its_budget_does_not_grow(
    old: int, peak: int | None, tried: int | None, held: int, largest: int, used: int
) -> None:
    ask = None if tried is None else OomAsk(tried=tried, allocated=held, cached=0)
    d = after_oom(
        old_budget=old,
        peak=peak,
        largest=largest,
        used=used,
        allowed=4,
        backoff=5,
        ask=ask,
        context=CTX,
    )
    if isinstance(d, Retry):
        assert d.budget <= max(largest, old)
        assert (d.delay == 0) == (d.budget > old)
        if d.delay:
            assert d.budget == old and d.need is not None and d.need <= old
    else:
        assert largest <= old


def _creep_message(tried_mib: int, held_gib: float) -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_mib}.00 "
        f"MiB. GPU 0 has a total capacity of 139.72 GiB of which 20.01 GiB is free. "
        f"Including non-PyTorch memory, this process has {held_gib + 0.66:.2f} GiB memory "
        f"in use. {held_gib:.2f} GiB allowed; Of the allocated memory {held_gib - 0.25:.2f}"
        " GiB is allocated by PyTorch, and 256.00 MiB is reserved by PyTorch but "
        "unallocated."
    )


def test_a_job_that_crept_into_its_cap_gets_twice_what_it_reached_up_to_four_times() -> None:
    # Memory rising in 256 MiB steps into a 10 GiB cap: the message shows only the step.
    ask = parse_oom(_creep_message(256, 10.0))
    assert ask is not None and ask.crept(676 * MiB, 10 * GiB)
    d = after_oom(
        old_budget=10 * GiB,
        peak=None,
        largest=139 * GiB,
        used=0,
        allowed=1,
        backoff=10,
        ask=ask,
        context=676 * MiB,
    )
    assert isinstance(d, Retry) and d.delay == 0 and d.need == 10 * GiB + 256 * MiB
    assert d.budget == 2 * d.need and d.ceiling == 4 * d.need
    # Capped by the largest GPU; no ceiling where the budget already is the largest.
    d = after_oom(
        old_budget=10 * GiB,
        peak=None,
        largest=30 * GiB,
        used=0,
        allowed=1,
        backoff=10,
        ask=ask,
        context=676 * MiB,
    )
    assert isinstance(d, Retry) and d.budget == 2 * d.need and d.ceiling == 30 * GiB
    d = after_oom(
        old_budget=10 * GiB,
        peak=None,
        largest=20 * GiB,
        used=0,
        allowed=1,
        backoff=10,
        ask=ask,
        context=676 * MiB,
    )
    assert isinstance(d, Retry) and d.budget == 20 * GiB and d.ceiling is None


def test_one_big_allocation_is_not_creeping_its_need_is_known() -> None:
    ask = parse_oom(CAPPED)  # tried 15 GiB holding 10 GiB
    assert ask is not None and not ask.crept(0, 10 * GiB)
    d = after_oom(
        old_budget=10 * GiB, peak=None, largest=139 * GiB, used=0, allowed=1, backoff=10, ask=ask
    )
    assert isinstance(d, Retry) and d.ceiling is None
    # A small allocation far below the cap (the GPU ran out, not the budget): no creep.
    small = parse_oom(_creep_message(256, 4.0))
    assert small is not None and not small.crept(676 * MiB, 10 * GiB)
