"""gpuwarden.guard on a real GPU: a real CUDA OOM is caught and the retry succeeds once
the batch has halved."""

from __future__ import annotations

import pytest

from gpuwarden.guard import oom_retry


@pytest.mark.gpu
def test_a_real_oom_is_retried_with_half_the_batch() -> None:
    torch = pytest.importorskip("torch")
    free, _ = torch.cuda.mem_get_info(0)
    unit = free // 24  # bytes per batch item: 32 items never fit, 16 do
    seen: list[int] = []

    @oom_retry(4, backoff=0.01, batch_size=32, min_batch_size=1)
    def step(*, batch_size: int) -> int:
        seen.append(batch_size)
        x = torch.empty(batch_size * unit, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        return batch_size

    assert step() == 16
    assert seen == [32, 16] and step.retry.ooms == 1  # type: ignore[attr-defined]
    print("batch sizes tried:", seen, "unit", unit)
