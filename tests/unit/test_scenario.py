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


@pytest.mark.parametrize(("data", "message"), [
    ("{not json", "not valid JSON"),
    ([], "JSON object"),
    ({"gpus": []}, "non-empty"),
    ({"gpus": [{"index": 0}]}, "missing field 'memory_total'"),
    ({"gpus": [{**GPU, "memory_total": "80X"}]}, "gpus[0].memory_total"),
    ({"gpus": [{**GPU, "compute_mode": "Weird"}]}, "compute_mode"),
    ({"gpus": [{**GPU, "cpus": "5-1"}]}, "gpus[0].cpus"),
    ({"gpus": [{**GPU, "utilization": 150}]}, "utilization"),
    ({"gpus": [GPU, GPU]}, "unique"),
    ({"gpus": [GPU], "processes": [{"pid": 1, "gpu": 3, "memory": "1G"}]}, "no GPU with index 3"),
    ({"gpus": [GPU], "processes": [{"pid": 1, "gpu": 0, "memory": "1G", "state": "x"}]},
     "state"),
    ({"gpus": [GPU], "holders": [{"pid": 1, "devices": []}]}, "devices"),
])
def test_bad_scenarios_say_what_is_wrong(tmp_path: Path, data: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(_write(tmp_path, data))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.json")
