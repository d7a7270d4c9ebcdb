"""Prometheus exposition of a Snapshot: one snapshot per scrape (never one NVML call per
metric), cached for ``cache_seconds`` so several scrapers do not multiply the load.

Units are Prometheus's: bytes, seconds, ratios from 0 to 1, degrees Celsius, watts.
Series are rebuilt from the snapshot on every collect, so a process that went away is
gone from the next scrape. Per-process series carry ``pid`` unless ``pid_labels`` is off
(then processes of one user/container/job on a GPU are summed), to bound cardinality."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from gpuwarden.observe.snapshot import Snapshot
    from gpuwarden.procs.model import ProcInfo

COMPUTE_MODES = ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")
PREFIX = "gpuwarden_"


class _Family:
    """One metric family's rows, before they become prometheus_client's Metric (collect)
    or text (``SnapshotCollector.render_text``): one source for both."""

    __slots__ = ("doc", "info", "labels", "name", "rows")

    def __init__(self, name: str, doc: str, labels: list[str], info: bool = False) -> None:
        self.name, self.doc, self.labels, self.info = PREFIX + name, doc, labels, info
        self.rows: list[_Row] = []

    def add_metric(self, labels: Sequence[str], value: float | dict[str, str]) -> None:
        # An info row's value is its extra labels; ours has none, and it renders as 1.
        # -0.0 is 0.0 (it is ==, and its text would differ): equal rows, equal text.
        self.rows.append(
            (
                tuple(labels),
                1.0
                if isinstance(value, dict)
                else 0.0
                if value == 0 and type(value) is float
                else value,
            )
        )

    def metric(self, rows: Sequence[tuple[tuple[str, ...], float]] | None = None) -> Metric:
        m: GaugeMetricFamily | InfoMetricFamily
        if self.info:
            m = InfoMetricFamily(self.name, self.doc, labels=self.labels)
            for labels, _ in self.rows if rows is None else rows:
                m.add_metric(list(labels), {})
        else:
            m = GaugeMetricFamily(self.name, self.doc, labels=self.labels)
            for labels, value in self.rows if rows is None else rows:
                m.add_metric(list(labels), value)
        return m


_Row = tuple[tuple[str, ...], float]
_Line = tuple[str, int | None, str]  # name-and-labels part, int value, the whole line
# A family's header lines, its series, and its rows with the text they rendered as.
_Text = tuple[str, dict[tuple[str, ...], _Line], list[_Row], str]


class _One(Collector):
    def __init__(self, metric: Metric | None) -> None:
        self.one = metric

    def collect(self) -> Iterator[Metric]:
        if self.one is not None:
            yield self.one


def _g(name: str, doc: str, labels: list[str]) -> _Family:
    return _Family(name, doc, labels)


class SnapshotCollector(Collector):
    """Collects GPU, process, user and leak metrics from snapshots taken by ``take``."""

    def __init__(
        self,
        take: Callable[[], Snapshot],
        *,
        cache_seconds: float = 1.0,
        pid_labels: bool = True,
        holders: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.take = take
        self.cache_seconds = cache_seconds
        self.pid_labels = pid_labels
        # False: ``take`` does not scan /proc for holders, so the hidden-holder series is
        # left out: a 0 there would silently disarm the alert on it.
        self.holders = holders
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, Snapshot, float] | None = None  # (when, snap, seconds)
        # render_text's text per family: its HELP/TYPE lines, per row's label values the
        # sample line up to its value and the last integer value with its line, and the
        # rows with the text they made; only the last render's are kept.
        self._text: dict[str, tuple[str, dict[str, _Text]]] = {}  # per format, + trailer
        self._text_lock = threading.Lock()
        # Per format, the last render's snapshot and bytes: several scrapers within the
        # cache's lifetime (an HA pair of Prometheus servers) cost one render.
        self._rendered: dict[str, tuple[Snapshot, bytes]] = {}
        self._segments: dict[str, tuple[Snapshot, list[str]]] = {}
        # Per (GPU, pid), the last snapshot's facts of the process and its label values.
        self._keys: dict[tuple[str, int], tuple[ProcInfo, tuple[str, ...]]] = {}

    def snapshot(self) -> tuple[Snapshot, float]:
        """The snapshot for this scrape and how long taking it took."""
        with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < self.cache_seconds:
                return self._cached[1], self._cached[2]
            started = time.perf_counter()
            snap = self.take()
            took = time.perf_counter() - started
            self._cached = (now, snap, took)
            return snap, took

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no fixed set to check at registration: it depends on the GPUs

    def collect(self) -> Iterator[Metric]:
        for family in self._families(*self.snapshot()):
            yield family.metric()

    def render_text(
        self, encode: Callable[[Collector], bytes] = generate_latest, fmt: str = "text"
    ) -> bytes:
        """``render_segments`` joined: the scrape's body."""
        snap, segments = self._render(encode, fmt)
        with self._text_lock:
            last = self._rendered.get(fmt)
            if last is not None and last[0] is snap:  # a cached snapshot: the same bytes
                return last[1]
            rendered = "".join(segments).encode("utf-8")
            self._rendered[fmt] = (snap, rendered)
        return rendered

    def render_segments(
        self, encode: Callable[[Collector], bytes] = generate_latest, fmt: str = "text"
    ) -> list[str]:
        """The scrape's text in the pieces it was made of (each family's header and
        series, then the trailer): a family that did not change is the same piece as in
        the last render, which ``GzipSegments`` compresses once."""
        return self._render(encode, fmt)[1]

    def _render(self, encode: Callable[[Collector], bytes], fmt: str) -> tuple[Snapshot, list[str]]:
        """What ``encode`` (``generate_latest``, or the OpenMetrics one: ``fmt`` names
        which, with its options) writes for a registry holding only this collector, byte
        for byte, at a fraction of its cost: a series seen in the previous render reuses
        its escaped name-and-labels part, and its whole line while an integer value
        holds; a family whose rows are all as they were (most, most of the time: a
        process's memory moves in allocator chunks, idle ones stay at 0% SM) its whole
        text. The parts of new series and families come from ``encode`` itself, so the
        two cannot differ."""
        snap, took = self.snapshot()
        with self._text_lock:
            last = self._segments.get(fmt)
            if last is not None and last[0] is snap:  # a cached snapshot: the same text
                return last
        families = self._families(snap, took)
        out: list[str] = []
        with self._text_lock:
            trailer, previous = self._text.get(fmt) or (encode(_One(None)).decode(), {})
            kept: dict[str, _Text] = {}
            for family in families:
                was = previous.get(family.name)
                if was is not None and was[2] == family.rows:  # equal values, equal text
                    out += (was[0], was[3])
                    kept[family.name] = was
                    continue
                header, old = (
                    (was[0], was[1])
                    if was is not None
                    else (encode(_One(family.metric([]))).decode().removesuffix(trailer), {})
                )
                parts: dict[tuple[str, ...], _Line] = {}
                body: list[str] = []
                for labels, value in family.rows:
                    seen = parts.get(labels) or old.get(labels)
                    if seen is None:
                        text = encode(_One(family.metric([(labels, 0.0)]))).decode()
                        line = text[len(header) : len(text) - len(trailer)]
                        seen = (line.rpartition(" ")[0] + " ", None, "")
                    # An int's text is its value's alone (a float's: -0.0 == 0.0).
                    if type(value) is not int or seen[1] != value:
                        seen = (
                            seen[0],
                            value if type(value) is int else None,
                            f"{seen[0]}{floatToGoString(value)}\n",  # type: ignore[no-untyped-call]
                        )
                    parts[labels] = seen
                    body.append(seen[2])
                text = "".join(body)
                out += (header, text)
                kept[family.name] = (header, parts, family.rows, text)
            out.append(trailer)
            self._text[fmt] = (trailer, kept)
            self._segments[fmt] = (snap, out)
        return snap, out

    def _families(self, snap: Snapshot, took: float) -> list[_Family]:
        from gpuwarden.observe.leaks import find_leaks

        info = _Family(
            "gpu", "Identity of each GPU", labels=["gpu", "uuid", "name", "pci_bus_id"], info=True
        )
        total = _g("gpu_memory_total_bytes", "Memory of each GPU", ["gpu"])
        used = _g("gpu_memory_used_bytes", "Memory in use on each GPU (as NVML says)", ["gpu"])
        free = _g("gpu_memory_free_bytes", "Memory free on each GPU", ["gpu"])
        util = _g("gpu_utilization_ratio", "Share of time a kernel ran, 0-1", ["gpu"])
        temp = _g("gpu_temperature_celsius", "GPU temperature", ["gpu"])
        power = _g("gpu_power_watts", "Power draw", ["gpu"])
        ecc = _g("gpu_ecc_uncorrected_errors", "Volatile uncorrected ECC errors", ["gpu"])
        mode = _g(
            "gpu_compute_mode", "1 for the GPU's compute mode, 0 for the others", ["gpu", "mode"]
        )
        mps = _g("gpu_mps_active", "1 when an MPS server serves the GPU", ["gpu"])
        unacc = _g(
            "gpu_unaccounted_bytes",
            "Memory in use that no listed process accounts for (leaked contexts)",
            ["gpu"],
        )
        leaked = _g(
            "gpu_leaked_bytes", "Memory held by leaks, by kind (one sample)", ["gpu", "kind"]
        )
        hidden = _g(
            "gpu_hidden_holders", "Processes holding the GPU that NVML does not list", ["gpu"]
        )
        users_on = _g("gpu_users", "Distinct users with processes on the GPU", ["gpu"])
        # "job_id", not "job": Prometheus sets "job" on every series (the scrape job).
        labels = ["gpu", "user", "container", "job_id"] + (["pid"] if self.pid_labels else [])
        pmem = _g("process_memory_bytes", "GPU memory of each process", labels)
        psm = _g("process_sm_utilization_ratio", "SM utilization of each process, 0-1", labels)
        umem = _g(
            "user_memory_bytes", "GPU memory of each user's processes, over all GPUs", ["user"]
        )
        age = _g("snapshot_seconds", "How long taking the scrape's snapshot took", [])
        mig_info = _Family(
            "mig_instance",
            "Identity of each MIG instance of a GPU in MIG mode",
            labels=["gpu", "gi", "ci", "profile", "uuid"],
            info=True,
        )
        mig_total = _g("mig_memory_total_bytes", "Memory of each MIG instance", ["gpu", "gi"])
        mig_used = _g("mig_memory_used_bytes", "Memory in use on each MIG instance", ["gpu", "gi"])
        mig_free = _g("mig_memory_free_bytes", "Memory free on each MIG instance", ["gpu", "gi"])
        mig_procs = _g("mig_processes", "Processes NVML lists on each MIG instance", ["gpu", "gi"])

        per_user: dict[str, int] = {}
        keys = self._keys
        new_keys: dict[tuple[str, int], tuple[ProcInfo, tuple[str, ...]]] = {}
        for view in snap.gpus:
            f = view.facts
            g = str(f.index)
            info.add_metric([g, f.uuid, f.name, f.pci_bus_id or ""], {})
            total.add_metric([g], f.memory_total)
            used.add_metric([g], f.memory_used)
            free.add_metric([g], f.memory_free)
            if f.utilization is not None:
                util.add_metric([g], f.utilization / 100)
            if f.temperature is not None:
                temp.add_metric([g], f.temperature)
            if f.power_watts is not None:
                power.add_metric([g], f.power_watts)
            if f.ecc_uncorrected is not None:
                ecc.add_metric([g], f.ecc_uncorrected)
            current = f.compute_mode or "Default"
            for m in sorted(set(COMPUTE_MODES) | {current}):
                mode.add_metric([g, m], 1.0 if m == current else 0.0)
            if f.mps is not None:
                mps.add_metric([g], 1.0 if f.mps else 0.0)
            if view.unaccounted is not None:
                unacc.add_metric([g], max(view.unaccounted, 0))
            mem_sums: dict[tuple[str, ...], int] = {}
            sm_sums: dict[tuple[str, ...], float] = {}
            owners: set[str] = set()
            pid_labels = self.pid_labels
            for p in view.processes:
                facts, pinfo = p.gpu, p.info
                user = pinfo.user or ""
                if user:
                    owners.add(user)
                # A process's labels change only with its facts, which a snapshot keeps
                # (the same ProcInfo) while the process stays what it was.
                was = keys.get((g, facts.pid))
                if was is not None and was[0] is pinfo:
                    key = was[1]
                else:
                    env = pinfo.env
                    job = env.get("GPUWARDEN_JOB", "") if env else ""
                    key = (
                        (g, user, pinfo.container or "", job, str(facts.pid))
                        if pid_labels
                        else (g, user, pinfo.container or "", job)
                    )
                new_keys[(g, facts.pid)] = (pinfo, key)
                memory, sm = facts.memory, facts.sm_utilization
                if memory is not None:
                    mem_sums[key] = mem_sums.get(key, 0) + memory
                    per_user[user] = per_user.get(user, 0) + memory
                if sm is not None:
                    sm_sums[key] = sm_sums.get(key, 0.0) + sm / 100
            pmem.rows.extend(mem_sums.items())  # the keys are the label values already
            psm.rows.extend([(key, r if r < 1.0 else 1.0) for key, r in sm_sums.items()])
            users_on.add_metric([g], len(owners))
            for mi in f.mig_instances:
                gi = str(mi.gi_id)
                mig_info.add_metric([g, gi, str(mi.ci_id), mi.profile, mi.uuid], {})
                mig_total.add_metric([g, gi], mi.memory_total)
                mig_used.add_metric([g, gi], mi.memory_used)
                mig_free.add_metric([g, gi], mi.memory_free)
                mig_procs.add_metric(
                    [g, gi], sum(1 for p in view.processes if p.gpu.mig_uuid == mi.uuid)
                )
        self._keys = new_keys
        by_kind: dict[tuple[str, str], int] = {}
        holders: dict[str, int] = {str(v.facts.index): 0 for v in snap.gpus}
        for lk in find_leaks([snap]):
            if lk.gpu is None:
                continue
            g = str(lk.gpu)
            by_kind[(g, lk.kind)] = by_kind.get((g, lk.kind), 0) + (lk.memory or 0)
            if lk.kind == "hidden_holder":
                holders[g] = holders.get(g, 0) + 1
        for (g, kind), b in sorted(by_kind.items()):
            leaked.add_metric([g, kind], b)
        for g, n in holders.items():
            hidden.add_metric([g], n)
        for user, b in sorted(per_user.items()):
            umem.add_metric([user], b)
        age.add_metric([], took)
        return [
            info,
            total,
            used,
            free,
            util,
            temp,
            power,
            ecc,
            mode,
            mps,
            unacc,
            leaked,
            *([hidden] if self.holders else []),
            users_on,
            pmem,
            psm,
            umem,
            age,
            *(
                [mig_info, mig_total, mig_used, mig_free, mig_procs]
                if any(v.facts.mig_instances for v in snap.gpus)
                else []
            ),
        ]


def render_text(parts: Sequence[Collector]) -> bytes:
    """The text format of ``parts`` in order: what ``generate_latest`` writes for one
    registry holding them all, with each snapshot collector rendering its own text."""
    return b"".join(
        p.render_text() if isinstance(p, SnapshotCollector) else generate_latest(p) for p in parts
    )


def render_segments(parts: Sequence[Collector]) -> list[str]:
    """``render_text(parts)`` in pieces, for ``GzipSegments``: a snapshot collector's
    families one by one, any other collector's text whole."""
    out: list[str] = []
    for p in parts:
        if isinstance(p, SnapshotCollector):
            out += p.render_segments()
        else:
            out.append(generate_latest(p).decode("utf-8"))
    return out


class SnapshotRegistry(CollectorRegistry):
    """A registry holding one snapshot collector, so the text format can be rendered by
    the collector itself (``SnapshotCollector.render_text``)."""

    def __init__(self, collector: SnapshotCollector) -> None:
        super().__init__(auto_describe=False)
        self.collector = collector
        self.register(collector)
