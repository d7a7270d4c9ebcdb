"""The simulated backend: a scenario file plus the live registrations of simulated jobs.

It answers everything the NVML backend answers, so every view, rule and policy runs
unchanged on a machine without a GPU (CI, the demo)."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Collection, Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from gpuwarden.errors import BackendUnavailable, UsageError
from gpuwarden.gpus.model import COMPUTE_MODES, GpuFacts, GpuProcessFacts, MigInstanceFacts
from gpuwarden.gpus.topology import parse_cpulist
from gpuwarden.procs.live import LiveProcesses
from gpuwarden.procs.model import Holder, ProcInfo
from gpuwarden.sim.registry import Registry, state_dir_for
from gpuwarden.sim.scenario import Scenario, SimProcess, load_scenario


@lru_cache(maxsize=1024)
def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


class SimProcesses:
    """The real /proc with the scenario's declared processes laid over it."""

    def __init__(
        self,
        scenario: Scenario,
        loaded_at: float,
        reaped: Iterable[int] = (),
        kept: dict[int, ProcInfo] | None = None,
    ) -> None:
        # kept: the backend's facts of declared processes whose facts do not move with
        # time, across snapshots (as KeptFacts keeps the lasting /proc facts).
        self._kept: dict[int, ProcInfo] = {} if kept is None else kept
        self._live = LiveProcesses()
        self._reaped = frozenset(reaped)
        self._declared: dict[int, SimProcess] = {p.pid: p for p in scenario.processes}
        self._holders = tuple(h for h in scenario.holders if h.pid not in self._reaped)
        self._loaded_at = loaded_at
        self._in_container = bool(scenario.extra.get("in_container", False))

    @property
    def in_child_namespace(self) -> bool:
        return self._in_container or self._live.in_child_namespace

    def info(self, pid: int, *, detail: bool = True) -> ProcInfo:
        p = self._declared.get(pid)
        if p is None:
            return self._live.info(pid, detail=detail)
        if p.state == "dead" or pid in self._reaped:
            return ProcInfo(pid=pid, exists=False)
        if p.state == "garbage":
            return ProcInfo(pid=pid, exists=False, garbage=True)
        if p.state == "other_namespace":
            # Its container is the scenario's to say: status and leaks both name it.
            return ProcInfo(
                pid=pid, exists=False, container=p.container, namespace_hint="another PID namespace"
            )
        kept = self._kept.get(pid)
        if kept is not None:
            return kept
        orphan = p.state == "orphan"
        start = self._loaded_at - p.started_ago
        # A steady cpu_percent since its start: two looks apart differ by that share.
        cpu_time = (
            None if p.cpu_percent is None else p.cpu_percent / 100 * max(time.time() - start, 0.0)
        )
        info = ProcInfo(
            pid=pid,
            exists=True,
            start_time=start,
            user=p.user,
            uid=p.uid if p.uid is not None else _uid_of(p.user),
            command=p.command,
            name=os.path.basename(p.command.split()[0]) if p.command.split() else p.command,
            status="zombie" if p.state == "zombie" else "running",
            ppid=1 if orphan else (p.ppid if p.ppid is not None else 1),
            pgid=max(pid - 1, 2) if orphan else pid,
            group_leader_alive=not orphan,
            cpus_allowed=parse_cpulist(p.cpus_allowed) if p.cpus_allowed else None,
            container=p.container,
            env=p.env or {},
            uses_torch=p.torch,
            rss=p.rss,
            cpu_time=cpu_time,
        )
        if cpu_time is None:  # nothing in it moves with time: the next snapshot's too
            self._kept[pid] = info
        return info

    def device_mapped(self, pid: int) -> bool | None:
        """Unknown: simulated jobs map nothing, so only open device files tell them apart."""
        return None

    def holders(
        self,
        device_files: Mapping[str, int | None],
        exclude: Iterable[int] = (),
        only: Collection[int] | None = None,
    ) -> list[Holder]:
        out = self._live.holders(device_files, exclude, only)
        excluded = set(exclude)
        for h in self._holders:
            if h.pid in excluded or (only is not None and h.pid not in only):
                continue
            indices = sorted(
                {
                    int(d[len("/dev/nvidia") :])
                    for d in h.devices
                    if d.startswith("/dev/nvidia") and d[len("/dev/nvidia") :].isdigit()
                }
            )
            out.append(
                Holder(
                    pid=h.pid,
                    devices=h.devices,
                    gpu_indices=tuple(indices),
                    user=h.user,
                    command=h.command,
                    start_time=self._loaded_at - 600,
                    uses_uvm=any(d.endswith("nvidia-uvm") for d in h.devices),
                )
            )
        return out


