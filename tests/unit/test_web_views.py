"""The web page's overview over a real store: its charts are kept for as long as one of
their points lasts (drawing 24 hours reads every sample), its queue is always fresh."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.daemon.history import GpuSample
from gpuwarden.daemon.store import Store
from gpuwarden.jobs.model import JobSpec
from gpuwarden.web.views import ChartCache, overview

GiB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_charts_are_kept_for_one_point_and_the_queue_is_read_each_time(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:

        def sample(ts: int, used: int) -> None:
            store.record_samples(
                [GpuSample(ts, "GPU-a", 0, 80 * GiB, used, 0, {}, {})], keep=10**6, now=ts
            )

        sample(1000, 10 * GiB)
        clock = Clock()
        cache = ChartCache(clock=clock)

        def view() -> dict:  # type: ignore[type-arg]
            return overview(store, hours=1, anonymous=True, now=1010, cache=cache)

        assert view()["gpus"][0]["used"] == [10 * GiB]
        sample(1005, 30 * GiB)
        store.submit(JobSpec(command=("true",), user="ann", uid=1000, gid=1000), 1006)
        again = view()
        assert again["gpus"][0]["used"] == [10 * GiB]  # one point of 1 h lasts 10 s
        assert len(again["queue"]) == 1  # ... but the queue is read now
        clock.now = 10.0
        assert view()["gpus"][0]["used"] == [10 * GiB, 30 * GiB]
        # Without a cache, always drawn now.
        assert overview(store, hours=1, anonymous=True, now=1010)["gpus"][0]["used"] == [
            10 * GiB,
            30 * GiB,
        ]


def test_the_cache_keeps_a_bounded_number_of_charts() -> None:
    cache = ChartCache(size=4)
    drawn: list[float] = []
    for hours in range(10):
        cache.get((float(hours), "job", 360), 60.0, lambda h=hours: drawn.append(h) or [{"h": h}])  # type: ignore[func-returns-value]
    assert len(cache._charts) == 4 and drawn == list(range(10))
    assert cache.get((9.0, "job", 360), 60.0, lambda: [{"h": -1}]) == [{"h": 9}]
    assert cache.get((0.0, "job", 360), 60.0, lambda: [{"h": -1}]) == [{"h": -1}]


def test_anonymous_viewers_get_no_dependency_ids_and_see_drains(tmp_path: Path) -> None:
    with Store(tmp_path / "state.db") as store:
        dep, _ = store.submit(JobSpec(command=("true",), user="ann", uid=1000, gid=1000), 1.0)
        store.submit(
            JobSpec(
                command=("true",),
                user="ann",
                uid=1000,
                gid=1000,
                after=(dep.id,),
                after_any=(dep.id,),
                after_fail=(dep.id,),
            ),
            2.0,
        )
        store.drain(1, "ECC errors", "root", 3.0)
        public = overview(store, hours=1, anonymous=True, now=10)
        mine = overview(store, hours=1, anonymous=False, now=10)
    for key in ("after", "after_any", "after_fail"):
        assert key not in public["queue"][1] and mine["queue"][1][key] == [dep.id]
    assert public["drains"] == [{"gpu": 1, "reason": None}]
    assert mine["drains"] == [{"gpu": 1, "reason": "ECC errors"}]
