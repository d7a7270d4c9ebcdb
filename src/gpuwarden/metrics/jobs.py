"""The daemon's own metrics: the queue and its jobs, read from the store at scrape time
(one read transaction), plus what the scheduling loop measures as it runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gpuwarden.daemon.store import Store

P = "gpuwarden_"
WAIT_BUCKETS = (0.1, 1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
RELEASE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)
PASS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def histogram(
    name: str, doc: str, samples: Iterable[float], buckets: tuple[float, ...]
) -> HistogramMetricFamily:
    values = sorted(max(s, 0.0) for s in samples if s is not None)
    out, i = [], 0
    for b in buckets:
        while i < len(values) and values[i] <= b:
            i += 1
        out.append((repr(float(b)), i))
    out.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, doc, buckets=out, sum_value=sum(values))


class JobsCollector(Collector):
    """Jobs by state and QoS, retries, preemptions, leaks, waits, release times, and each
    running job's memory against its limit (``running`` gives the loop's last view). The
    pass duration is a plain Histogram the loop observes (``pass_histogram``)."""

    def __init__(
        self,
        store: Store,
        running: Callable[[], Iterable[Mapping[str, Any]]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.running = running
        self.clock = clock

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        st = self.store.stats(self.clock())
        jobs = GaugeMetricFamily(P + "jobs", "Jobs by state and QoS class", labels=["state", "qos"])
        for (state, qos), n in sorted(st["jobs"].items()):
            jobs.add_metric([state, qos], n)
        yield jobs
        yield CounterMetricFamily(
            P + "job_oom_retries", "CUDA-OOM retries so far", value=st["oom_retries"]
        )
        yield CounterMetricFamily(
            P + "job_preemptions", "Preemptions so far", value=st["preemptions"]
        )
        yield CounterMetricFamily(
            P + "job_leaks", "Leak events (memory not back after a job ended)", value=st["leaks"]
        )
        restarts = CounterMetricFamily(
            P + "service_restarts",
            "Restarts of a service (submit --restart) so far",
            labels=["job_id", "user"],
        )
        health = CounterMetricFamily(
            P + "service_health_failures",
            "Failed health checks of a service so far",
            labels=["job_id", "user"],
        )
        for job_id, user, n_restarts, n_failed in st.get("services", ()):
            restarts.add_metric([str(job_id), user], n_restarts)
            health.add_metric([str(job_id), user], n_failed)
        yield restarts
        yield health
        oldest = GaugeMetricFamily(
            P + "queue_oldest_wait_seconds", "How long the oldest queued job has waited (0: none)"
        )
        oldest.add_metric([], st["oldest_wait"] or 0.0)
        yield oldest
        yield histogram(
            P + "queue_wait_seconds", "Submit to start, per started job", st["waits"], WAIT_BUCKETS
        )
        yield histogram(
            P + "memory_release_seconds",
            "A job's end to its memory verified back",
            st["releases"],
            RELEASE_BUCKETS,
        )
        mem = GaugeMetricFamily(
            P + "job_memory_bytes",
            "GPU memory a running job's process tree uses, per GPU",
            labels=["job_id", "user", "gpu", "qos"],
        )
        limit = GaugeMetricFamily(
            P + "job_limit_bytes",
            "The memory a running job may use per GPU",
            labels=["job_id", "user", "gpu", "qos"],
        )
        for j in self.running():
            for gpu, used in j["used"].items():
                labels = [str(j["id"]), j["user"], gpu, j["qos"]]
                mem.add_metric(labels, used)
                if j["limit"] is not None:
                    limit.add_metric(labels, j["limit"])
        yield mem
        yield limit


def pass_histogram(registry: Any) -> Callable[[float], None]:
    """A histogram of scheduling-pass durations in ``registry``; returns its observe."""
    from prometheus_client import Histogram

    h = Histogram(
        P + "placement_pass_seconds",
        "Duration of the daemon's scheduling passes",
        buckets=PASS_BUCKETS,
        registry=registry,
    )
    return h.observe
