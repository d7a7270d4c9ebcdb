"""The GPU states the policies see: each pass turns its snapshot, the active jobs and the
open holds into one ``GpuState`` per GPU (what managed jobs and ended attempts book,
foreign memory at its recent peak, the GPU's local CPUs, a drain), and keeps the CUDA
context allowance booked beside every budget, measured per GPU model and driver
(docs/design.md, invariant 1; sched/context.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.daemon.queueview import queued_view
from gpuwarden.daemon.reconcile import PEAK_WINDOW, UNACCOUNTED_PERSIST, foreign_figure
from gpuwarden.jobs.request import GUARANTEED
from gpuwarden.sched.model import GpuState, ManagedUse

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuwarden.daemon.config import Config
    from gpuwarden.daemon.store import Store
    from gpuwarden.jobs.model import Hold, Job
    from gpuwarden.observe.snapshot import Snapshot

REPORTS = "reports"  # beside jobs/: one allocator report file per attempt (the cap hook's)


def report_path(jobs_dir: Path, job: Job) -> Path:
    """Where this attempt's cap hook reports its allocator's peak: a file of the
    job's user in a directory others may pass through but not list."""
    return jobs_dir.parent / REPORTS / f"{job.id}.{job.attempts}.json"


def driver_limit(cap: int | None, context: int) -> int | None:
    """A job's memory limit as the driver counts it: its allocator's cap plus the CUDA
    context booked beside it (None: a whole GPU, no limit)."""
    return None if cap is None else cap + context


