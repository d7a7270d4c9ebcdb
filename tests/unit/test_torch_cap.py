"""The PyTorch cap's arithmetic: the fraction the hook sets must let the allocator hold
the whole budget after PyTorch's own rounding (``int(fraction * total)``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.hooks.gpuwarden_torch_cap import allowed_bytes, memory_fraction

GiB = 1 << 30
H100_TOTAL = 85_017_493_504  # torch.cuda.get_device_properties(0).total_memory on an H100


def test_the_plain_ratio_falls_a_byte_short_where_the_h100_showed_it() -> None:
    # Two honest jobs of 25 GiB and 50 GiB hit their caps on an H100 with limit / total.
    for budget in (25 * GiB, 50 * GiB):
        assert allowed_bytes(budget / H100_TOTAL, H100_TOTAL) == budget - 1
        assert allowed_bytes(memory_fraction(budget, H100_TOTAL), H100_TOTAL) == budget


@given(st.data())
def test_the_allocator_may_hold_exactly_the_limit(data: st.DataObject) -> None:
    total = data.draw(st.integers(min_value=1, max_value=1 << 42), label="total")
    limit = data.draw(st.integers(min_value=1, max_value=total), label="limit")
    assert allowed_bytes(memory_fraction(limit, total), total) == limit


def test_a_limit_past_the_device_is_the_whole_device() -> None:
    assert memory_fraction(2 * H100_TOTAL, H100_TOTAL) == 1.0
    assert memory_fraction(H100_TOTAL, H100_TOTAL) == 1.0
