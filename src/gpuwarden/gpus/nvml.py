"""The real backend: facts from NVML through nvidia-ml-py (``pynvml``).

pynvml is imported only inside ``NvmlBackend.open`` so that importing this module
costs nothing on machines without a driver. Every per-field query goes through one
guard: unsupported fields become None, unexpected failures become None plus a line
in ``warnings``, and a lost GPU is skipped, so one bad GPU never kills a view."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuwarden.errors import BackendUnavailable, GpuwardenError, PermissionDenied, UsageError
from gpuwarden.gpus.model import COMPUTE_MODES, GpuFacts, GpuProcessFacts, MigInstanceFacts
from gpuwarden.gpus.nvlink import nvlink_peers
from gpuwarden.gpus.nvml_mig import mig_handles, mig_instances
from gpuwarden.gpus.nvml_values import compute_mode_name, compute_mode_value, cpu_mask_to_cpulist
from gpuwarden.gpus.topology import node_cpulist, sysfs_local_cpulist, sysfs_numa_node
from gpuwarden.procs.live import LiveProcesses

T = TypeVar("T")

SIM_HINT = "to try gpuwarden without a GPU, set GPUWARDEN_SIM=examples/a100x8-shared.json"

# Device files that belong to no single GPU but still pin the driver when held.
CONTROL_FILES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)

MPS_SERVER = "nvidia-cuda-mps-server"

# NVML_VALUE_NOT_AVAILABLE for unsigned long long fields (usedGpuMemory).
_NOT_AVAILABLE_U64 = 2**64 - 1

# Process-list kinds in the order GpuProcessFacts.kinds lists them, with the
# unversioned pynvml function for each.
_PROCESS_LISTS = (
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"),
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class NvmlBackend:
    """Backend over NVML. Construct with ``open()``; call ``close()`` when done."""

    name = "nvml"

    def __init__(self, nv: Any, clock: Callable[[], float] = time.time) -> None:
        """``nv`` is the initialised pynvml module; ``clock`` gives epoch seconds
        (injected so the utilization window is testable)."""
        self._nv = nv
        self._clock = clock
        self._open = True
        self.warnings: list[str] = []
        # Errors that mean "this GPU/driver does not offer the field": None, silently.
        self._quiet: tuple[type[BaseException], ...] = tuple(
            cls
            for cls in (
                getattr(nv, "NVMLError_NotSupported", None),
                getattr(nv, "NVMLError_NoPermission", None),
                getattr(nv, "NVMLError_NoData", None),
                getattr(nv, "NVMLError_FunctionNotFound", None),
            )
            if cls is not None
        )
        mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()
        self._peer_cache: dict[tuple[str | None, ...], dict[int, tuple[int, ...]]] = {}
        self._handle_cache: dict[int, Any] | None = None

    @classmethod
    def open(cls) -> NvmlBackend:
        """Load and initialise NVML, or raise BackendUnavailable with one line saying
        why and how to try the simulated backend instead."""
        try:
            import pynvml
        except ImportError as e:
            raise BackendUnavailable(
                f"NVML is not available here (nvidia-ml-py is not installed: {_one_line(str(e))}); "
                f"{SIM_HINT}"
            ) from None
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as e:
            reason = _one_line(str(e)) or type(e).__name__
            raise BackendUnavailable(f"NVML is not available here ({reason}); {SIM_HINT}") from None
        return cls(pynvml)

    # -- guards ---------------------------------------------------------------

    def _warn(self, message: str) -> None:
        # Deduplicated so a long-running daemon polling a sick GPU does not grow forever.
        if message not in self.warnings:
            self.warnings.append(message)

    def _field(self, index: int, field: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call one NVML query; unsupported -> None, other NVML errors -> None + warning."""
        try:
            return fn(*args)
        except self._quiet:
            return None
        except self._nv.NVMLError as e:
            self._warn(f"GPU {index}: {field}: {_one_line(str(e))}")
            return None

    def _handles(self) -> dict[int, Any]:
        """Index -> device handle for every GPU whose handle NVML can give. Kept once
        every GPU gave one: a handle stays valid until NVML is shut down, and asking
        costs ~2 ms a GPU, three times a snapshot."""
        if self._handle_cache is not None:
            return self._handle_cache
        nv = self._nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            self._warn(f"device count: {_one_line(str(e))}")
            return {}
        handles: dict[int, Any] = {}
        for i in range(count):
            try:
                handles[i] = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as e:
                self._warn(f"GPU {i}: handle: {_one_line(str(e))}; skipped")
        if len(handles) == count:
            self._handle_cache = handles
        return handles

    def _bus_id(self, index: int, handle: Any) -> str | None:
        info = self._field(index, "pci bus id", self._nv.nvmlDeviceGetPciInfo, handle)
        if info is None:
            return None
        raw = info.busId
        return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)

    # -- GPUs -----------------------------------------------------------------

    def gpus(self) -> list[GpuFacts]:
        """One GpuFacts per reachable GPU, in NVML (PCI bus) order."""
        handles = self._handles()
        bus_ids = {i: self._bus_id(i, h) for i, h in handles.items()}
        peers = self._nvlink_peers(handles, bus_ids)
        out: list[GpuFacts] = []
        for i, h in handles.items():
            facts = self._gpu(i, h, bus_ids[i], peers.get(i, ()))
            if facts is not None:
                out.append(facts)
        return out

    def _memory(self, i: int, h: Any) -> tuple[int, int, int, int | None] | None:
        """(total, used, free, reserved): v2 separates driver-reserved memory from
        used; v1 (older drivers) folds it into used, so reserved is None there."""
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                return int(m.total), int(m.used), int(m.free), int(m.reserved)
            except nv.NVMLError:
                pass  # v2 unsupported by this driver: fall back to v1 below
        m = self._field(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if m is None:
            return None
        return int(m.total), int(m.used), int(m.free), None

    def _gpu(self, i: int, h: Any, bus_id: str | None, peers: tuple[int, ...]) -> GpuFacts | None:
        nv = self._nv
        uuid = self._field(i, "uuid", nv.nvmlDeviceGetUUID, h)
        memory = self._memory(i, h)
        if uuid is None or memory is None:
            # Without identity or memory the GPU cannot be used or accounted: it is
            # most likely lost. Say so and leave it out rather than report zeros.
            self._warn(f"GPU {i}: no uuid or memory information; skipped")
            return None
        total, used, free, reserved = memory
        name = self._field(i, "name", nv.nvmlDeviceGetName, h)

        util = self._field(i, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        temp_fn = getattr(nv, "nvmlDeviceGetTemperature", None)
        temperature = (
            self._field(i, "temperature", temp_fn, h, nv.NVML_TEMPERATURE_GPU)
            if temp_fn is not None
            else None
        )
        power_mw = self._field(i, "power", nv.nvmlDeviceGetPowerUsage, h)
        limit_mw = self._field(i, "power limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        mode = self._field(i, "compute mode", nv.nvmlDeviceGetComputeMode, h)
        persistence = self._field(i, "persistence mode", nv.nvmlDeviceGetPersistenceMode, h)
        mig = self._field(i, "mig mode", nv.nvmlDeviceGetMigMode, h)
        minor = self._field(i, "minor number", nv.nvmlDeviceGetMinorNumber, h)
        ecc = self._field(
            i,
            "ecc uncorrected",
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        retired, pending = self._retired(i, h)

        return GpuFacts(
            index=i,
            uuid=str(uuid),
            name=str(name) if name is not None else "",
            memory_total=total,
            memory_used=used,
            memory_free=free,
            memory_reserved=reserved,
            utilization=int(util.gpu) if util is not None else None,
            memory_utilization=int(util.memory) if util is not None else None,
            temperature=int(temperature) if temperature is not None else None,
            power_watts=int(power_mw) / 1000.0 if power_mw is not None else None,
            power_limit_watts=int(limit_mw) / 1000.0 if limit_mw is not None else None,
            compute_mode=compute_mode_name(int(mode)) if mode is not None else None,
            persistence_mode=(
                int(persistence) == nv.NVML_FEATURE_ENABLED if persistence is not None else None
            ),
            mig_mode=int(mig[0]) == nv.NVML_DEVICE_MIG_ENABLE if mig is not None else None,
            mps=self._mps(i, h),
            numa_node=self._numa_node(i, h, bus_id),
            cpus=self._cpus(i, h, bus_id),
            pci_bus_id=bus_id,
            minor_number=int(minor) if minor is not None else None,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            retired_pages=retired,
            retired_pages_pending=pending,
            nvlink_peers=peers,
            mig_instances=self._mig_instances(i, h) if mig is not None else (),
        )

    def _retired(self, i: int, h: Any) -> tuple[int | None, bool | None]:
        """Retired memory: row remapping on Ampere and later, page retirement before.
        Each API answers NotSupported on the other generation, so try both."""
        nv = self._nv
        remap_fn = getattr(nv, "nvmlDeviceGetRemappedRows", None)
        if remap_fn is not None:
            rows = self._field(i, "remapped rows", remap_fn, h)
            if rows is not None:
                corrected, uncorrected, is_pending, _failure = rows
                return int(corrected) + int(uncorrected), bool(is_pending)
        causes = (
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        count = 0
        for cause in causes:
            pages = self._field(i, "retired pages", nv.nvmlDeviceGetRetiredPages, h, cause)
            if pages is None:
                return None, None
            count += len(pages)
        status = self._field(
            i, "retired pages pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h
        )
        pending = int(status) == nv.NVML_FEATURE_ENABLED if status is not None else None
        return count, pending

    def _mps(self, i: int, h: Any) -> bool | None:
        """True when an MPS server serves this GPU: NVML lists MPS clients, or the
        server itself shows up among compute processes."""
        mps_clients = self._process_list(i, h, "mps", "nvmlDeviceGetMPSComputeRunningProcesses")
        if mps_clients:
            return True
        compute = self._process_list(i, h, "compute", "nvmlDeviceGetComputeRunningProcesses")
        if compute is None and mps_clients is None:
            return None
        return any(self._process_name(int(p.pid)) == MPS_SERVER for p in compute or [])

    def _process_name(self, pid: int) -> str | None:
        nv = self._nv
        try:
            name = nv.nvmlSystemGetProcessName(pid)
        except (nv.NVMLError, UnicodeDecodeError):
            # pynvml decodes the name as UTF-8, and a Linux name may be any bytes.
            name = None
        if not name:
            try:
                with open(f"/proc/{pid}/comm", errors="replace") as f:
                    name = f.read().strip()
            except OSError:
                return None
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        return os.path.basename(text.strip())

    def _numa_node(self, i: int, h: Any, bus_id: str | None) -> int | None:
        nv = self._nv
        node: int | None = None
        fn = getattr(nv, "nvmlDeviceGetNumaNodeId", None)
        if fn is not None:
            value = self._field(i, "numa node", fn, h)
            if value is not None and int(value) >= 0:
                node = int(value)
        sys_node = sysfs_numa_node(bus_id)
        # On coherent systems (Grace Hopper) NVML names the GPU's own memory node,
        # which has no CPUs; the PCI device's sysfs node is the one to pin CPUs to.
        if node is None or (sys_node is not None and node_cpulist(node) is None):
            node = sys_node
        return node

    def _cpus(self, i: int, h: Any, bus_id: str | None) -> str | None:
        """The GPU's NUMA-local CPUs: the PCI device's sysfs ``local_cpulist``, which is
        what NVML's affinity says (tests/gpu/test_nvml_backend.py checks that they agree) at
        a file read's cost, where the NVML call takes ~10 ms a GPU; NVML where sysfs
        does not say."""
        cpus = sysfs_local_cpulist(bus_id)
        if cpus:
            return cpus
        nv = self._nv
        words = max(1, ((os.cpu_count() or 1) + 63) // 64) + 1  # +1: offline CPUs
        mask = self._field(i, "cpu affinity", nv.nvmlDeviceGetCpuAffinity, h, words)
        if mask is not None:
            return cpu_mask_to_cpulist([int(w) for w in mask], 64) or None
        return None

    def _nvlink_peers(
        self, handles: dict[int, Any], bus_ids: dict[int, str | None]
    ) -> dict[int, tuple[int, ...]]:
        """``nvlink_peers``, cached: topology does not change while the driver is loaded."""
        key = tuple(bus_ids.get(i) for i in sorted(handles))
        cached = self._peer_cache.get(key)
        if cached is None:
            cached = self._peer_cache[key] = nvlink_peers(self._nv, handles, bus_ids)
        return cached

    # -- processes ------------------------------------------------------------

    def _process_list(self, i: int, h: Any, kind: str, fn_name: str) -> list[Any] | None:
        """One of NVML's process lists. The unversioned pynvml call needs the newest
        struct (_v3); an older driver lacks it, so fall back to _v2 there."""
        nv = self._nv

        def query(handle: Any) -> list[Any]:
            try:
                return list(getattr(nv, fn_name)(handle))
            except self._mismatch:
                return list(getattr(nv, fn_name + "_v2")(handle))

        return self._field(i, f"{kind} processes", query, h)

    def _sm_utilization(self, i: int, h: Any) -> dict[int, int]:
        """pid -> highest SM utilization sampled over the last second."""
        nv = self._nv
        since_us = int((self._clock() - 1.0) * 1_000_000)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, since_us)
        except self._quiet:
            return {}
        except nv.NVMLError as e:
            # NOT_FOUND: no samples in the window. pynvml also raises NVMLError(SUCCESS)
            # when the first size query returns no samples at all.
            if e.value in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS):
                return {}
            self._warn(f"GPU {i}: process utilization: {_one_line(str(e))}")
            return {}
        out: dict[int, int] = {}
        for s in samples:
            pid, sm = int(s.pid), int(s.smUtil)
            out[pid] = max(sm, out.get(pid, sm))
        return out

    def processes(self) -> list[GpuProcessFacts]:
        """Every process in NVML's compute, graphics and MPS lists, one entry per
        (pid, GPU). Pids are kept as reported, garbage included: classifying an
        impossible pid is the observer's job, hiding it here would lose evidence."""
        out: list[GpuProcessFacts] = []
        for i, h in self._handles().items():
            # In MIG mode each instance has its own list: a process is named with the
            # instance it runs in; the GPU's own list adds only whom no instance lists.
            on_mig: set[int] = set()
            for mh, _gi, _ci, mig_uuid in self._mig_handles(i, h):
                for pid, (mem, kinds) in sorted(self._merged(i, mh).items()):
                    on_mig.add(pid)
                    out.append(
                        GpuProcessFacts(
                            pid=pid, gpu_index=i, memory=mem, kinds=tuple(kinds), mig_uuid=mig_uuid
                        )
                    )
            merged = {pid: v for pid, v in self._merged(i, h).items() if pid not in on_mig}
            if not merged:
                continue
            sm = self._sm_utilization(i, h)
            for pid in sorted(merged):
                mem, kinds = merged[pid]
                out.append(
                    GpuProcessFacts(
                        pid=pid,
                        gpu_index=i,
                        memory=mem,
                        kinds=tuple(kinds),
                        sm_utilization=sm.get(pid),
                    )
                )
        return out

    def _merged(self, i: int, h: Any) -> dict[int, tuple[int | None, list[str]]]:
        """pid -> (memory, kinds) over NVML's process lists of one device handle."""
        merged: dict[int, tuple[int | None, list[str]]] = {}
        for kind, fn_name in _PROCESS_LISTS:
            for p in self._process_list(i, h, kind, fn_name) or []:
                pid = int(p.pid)
                raw = getattr(p, "usedGpuMemory", None)
                mem = None if raw is None or int(raw) >= _NOT_AVAILABLE_U64 else int(raw)
                old_mem, kinds = merged.get(pid, (None, []))
                if kind not in kinds:
                    kinds.append(kind)
                known = [m for m in (old_mem, mem) if m is not None]
                merged[pid] = (max(known) if known else None, kinds)
        return merged

    # -- MIG (gpus/nvml_mig.py) ------------------------------------------------

    def _mig_handles(self, i: int, h: Any) -> list[tuple[Any, int, int, str]]:
        return mig_handles(self._nv, self._field, i, h)

    def _mig_instances(self, i: int, h: Any) -> tuple[MigInstanceFacts, ...]:
        return mig_instances(self._nv, self._field, i, h)

    # -- the rest of the protocol ---------------------------------------------

    def device_files(self) -> dict[str, int | None]:
        """``/dev/nvidiaN`` -> GPU index by minor number, plus the control files."""
        files: dict[str, int | None] = {}
        for i, h in self._handles().items():
            minor = self._field(i, "minor number", self._nv.nvmlDeviceGetMinorNumber, h)
            if minor is not None:
                files[f"/dev/nvidia{int(minor)}"] = i
        for path in CONTROL_FILES:
            files[path] = None
        return files

    def process_source(self) -> LiveProcesses:
        """The real /proc: NVML pids are this machine's pids."""
        return LiveProcesses()

    def driver_version(self) -> str | None:
        nv = self._nv
        try:
            version = nv.nvmlSystemGetDriverVersion()
        except nv.NVMLError as e:
            self._warn(f"driver version: {_one_line(str(e))}")
            return None
        return version.decode() if isinstance(version, bytes) else str(version)

    def set_compute_mode(self, index: int, mode: str) -> None:
        """Set a GPU's compute mode (root only). Bad mode or index is a UsageError."""
        nv = self._nv
        value = compute_mode_value(mode)
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            raise GpuwardenError(f"cannot count GPUs: {_one_line(str(e))}") from None
        if not 0 <= index < count:
            raise UsageError(
                f"no GPU {index}; this machine has GPUs 0-{count - 1}"
                if count
                else f"no GPU {index}; this machine has no GPUs"
            )
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            nv.nvmlDeviceSetComputeMode(handle, value)
        except nv.NVMLError_NoPermission:
            raise PermissionDenied("changing the compute mode needs root") from None
        except nv.NVMLError_NotSupported:
            raise UsageError(
                f"GPU {index} does not support compute mode {COMPUTE_MODES[value]}"
            ) from None
        except nv.NVMLError as e:
            raise GpuwardenError(
                f"GPU {index}: setting compute mode failed: {_one_line(str(e))}"
            ) from None

    def close(self) -> None:
        """Shut NVML down once; later calls do nothing."""
        if not self._open:
            return
        self._open = False
        self._handle_cache = None  # handles die with NVML
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()
