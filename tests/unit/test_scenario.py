from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.sim.scenario import ScenarioError, load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_examples_load(name: str) -> None:
    sc = load_scenario(EXAMPLES / name)
    assert sc.gpus


def test_a100_example_matches_the_seed_machine() -> None:
    sc = load_scenario(EXAMPLES / "a100x8-shared.json")
    assert len(sc.gpus) == 8
    assert {g.memory_total for g in sc.gpus} == {81920 * 2**20}
    assert sc.gpus[3].unaccounted_memory > 0
    assert not [p for p in sc.processes if p.gpu == 3]


def _write(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "s.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


GPU = {"index": 0, "memory_total": "80GiB"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "not valid JSON"),
        ([], "JSON object"),
        ({"gpus": []}, "non-empty"),
        ({"gpus": [{"index": 0}]}, "missing field 'memory_total'"),
        ({"gpus": [{**GPU, "memory_total": "80X"}]}, "gpus[0].memory_total"),
        ({"gpus": [{**GPU, "compute_mode": "Weird"}]}, "compute_mode"),
        ({"gpus": [{**GPU, "cpus": "5-1"}]}, "gpus[0].cpus"),
        ({"gpus": [{**GPU, "utilization": 150}]}, "utilization"),
        ({"gpus": [GPU, GPU]}, "unique"),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 3, "memory": "1G"}]},
            "no GPU with index 3",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "state": "x"}]},
            "state",
        ),
        ({"gpus": [GPU], "holders": [{"pid": 1, "devices": []}]}, "devices"),
        # Each of these used to load (and show "hotC", or pick a 0-byte GPU) or crash later.
        ({"gpus": [{**GPU, "nvlink_peers": ["a"]}]}, "gpus[0].nvlink_peers"),
        ({"gpus": [{**GPU, "nvlink_peers": 5}]}, "gpus[0].nvlink_peers"),
        ({"gpus": [{**GPU, "memory_total": 0}]}, "gpus[0].memory_total: must be positive"),
        ({"gpus": [{**GPU, "temperature": "hot"}]}, "gpus[0].temperature"),
        ({"gpus": [{**GPU, "power_watts": "x"}]}, "gpus[0].power_watts"),
        ({"gpus": [{**GPU, "power_limit_watts": -1}]}, "gpus[0].power_limit_watts"),
        ({"gpus": [{**GPU, "ecc_uncorrected": "x"}]}, "gpus[0].ecc_uncorrected"),
        ({"gpus": [{**GPU, "retired_pages": -2}]}, "gpus[0].retired_pages"),
        ({"gpus": [{**GPU, "retired_pages_pending": "no"}]}, "gpus[0].retired_pages_pending"),
        ({"gpus": [{**GPU, "index": -1}]}, "gpus[0].index"),
        ({"gpus": [{**GPU, "numa_node": -1}]}, "gpus[0].numa_node"),
        ({"gpus": [{**GPU, "name": 5}]}, "gpus[0].name"),
        ({"gpus": [GPU], "processes": None}, "'processes' must be a list"),
        ({"gpus": [GPU], "holders": None}, "'holders' must be a list"),
        ({"gpus": [GPU], "processes": [{"pid": -5, "gpu": 0, "memory": "1G"}]}, "processes[0].pid"),
        ({"gpus": [GPU], "processes": [{"pid": 0, "gpu": 0, "memory": "1G"}]}, "processes[0].pid"),
        (
            {
                "gpus": [GPU],
                "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "started_ago": "abc"}],
            },
            "processes[0].started_ago",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "container": 123}]},
            "processes[0].container",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "ppid": "x"}]},
            "processes[0].ppid",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "user": None}]},
            "processes[0].user",
        ),
        (
            {
                "gpus": [GPU],
                "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "sm_utilization": 300}],
            },
            "processes[0].sm_utilization",
        ),
        (
            {
                "gpus": [GPU],
                "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "kinds": "compute"}],
            },
            "processes[0].kinds",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "torch": "yes"}]},
            "processes[0].torch",
        ),
        (
            {
                "gpus": [GPU],
                "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "cpus_allowed": "x"}],
            },
            "processes[0].cpus_allowed",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "rss": "lots"}]},
            "processes[0].rss",
        ),
        (
            {
                "gpus": [GPU],
                "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "cpu_percent": "hot"}],
            },
            "processes[0].cpu_percent",
        ),
        (
            {"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "cpu_percent": -1}]},
            "processes[0].cpu_percent",
        ),
        ({"gpus": [GPU], "holders": [{"pid": -1, "devices": ["/dev/nvidia0"]}]}, "holders[0].pid"),
        ({"gpus": [GPU], "holders": [{"pid": 1, "devices": [3]}]}, "holders[0].devices"),
    ],
)
def test_bad_scenarios_say_what_is_wrong(tmp_path: Path, data: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(_write(tmp_path, data))


def test_garbage_pids_are_what_the_driver_can_report(tmp_path: Path) -> None:
    procs = [{"pid": pid, "gpu": 0, "memory": "1G", "state": "garbage"} for pid in (0, 2**32 - 1)]
    sc = load_scenario(_write(tmp_path, {"gpus": [GPU], "processes": procs}))
    assert [p.pid for p in sc.processes] == [0, 2**32 - 1]
    with pytest.raises(ScenarioError, match=r"processes\[0\]\.pid"):
        load_scenario(
            _write(
                tmp_path,
                {
                    "gpus": [GPU],
                    "processes": [{"pid": 2**32, "gpu": 0, "memory": "1G", "state": "garbage"}],
                },
            )
        )


def test_a_file_that_is_not_utf8_is_one_error(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_bytes(b'{"gpus": [{"index": 0, "memory_total": "80G", "name": "\xff"}]}')
    with pytest.raises(ScenarioError, match="not UTF-8"):
        load_scenario(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.json")


def test_a_file_nested_too_deeply_is_one_error(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ScenarioError, match="nested too deeply"):
        load_scenario(p)


def test_an_allocation_file_nested_too_deeply_is_ignored(tmp_path: Path) -> None:
    from gpuwarden.sim.registry import Registry

    reg = Registry(tmp_path)  # its alloc/ is written by every simulated job's user
    reg.ensure(1)
    (reg.alloc_dir / "1.json").write_text("[" * 30_000 + "]" * 30_000)
    (reg.alloc_dir / "2.json").write_text('{"pid": 2, "start_time": 0, "gpus": []}')
    assert reg.allocations() == []