class GpuStates:
    """Owns the last pass's GPU states (``last``), what goes into them across passes
    (foreign peaks, samples of unaccounted memory, this daemon's CPU mask) and the CUDA
    context allowances: the measured samples, and the one booked for a job."""

    def __init__(
        self,
        store: Store,
        config: Config,
        jobs_dir: Path,
        clock: Callable[[], float],
        estimate: Callable[[Job], float | None],
    ) -> None:
        self.store = store
        self.config = config
        self.jobs_dir = jobs_dir
        self.clock = clock
        self.estimate = estimate  # a job's learned run time (backfill's estimate)
        self.last: list[GpuState] = []
        self._peaks: dict[str, list[tuple[float, int]]] = {}  # uuid -> (time, foreign bytes)
        # uuid -> recent samples of the memory no process accounts for (a hold's baseline)
        self.unaccounted_seen: dict[str, list[tuple[float, int]]] = {}
        self._models: dict[str, tuple[str, str]] = {}  # GPU uuid -> (model, driver)
        self._context_samples: dict[tuple[str, str], list[int]] | None = None  # cached
        self._allowed_cpus: frozenset[int] | None = None  # this daemon's CPU mask

    # -- CUDA context allowances --------------------------------------------------------
    def context_allowance(self, job: Job) -> int:
        """The CUDA context allowance an OOM retry takes out of NVML's figures (the
        message's "in use", the sampled peak): the one booked for the job, else its
        GPUs' allowance as last measured (sched/context.py)."""
        if job.context is not None:
            return job.context
        return self.booked_context(job.gpus)

    def booked_context(self, gpus: Iterable[int]) -> int:
        """The context allowance to book per GPU for a job on ``gpus``: the largest of
        theirs (one figure per job, as its budget is)."""
        from gpuwarden.sched.context import DEFAULT_CONTEXT

        wanted = set(gpus)
        found = [g.context for g in self.last if g.index in wanted]
        return max(found) if found else DEFAULT_CONTEXT

    def context_ceiling(self, job: Job) -> int:
        """The context the watchdog allows beside a running job's capped allocations:
        the one booked for it, or more where jobs on its GPUs' model were measured with
        more (``sched/context.ceiling``): contexts differ by the kernels a job loads."""
        from gpuwarden.sched.context import ceiling

        samples = self._samples()
        keys = {self._models[u] for u in job.gpu_uuids if u in self._models}
        most = [ceiling(samples.get(k, []), self.config.context_memory) for k in keys]
        return max([self.context_allowance(job), *most])

    def _samples(self) -> dict[tuple[str, str], list[int]]:
        if self._context_samples is None:
            self._context_samples = self.store.context_samples()
        return self._context_samples

    def contexts(self, snap: Snapshot) -> dict[str, int]:
        """The CUDA context allowance of each GPU (by uuid): config ``context_memory``,
        else what jobs on that GPU model and driver measured (sched/context.py)."""
        from gpuwarden.sched.context import allowance

        samples = self._samples()
        driver = snap.driver_version or "unknown"
        out = {}
        for v in snap.gpus:
            key = (v.facts.name, driver)
            self._models[v.facts.uuid] = key
            out[v.facts.uuid] = allowance(samples.get(key, []), self.config.context_memory)
        return out

    def measure_context(self, job: Job, started: bool, succeeded: bool) -> None:
        """A single-GPU job that ended: its driver peak less its allocator's peak (the
        cap hook's report, read and removed here) is one measurement of the context on
        that GPU model. Only a first attempt that succeeded is one: the context grows
        with the kernels a job loads, and an attempt that failed early (an OOM at its
        first allocations) shows less than its work takes (518 MiB where the work
        showed 610 on an H100), which would book every later job too little."""
        from gpuwarden.sched.context import sample

        path = report_path(self.jobs_dir, job)
        try:
            with open(path, "rb") as f:
                report = json.loads(f.read(4096) or b"null")
            peaks = report["max_reserved"] if isinstance(report, dict) else None
            peak = peaks[0] if isinstance(peaks, list) and len(peaks) == 1 else None
        except (OSError, ValueError, KeyError, TypeError, RecursionError):  # the job wrote it
            return
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if (
            not started
            or len(job.gpu_uuids) != 1
            or isinstance(peak, bool)
            or not isinstance(peak, int)
            or not 0 <= peak < 1 << 50
        ):
            return
        self.store.set_allocated_peak(job.id, peak)
        if not succeeded or job.peak_memory is None or job.attempts:
            return  # (a later attempt's peak may be an earlier one's, at a lower cap)
        key = self._models.get(job.gpu_uuids[0])
        if key is None:
            return
        value = sample(job.peak_memory, peak)
        if value is None:
            return
        self.store.add_context_sample(key[0], key[1], value, self.clock())
        self._context_samples = None  # read again next pass

    # -- the states -----------------------------------------------------------------------
    def update(
        self,
        snap: Snapshot,
        active: list[Job],
        managed_pids: set[int],
        used: dict[int, dict[str, int]],
        holds: list[Hold],
        seen_pids: Mapping[int, Mapping[int, float | None]],
    ) -> list[GpuState]:
        """This pass's states, kept as ``last``. ``managed_pids`` grows by every process
        of an active attempt (``seen_pids``) and of an open hold: none is foreign."""
        from gpuwarden.sched.booking import reservation
        from gpuwarden.sched.headroom import foreign_parts, gpu_states

        now = self.clock()
        contexts = self.contexts(snap)
        uses: dict[str, list[ManagedUse]] = {}
        for job in active:
            # Every process seen in this attempt is the job's, also in the moments
            # before its tree is read or after it left: never foreign.
            managed_pids |= set(seen_pids.get(job.id, ()))
            if job.budget is None:
                continue
            view = queued_view(job, self.estimate(job))
            for uuid in job.gpu_uuids:
                uses.setdefault(uuid, []).append(
                    reservation(
                        view,
                        job.budget,
                        started_at=job.started_at or now,
                        used=used.get(job.id, {}).get(uuid),
                        preempting=job.preempting_at is not None,
                        context=job.context if job.context is not None else contexts.get(uuid, 0),
                    )
                )
        for h in holds:  # ended attempts whose memory is not back yet
            for uuid in h.gpu_uuids:
                uses.setdefault(uuid, []).append(
                    ManagedUse(
                        job_id=-h.id,
                        budget=h.budget,
                        qos=GUARANTEED,
                        started_at=h.exited_at,
                        context=contexts.get(uuid, 0),
                        ended=True,
                    )
                )
            managed_pids |= set(h.pids)  # what they leave is theirs, not foreign
        foreign: dict[str, int] = {}
        for gpu in snap.gpus:
            uuid = gpu.facts.uuid
            procs, unaccounted = foreign_parts(gpu, managed_pids)
            hist = [(t, b) for t, b in self._peaks.get(uuid, []) if now - t < PEAK_WINDOW]
            hist.append((now, procs))
            self._peaks[uuid] = hist[-600:]
            seen: list[tuple[float, int]] = []
            if unaccounted is not None:
                seen = [
                    (t, b)
                    for t, b in self.unaccounted_seen.get(uuid, [])
                    if now - t < UNACCOUNTED_PERSIST
                ]
                seen.append((now, unaccounted))
                self.unaccounted_seen[uuid] = seen[-600:]
            foreign[uuid] = foreign_figure(hist, seen, now)
        states = gpu_states(
            snap, uses, managed_pids, foreign, self.config.reserve, contexts=contexts
        )
        self.last = self._drained(self._with_cpus(states, snap, active))
        return self.last

    def _drained(self, states: list[GpuState]) -> list[GpuState]:
        """The GPUs an admin drained (``gpu drain``) marked so: placement skips them."""
        drains = self.store.drains()
        if not drains:
            return states
        return [
            dataclasses.replace(g, drained=drains[g.index]["reason"] or "")
            if g.index in drains
            else g
            for g in states
        ]

    def _with_cpus(
        self, states: list[GpuState], snap: Snapshot, active: list[Job]
    ) -> list[GpuState]:
        """Each GPU's local CPUs (those this daemon may use) and which of them no job
        holds alone (--cpus), for placement."""
        from gpuwarden.gpus.topology import parse_cpulist
        from gpuwarden.launch import probe_host

        if self._allowed_cpus is None:
            self._allowed_cpus = probe_host().allowed_cpus or frozenset()
        held = frozenset(c for j in active for c in j.cpu_set)
        facts = {v.facts.index: v.facts for v in snap.gpus}
        out = []
        for g in states:
            text = facts[g.index].cpus if g.index in facts else None
            if text is None:
                out.append(g)
                continue
            local = parse_cpulist(text)
            if self._allowed_cpus:
                local &= self._allowed_cpus
            out.append(dataclasses.replace(g, local_cpus=local, free_cpus=local - held))
        return out