class SimBackend:
    """Backend over a scenario file. Writable state lives in a per-scenario directory."""

    name = "sim"

    def __init__(self, scenario: Scenario, state_dir: Path) -> None:
        self.scenario = scenario
        self.registry = Registry(state_dir, scenario.free_lag)
        try:
            self.registry.ensure(len(scenario.gpus))
        except OSError as e:
            raise BackendUnavailable(
                f"cannot use the simulation state directory {state_dir}: "
                f"{e.strerror or e} (set GPUWARDEN_SIM_STATE to a writable directory)"
            ) from None
        self.warnings: list[str] = []
        self._loaded_at = time.time()
        self._reaped: set[int] = set()  # scenario pids reaped in this run (reap_declared)
        self._kept: dict[int, ProcInfo] = {}  # SimProcesses' facts kept across snapshots
        self._declared_list: tuple[int, list[GpuProcessFacts]] | None = None  # (reaped, list)

    def declared(self, pid: int) -> bool:
        """A pid the scenario file declares: no real process stands behind it, so it is
        never signalled (another process may well own that pid here)."""
        return any(p.pid == pid for p in self.scenario.processes) or any(
            h.pid == pid for h in self.scenario.holders
        )

    def reap_declared(self, pid: int) -> None:
        """Model the reaping of a scenario process: for the rest of this run the driver
        no longer lists it nor charges its memory. The scenario file is left as it is."""
        self._reaped.add(pid)

    def _live_declared(self) -> list[SimProcess]:
        return [p for p in self.scenario.processes if p.pid not in self._reaped]

    def _declared_facts(self) -> list[GpuProcessFacts]:
        """The driver's list of the scenario's processes: the file does not change during
        a run and reaping only removes from it, so it is made again only after a reap."""
        if self._declared_list is not None and self._declared_list[0] == len(self._reaped):
            return self._declared_list[1]
        mig_of = {(g.index, m.gi_id): m.uuid for g in self.scenario.gpus for m in g.mig_instances}
        facts = [
            GpuProcessFacts(
                pid=p.pid,
                gpu_index=p.gpu,
                memory=p.memory,
                kinds=p.kinds,
                sm_utilization=p.sm_utilization,
                mig_uuid=None if p.mig is None else mig_of[(p.gpu, p.mig)],
            )
            for p in self._live_declared()
        ]
        self._declared_list = (len(self._reaped), facts)
        return facts

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SimBackend:
        scenario = load_scenario(path)
        return cls(scenario, state_dir_for(scenario.path))

    def gpus(self) -> list[GpuFacts]:
        settings = self.registry.settings()
        charged: dict[int, int] = {g.index: 0 for g in self.scenario.gpus}
        # On a GPU in MIG mode memory is charged to an instance: its own slice.
        mig_charged: dict[str, int] = {
            m.uuid: 0 for g in self.scenario.gpus for m in g.mig_instances
        }
        for p in self._declared_facts():
            if p.mig_uuid is not None:
                mig_charged[p.mig_uuid] += p.memory or 0
            else:
                charged[p.gpu_index] += p.memory or 0
        by_uuid = {g.uuid: g.index for g in self.scenario.gpus}
        clients: set[int] = set()  # GPUs an MPS server serves a client on, as NVML sees
        for alloc in self.registry.allocations():
            for uuid, nbytes in alloc.gpus.items():
                if uuid in mig_charged:
                    mig_charged[uuid] += nbytes
                if uuid in by_uuid:
                    charged[by_uuid[uuid]] += nbytes
                    if alloc.mps and not alloc.freeing:
                        clients.add(by_uuid[uuid])
        out: list[GpuFacts] = []
        for g in self.scenario.gpus:
            s = settings.get(g.uuid, {})
            migs = tuple(
                MigInstanceFacts(
                    gpu_index=g.index,
                    gi_id=m.gi_id,
                    ci_id=m.ci_id,
                    profile=m.profile,
                    uuid=m.uuid,
                    memory_total=m.memory_total,
                    memory_used=min(m.memory_total, mig_charged[m.uuid]),
                    memory_free=m.memory_total - min(m.memory_total, mig_charged[m.uuid]),
                )
                for m in g.mig_instances
            )
            used = min(
                g.memory_total,
                g.driver_baseline
                + g.unaccounted_memory
                + charged[g.index]
                + sum(m.memory_used for m in migs),
            )
            out.append(
                GpuFacts(
                    index=g.index,
                    uuid=g.uuid,
                    name=g.name,
                    memory_total=g.memory_total,
                    memory_used=used,
                    memory_free=g.memory_total - used,
                    memory_reserved=0,
                    # NVML does not report utilization on a GPU in MIG mode
                    utilization=None if g.mig_mode else g.utilization,
                    memory_utilization=None,
                    temperature=g.temperature,
                    power_watts=g.power_watts,
                    power_limit_watts=g.power_limit_watts,
                    compute_mode=str(s.get("compute_mode", g.compute_mode)),
                    persistence_mode=bool(s.get("persistence_mode", g.persistence_mode)),
                    mig_mode=g.mig_mode,
                    mps=bool(s.get("mps", g.mps)) or g.index in clients,
                    numa_node=g.numa_node,
                    cpus=g.cpus,
                    pci_bus_id=g.pci_bus_id,
                    minor_number=g.index,
                    ecc_uncorrected=g.ecc_uncorrected,
                    retired_pages=g.retired_pages,
                    retired_pages_pending=g.retired_pages_pending,
                    driver_baseline=g.driver_baseline,
                    nvlink_peers=g.nvlink_peers,
                    mig_instances=migs,
                )
            )
        return out

    def processes(self) -> list[GpuProcessFacts]:
        out = list(self._declared_facts())
        by_uuid = {g.uuid: (g.index, None) for g in self.scenario.gpus} | {
            m.uuid: (g.index, m.uuid) for g in self.scenario.gpus for m in g.mig_instances
        }
        for alloc in self.registry.allocations():
            if alloc.freeing:  # gone from the driver's list, not yet from its memory
                continue
            for uuid, nbytes in sorted(alloc.gpus.items()):
                if uuid in by_uuid:
                    index, mig = by_uuid[uuid]
                    out.append(
                        GpuProcessFacts(
                            pid=alloc.pid,
                            gpu_index=index,
                            memory=nbytes,
                            kinds=("compute", "mps") if alloc.mps else ("compute",),
                            mig_uuid=mig,
                        )
                    )
        return out

    def device_files(self) -> dict[str, int | None]:
        dev = self.registry.dev_dir
        files: dict[str, int | None] = {
            str(dev / f"nvidia{g.index}"): g.index for g in self.scenario.gpus
        }
        files[str(dev / "nvidiactl")] = None
        files[str(dev / "nvidia-uvm")] = None
        return files

    def process_source(self) -> SimProcesses:
        return SimProcesses(self.scenario, self._loaded_at, self._reaped, self._kept)

    def driver_version(self) -> str | None:
        return self.scenario.driver_version

    def _gpu(self, index: int) -> str:
        for g in self.scenario.gpus:
            if g.index == index:
                return g.uuid
        raise UsageError(
            f"no GPU with index {index} (this machine has "
            f"{', '.join(str(g.index) for g in self.scenario.gpus)})"
        )

    def set_compute_mode(self, index: int, mode: str) -> None:
        if mode not in COMPUTE_MODES:
            raise UsageError(f"unknown compute mode {mode!r}")
        self.registry.update_settings(self._gpu(index), compute_mode=mode)

    def set_mps(self, index: int, active: bool) -> None:
        if active and any(g.index == index and g.mig_mode for g in self.scenario.gpus):
            raise UsageError(
                f"GPU {index} is in MIG mode: gpuwarden runs no MPS server on a MIG GPU"
            )
        self.registry.update_settings(self._gpu(index), mps=active)

    def close(self) -> None:
        pass
