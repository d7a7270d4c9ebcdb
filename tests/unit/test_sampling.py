"""``leaks`` samples only what its first snapshot found suspicious: the same findings as
full snapshots every time, whatever comes and goes between the samples, one snapshot
when nothing is suspicious, and /proc read again only for the suspects."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.gpus.sim import SimBackend
from gpuwarden.observe.leaks import DEFAULT_THRESHOLD, find_leaks
from gpuwarden.observe.sampling import sample_suspects
from gpuwarden.observe.snapshot import Snapshot, take_snapshot
from gpuwarden.sim.scenario import SimProcess
from tests.helpers.paths import EXAMPLES


def sample(
    backend: SimBackend, samples: int, interval: float, sleep: Callable[[float], None]
) -> list[Snapshot]:
    """The reference: every sample a full snapshot."""
    out = [take_snapshot(backend)]
    for _ in range(samples - 1):
        sleep(interval)
        out.append(take_snapshot(backend))
    return out


LEAKY = EXAMPLES / "leaky-4gpu.json"
MiB = 1 << 20

# What may happen between two samples: a declared process or holder goes (reaped), a
# GPU's unaccounted memory moves, a new dead pid appears on a GPU.
_PIDS = (12345, 88, 4294967295, 23456, 23457, 34567, 34568, 45678, 45999)
_event = st.one_of(
    st.tuples(st.just("reap"), st.sampled_from(_PIDS)),
    st.tuples(st.just("unaccounted"), st.integers(0, 3), st.sampled_from((0, 32, 100, 300))),
    st.tuples(st.just("dead"), st.integers(0, 3), st.integers(70000, 70003)),
)


def _apply(b: SimBackend, event: tuple[object, ...]) -> None:
    kind = event[0]
    if kind == "reap":
        b.reap_declared(int(event[1]))  # type: ignore[call-overload]
    elif kind == "unaccounted":
        gpus = list(b.scenario.gpus)
        i, mib = int(event[1]), int(event[2])  # type: ignore[call-overload]
        gpus[i] = replace(gpus[i], unaccounted_memory=mib * MiB)
        b.scenario = replace(b.scenario, gpus=tuple(gpus))
    else:
        gpu, pid = int(event[1]), int(event[2])  # type: ignore[call-overload]
        if all(p.pid != pid for p in b.scenario.processes):
            b.scenario = replace(
                b.scenario,
                processes=(
                    *b.scenario.processes,
                    SimProcess(
                        pid=pid,
                        gpu=gpu,
                        user="carol",
                        command="python x.py",
                        memory=700 * MiB,
                        state="dead",
                    ),
                ),
            )


def _found(
    sampler: Callable[..., list[object]],
    script: list[list[tuple[object, ...]]],
    monitors: bool = False,
) -> list[tuple[object, ...]]:
    b = SimBackend.from_file(LEAKY)
    steps = iter(script)

    def between(_: float) -> None:
        for event in next(steps):
            _apply(b, event)

    snaps = (
        sampler(b, len(script) + 1, 0.0, DEFAULT_THRESHOLD, sleep=between)
        if sampler is sample_suspects
        else sampler(b, len(script) + 1, 0.0, sleep=between)
    )
    return [
        (lk.gpu, lk.kind, lk.pid, lk.memory, lk.user)
        for lk in find_leaks(snaps, DEFAULT_THRESHOLD)  # type: ignore[arg-type]
        if (lk.kind == "monitor") == monitors
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_event, max_size=4), min_size=1, max_size=4))
def test_the_same_findings_as_full_samples(script: list[list[tuple[object, ...]]]) -> None:
    assert _found(sample_suspects, script) == _found(sample, script)
    # Monitors, never leaks: those that persisted, or all the first sample saw when
    # nothing else was suspicious.
    assert set(_found(sample_suspects, script, True)) >= set(_found(sample, script, True))


def test_monitors_alone_are_no_reason_to_wait(tmp_path: Path) -> None:
    scenario = json.loads(LEAKY.read_text())
    scenario["processes"] = [p for p in scenario["processes"] if p.get("state") is None]
    scenario["holders"] = [h for h in scenario["holders"] if h["command"] == "nvtop"]
    for g in scenario["gpus"]:
        g.pop("unaccounted_memory", None)
    path = tmp_path / "monitored.json"
    path.write_text(json.dumps(scenario))
    waits: list[float] = []
    snaps = sample_suspects(
        SimBackend.from_file(path), 3, 0.5, DEFAULT_THRESHOLD, sleep=waits.append
    )
    assert len(snaps) == 1 and waits == []
    assert [lk.kind for lk in find_leaks(snaps)] == ["monitor"]


def test_nothing_suspicious_is_one_snapshot_and_no_wait() -> None:
    b = SimBackend.from_file(EXAMPLES / "idle-2gpu.json")
    waits: list[float] = []
    snaps = sample_suspects(b, 3, 0.5, DEFAULT_THRESHOLD, sleep=waits.append)
    assert len(snaps) == 1 and waits == [] and find_leaks(snaps) == []


def test_later_samples_read_proc_for_the_suspects_alone() -> None:
    b = SimBackend.from_file(LEAKY)
    read: list[int] = []
    source = type(b.process_source())
    real_info = source.info

    def counting(self: object, pid: int, *, detail: bool = True) -> object:
        read.append(pid)
        return real_info(self, pid, detail=detail)  # type: ignore[arg-type]

    first_reads: list[int] = []

    def between(_: float) -> None:
        if not first_reads:
            first_reads.extend(read)
        read.clear()

    source.info = counting  # type: ignore[method-assign]
    try:
        snaps = sample_suspects(b, 3, 0.0, DEFAULT_THRESHOLD, sleep=between)
    finally:
        source.info = real_info  # type: ignore[method-assign]
    assert len(snaps) == 3
    suspects = {lk.pid for lk in find_leaks(snaps[:1])}
    assert {34567, 34568} <= set(first_reads)  # running, leaking nothing
    assert read and set(read) <= suspects and not {34567, 34568} & set(read)
