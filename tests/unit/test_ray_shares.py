"""What gpuwarden asks Ray for (pure): GPU fractions from memory budgets, the memory
resource, what a node advertises, and the clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.errors import UsageError
from gpuwarden.ray.shares import GPU_MIB_RESOURCE, MEM_RESOURCE, ask, node_resources, smallest_gpu
from gpuwarden.ray.submit import dashboard_address
from gpuwarden.units import GiB, MiB


def test_a_budget_asks_for_its_share_of_the_smallest_gpu_and_the_memory_resource() -> None:
    third = ask(8 * GiB, 1, 24 * GiB)
    assert third.num_gpus == 0.3333 and third.resources == {MEM_RESOURCE: 8192.0}
    assert 3 * third.num_gpus <= 1  # three thirds fit one GPU
    two = ask(20 * GiB, 2, 80 * GiB)
    assert two.num_gpus == 2.0 and two.resources == {MEM_RESOURCE: 2 * 20480.0}
    assert ask(1, 1, 80 * GiB).num_gpus == 0.0001  # never zero: Ray would place it anywhere
    assert "0.3333 GPU (8192MiB of a 24.0GiB GPU)" in third.describe()


@given(st.integers(1, 80 * 1024), st.integers(20 * 1024, 141 * 1024))
def test_budgets_that_fit_a_gpu_never_ask_more_than_one_gpu(mib: int, gpu_mib: int) -> None:
    if mib > gpu_mib:
        with pytest.raises(UsageError, match="more than the smallest GPU"):
            ask(mib * MiB, 1, gpu_mib * MiB)
        return
    a = ask(mib * MiB, 1, gpu_mib * MiB)
    assert 0 < a.num_gpus <= 1
    assert abs(a.num_gpus - mib / gpu_mib) <= 0.0001 + 1e-12


def test_what_a_node_advertises() -> None:
    assert node_resources([24 * GiB, 24 * GiB]) == {
        MEM_RESOURCE: 49152.0,
        GPU_MIB_RESOURCE: 24576.0,
    }
    assert node_resources([]) == {}
    nodes = [
        {"GPU": 2.0, GPU_MIB_RESOURCE: 24576.0},
        {"GPU": 8.0, GPU_MIB_RESOURCE: 81920.0},
        {"CPU": 4.0},
    ]
    assert smallest_gpu(nodes) == 24 * GiB
    with pytest.raises(UsageError, match="gpuwarden cluster resources"):
        smallest_gpu([{"CPU": 4.0}])


def test_bad_requests_and_addresses() -> None:
    with pytest.raises(UsageError, match="at least one GPU"):
        ask(GiB, 0, 24 * GiB)
    with pytest.raises(UsageError, match="more than 0"):
        ask(0, 1, 24 * GiB)
    assert dashboard_address("ray://10.0.0.5:8265") == "http://10.0.0.5:8265"
    assert dashboard_address("http://h:1") == "http://h:1"
    with pytest.raises(UsageError, match="invalid --cluster"):
        dashboard_address("slurm://x")
