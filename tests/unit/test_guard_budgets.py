"""MemoryBudgets: budget arithmetic against a GPU's figures, the daemon's job budget from
the environment, refusals with numbers, release, thread safety; and the same registry
reading the simulated driver through gpuwarden's backend."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.errors import UsageError
from gpuwarden.gpus.model import GpuFacts
from gpuwarden.gpus.sim import SimBackend
from gpuwarden.guard import BudgetExceeded, MemoryBudgets
from gpuwarden.guard.memory import MemoryReading
from gpuwarden.units import GiB, MiB

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FixedProbe:
    """A GPU whose figures the test sets; ``delay`` widens races between threads."""

    total: int = 80 * GiB
    free: int = 60 * GiB
    process: int | None = None
    delay: float = 0.0

    def read(self, device: int) -> MemoryReading:
        if self.delay:
            time.sleep(self.delay)
        return MemoryReading(
            device=device,
            index=device,
            uuid=f"GPU-{device}",
            total=self.total,
            free=self.free,
            process=self.process,
            allocated=None,
            reserved=None,
            cpus=None,
        )

    def gpu(self, device: int) -> GpuFacts:
        return GpuFacts(
            index=device,
            uuid=f"GPU-{device}",
            name="test",
            memory_total=self.total,
            memory_used=self.total - self.free,
            memory_free=self.free,
        )

    def device_count(self) -> int:
        return 2


def test_outside_the_daemon_budgets_share_what_other_processes_leave() -> None:
    budgets = MemoryBudgets(reserve="1G", probe=FixedProbe(), env={})
    budgets.register("encoder", "30G")
    budgets.register("decoder", "29G")  # 60 free - 1 reserve - 30 = 29
    with pytest.raises(BudgetExceeded) as err:
        budgets.register("cache", 1)
    text = str(err.value)
    assert text == (
        "budget 'cache' of 1B does not fit on cuda:0: 0B available = 60.0GiB "
        "left by other processes - 1024MiB reserve - 59.0GiB in 2 budgets"
    ), text
    usage = budgets.usage(0)
    assert (usage.limit, usage.budgeted, usage.available) == (60 * GiB, 59 * GiB, 0)
    assert budgets.usage(1).budgeted == 0  # budgets are per device
    budgets.register("other-gpu", "59G", device=1)


def test_this_process_own_memory_is_not_counted_against_it() -> None:
    # 20 GiB used on the GPU, 8 of them by this process: budgets may take 72 GiB in all
    budgets = MemoryBudgets(reserve=0, probe=FixedProbe(process=8 * GiB), env={})
    assert budgets.usage().limit == 68 * GiB
    budgets.register("all", "68G")


def test_under_the_daemon_the_job_budget_is_the_limit() -> None:
    env = {"GPUWARDEN_BUDGET": str(16 * GiB)}
    budgets = MemoryBudgets(probe=FixedProbe(free=GiB), env=env)  # the GPU's free: ignored
    assert budgets.reserve == 0  # the daemon booked the CUDA context beside the budget
    b = budgets.register("half", 0.5)  # a fraction of the job budget
    assert b.size == 8 * GiB
    with pytest.raises(BudgetExceeded, match="job budget"):
        budgets.register("rest", 8 * GiB + 1)
    budgets.register("rest", 8 * GiB)
    assert budgets.usage().available == 0
    assert "job budget" in str(budgets.usage())


def test_bad_input_is_one_clear_error() -> None:
    budgets = MemoryBudgets(probe=FixedProbe(), env={})
    budgets.register("a", "1G")
    with pytest.raises(UsageError, match="registered already"):
        budgets.register("a", "1G")
    with pytest.raises(UsageError, match="invalid size"):
        budgets.register("b", "lots")
    with pytest.raises(UsageError, match="more than 0"):
        budgets.register("b", 0)
    with pytest.raises(UsageError, match="no budget named"):
        budgets.release("nope")
    with pytest.raises(UsageError, match="not a byte count"):
        MemoryBudgets(probe=FixedProbe(), env={"GPUWARDEN_BUDGET": "12G"}).register("x", 1)


def test_the_context_manager_releases_even_when_the_block_fails() -> None:
    budgets = MemoryBudgets(reserve=0, probe=FixedProbe(), env={})
    with pytest.raises(ZeroDivisionError), budgets.budget("step", "60G") as b:
        assert budgets.get("step") is b and budgets.usage().available == 0
        1 / 0  # noqa: B018
    assert budgets.budgets() == [] and budgets.usage().available == 60 * GiB
    with budgets.register("again", "60G"):
        pass
    assert budgets.budgets() == []


def test_threads_never_overcommit() -> None:
    """Sixteen threads race for 1 GiB each of 10 GiB; reading the GPU is slow, so without
    the lock several would see the same room."""
    budgets = MemoryBudgets(reserve=0, probe=FixedProbe(free=10 * GiB, delay=0.002), env={})
    won: list[str] = []
    barrier = threading.Barrier(16)

    def claim(i: int) -> None:
        barrier.wait()
        try:
            budgets.register(f"t{i}", "1G")
            won.append(f"t{i}")
        except BudgetExceeded:
            pass

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 10 and budgets.usage().budgeted == 10 * GiB


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 40)), max_size=40))
def test_budgets_never_exceed_the_limit_less_the_reserve(ops: list[tuple[bool, int, int]]) -> None:
    budgets = MemoryBudgets(reserve="2G", probe=FixedProbe(), env={})
    for add, key, gib in ops:
        name = f"b{key}"
        if add:
            with contextlib.suppress(BudgetExceeded, UsageError):
                budgets.register(name, gib * GiB)
        elif any(b.name == name for b in budgets.budgets()):
            budgets.release(name)
        usage = budgets.usage()
        assert usage.budgeted <= usage.limit - usage.reserve


def test_reads_the_simulated_driver_through_cuda_visible_devices(tmp_path: Path) -> None:
    """cuda:0 is the machine's GPU 1 here, which has 300 MiB charged to nobody and
    processes of other users: the limit is what they leave."""
    scenario = ROOT / "examples" / "leaky-4gpu.json"
    backend = SimBackend.from_file(str(scenario))
    gpu1 = next(g for g in backend.gpus() if g.index == 1)
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    from gpuwarden.guard.memory import DriverProbe

    budgets = MemoryBudgets(reserve=0, env=env, probe=DriverProbe(env, backend=lambda: backend))
    usage = budgets.usage(0)
    assert (usage.reading.index, usage.limit) == (1, gpu1.memory_free)
    assert usage.reading.total - usage.reading.free > 300 * MiB
    with pytest.raises(BudgetExceeded):
        budgets.register("too-big", gpu1.memory_free + 1)
    with pytest.raises(UsageError, match="sees 1"):
        budgets.usage(1)
    assert replace(usage.reading, process=None).own == 0


def test_a_job_process_may_take_its_budget_plus_the_booked_context() -> None:
    from gpuwarden.guard.memory import job_budget, job_limit
    from gpuwarden.sched.context import DEFAULT_CONTEXT

    assert job_limit({}) is None  # outside the daemon
    assert job_budget({"GPUWARDEN_BUDGET": str(8 * GiB)}) == 8 * GiB  # the allocator's cap
    assert job_limit({"GPUWARDEN_BUDGET": str(8 * GiB)}) == 8 * GiB + DEFAULT_CONTEXT
    assert (
        job_limit({"GPUWARDEN_BUDGET": str(8 * GiB), "GPUWARDEN_CONTEXT_BYTES": str(GiB)})
        == 9 * GiB
    )
