"""A fake NVML driver library under the real nvidia-ml-py, so NvmlBackend runs without a GPU.

pynvml is a thin ctypes layer: each call looks its C function up by name in the loaded
library (``pynvml.nvmlLib``), hands it ctypes buffers and turns a non-zero return code
into the NVMLError subclass of that code. The fake replaces only that library. The real
pynvml wrappers still build the structs, size the process lists in two calls, turn
``NVML_VALUE_NOT_AVAILABLE`` memory into None, map codes to exceptions, and make a
symbol an old driver lacks FunctionNotFound (NVMLLibraryMismatchError for the
unversioned process lists): the backend meets what it meets on a machine.

A machine is a list of ``FakeGpu``; each answers its C functions from its fields, with
``errors`` naming the return code of any function it does not answer (NOT_SUPPORTED on
a board without the feature, NO_PERMISSION for a user who is not root), and ``lost``
answering GPU_IS_LOST to everything, as the driver does once a GPU fell off the bus.
tests/fake_nvml_machines.py holds the machines the tests use."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pynvml

SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
NOT_AVAILABLE_U64 = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG


@dataclass
class FakeProcess:
    """A process on one of a device's process lists."""

    pid: int
    used_memory: int | None  # None: the driver answers NVML_VALUE_NOT_AVAILABLE
    name: bytes = b"python"
    sm_util: int | None = None  # its last process-utilisation sample, if any
    gpu_instance: int = NO_INSTANCE
    compute_instance: int = NO_INSTANCE


@dataclass
class FakeMigDevice:
    """One MIG device (GPU instance + compute instance) of a GPU in MIG mode."""

    gpu_instance: int
    compute_instance: int
    uuid: str
    name: str  # NVML's name for it, ending with the profile: "... MIG 3g.40gb"
    total: int
    used: int
    compute: list[FakeProcess] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """One GPU as the driver answers for it. Memory in bytes; ``used`` excludes
    ``reserved`` as the v2 memory query does (v1 folds reserved into used)."""

    uuid: str
    name: str
    bus_id: str
    minor: int
    total: int
    used: int = 0
    reserved: int = 0
    utilization: tuple[int, int] = (0, 0)  # gpu %, memory %
    temperature: int = 35
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    persistence: int = pynvml.NVML_FEATURE_ENABLED
    mig_mode: int = pynvml.NVML_DEVICE_MIG_DISABLE
    mig_slots: int = 0  # nvmlDeviceGetMaxMigDeviceCount
    mig_devices: dict[int, FakeMigDevice] = field(default_factory=dict)  # slot -> device
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, uncorr, pending, fail
    retired_pages: tuple[list[int], list[int]] = ([], [])  # per cause: single, double bit
    retired_pending: int = pynvml.NVML_FEATURE_DISABLED
    numa_node: int = -1
    cpu_mask: list[int] = field(default_factory=list)  # affinity words, CPU 0 = bit 0
    nvlinks: list[str] = field(default_factory=list)  # per active link: remote bus id
    nvlink_remote_type: int = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU  # what its links reach
    compute: list[FakeProcess] = field(default_factory=list)
    graphics: list[FakeProcess] = field(default_factory=list)
    mps: list[FakeProcess] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # C symbol -> return code
    lost: bool = False


def _value(arg: Any) -> int:
    """An argument pynvml passes as c_uint(...) or as a plain int."""
    return int(getattr(arg, "value", arg))


def _target(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)``."""
    return ref._obj


def _write_handle(ref: Any, token: int) -> None:
    ctypes.c_void_p.from_address(ctypes.addressof(_target(ref))).value = token


def _token(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _device_call(fn: Callable[..., int | None]) -> Callable[..., int]:
    """A C function whose first argument is a device handle: resolve it, answer
    GPU_IS_LOST for a lost GPU (its MIG devices with it) and the code ``errors`` names
    for this symbol, else run the body; a body returning None succeeded."""

    @functools.wraps(fn)
    def call(self: FakeNvmlLibrary, handle: Any, *args: Any) -> int:
        entry = self.devices.get(_token(handle))
        if entry is None:
            return INVALID_ARGUMENT
        gpu, device = entry
        if gpu.lost:
            return GPU_IS_LOST
        code = device.errors.get(fn.__name__, SUCCESS)
        if code != SUCCESS:
            return code
        result = fn(self, device, *args)
        return SUCCESS if result is None else result

    return call


def _fill_processes(procs: list[FakeProcess], count_ref: Any, array: Any) -> int:
    """The two-call protocol of NVML's process lists: without a buffer, the count and
    INSUFFICIENT_SIZE (SUCCESS when empty); with one large enough, the entries."""
    count = _target(count_ref)
    if array is None or count.value < len(procs):
        count.value = len(procs)
        return INSUFFICIENT_SIZE if procs else SUCCESS
    for k, p in enumerate(procs):
        array[k].pid = p.pid
        array[k].usedGpuMemory = NOT_AVAILABLE_U64 if p.used_memory is None else p.used_memory
        array[k].gpuInstanceId = p.gpu_instance
        array[k].computeInstanceId = p.compute_instance
    count.value = len(procs)
    return SUCCESS


def _write_field(attribute: str) -> Callable[..., None]:
    def body(dev: FakeGpu, *args: Any) -> None:
        _target(args[-1]).value = getattr(dev, attribute)

    return body


def _list(kind: str) -> Callable[..., int]:
    def body(dev: FakeGpu | FakeMigDevice, count_ref: Any, array: Any) -> int:
        return _fill_processes(getattr(dev, kind, []), count_ref, array)  # MIG: compute only

    return body


def _named(symbol: str, body: Callable[..., int | None]) -> Callable[..., int]:
    def call(library: FakeNvmlLibrary, dev: Any, *args: Any) -> int | None:
        return body(dev, *args)

    call.__name__ = symbol
    return _device_call(call)


# Device calls made from a table, by C symbol: getters that write one field through
# their last argument, and the process lists (_v3, and the _v2 of older drivers: one struct).
_TABLE_CALLS: dict[str, Callable[..., int]] = {
    symbol: _named(symbol, _write_field(attribute))
    for symbol, attribute in {
        "nvmlDeviceGetPowerUsage": "power_mw",
        "nvmlDeviceGetEnforcedPowerLimit": "power_limit_mw",
        "nvmlDeviceGetComputeMode": "compute_mode",
        "nvmlDeviceGetPersistenceMode": "persistence",
        "nvmlDeviceGetMinorNumber": "minor",
        "nvmlDeviceGetTotalEccErrors": "ecc_uncorrected",
        "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pending",
        "nvmlDeviceGetNumaNodeId": "numa_node",
        "nvmlDeviceGetMaxMigDeviceCount": "mig_slots",
        "nvmlDeviceGetNvLinkRemoteDeviceType": "nvlink_remote_type",
    }.items()
} | {
    f"nvmlDeviceGet{name}RunningProcesses{version}": _named(
        f"nvmlDeviceGet{name}RunningProcesses{version}", _list(kind)
    )
    for name, kind in (("Compute", "compute"), ("Graphics", "graphics"), ("MPSCompute", "mps"))
    for version in ("_v2", "_v3")
}


class FakeNvmlLibrary:
    """Stands where pynvml expects ``CDLL("libnvidia-ml.so.1")``: C functions by name,
    each returning an NVML return code and writing its answers through ctypes."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        driver: str = "550.54.15",
        missing: frozenset[str] = frozenset(),
        init_error: int = SUCCESS,
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.missing = missing  # symbols this driver does not export
        self.init_error = init_error
        self.shutdowns = 0
        # token -> (the GPU, the device the token names: the GPU or one of its MIG devices)
        self.devices: dict[int, tuple[FakeGpu, FakeGpu | FakeMigDevice]] = {}
        for i, gpu in enumerate(gpus):
            self.devices[self._gpu_token(i)] = (gpu, gpu)
            for slot, mig in gpu.mig_devices.items():
                self.devices[self._mig_token(i, slot)] = (gpu, mig)

    @staticmethod
    def _gpu_token(index: int) -> int:
        return 0x1000 * (index + 1)

    @staticmethod
    def _mig_token(index: int, slot: int) -> int:
        return 0x1000 * (index + 1) + slot + 1

    def __getattribute__(self, name: str) -> Any:
        # pynvml turns the AttributeError of a missing symbol into FunctionNotFound.
        if name.startswith("nvml") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        call = _TABLE_CALLS.get(name)
        if call is None or name in self.missing:
            raise AttributeError(name)
        return functools.partial(call, self)

    # -- the library ----------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> int:
        return self.init_error

    def nvmlShutdown(self) -> int:
        self.shutdowns += 1
        return SUCCESS

    def nvmlErrorString(self, code: int) -> bytes:
        return f"NVML error {code}".encode()

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.driver.encode()
        return SUCCESS

    def nvmlSystemGetProcessName(self, pid: Any, buf: Any, size: Any) -> int:
        for gpu in self.gpus:
            for p in (*gpu.compute, *gpu.graphics, *gpu.mps):
                if p.pid == _value(pid):
                    buf.value = p.name
                    return SUCCESS
        return NOT_FOUND

    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> int:
        _target(count_ref).value = len(self.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle_ref: Any) -> int:
        i = _value(index)
        if not 0 <= i < len(self.gpus):
            return INVALID_ARGUMENT
        if self.gpus[i].lost:
            return GPU_IS_LOST
        _write_handle(handle_ref, self._gpu_token(i))
        return SUCCESS

    # -- one device -----------------------------------------------------------

    @_device_call
    def nvmlDeviceGetUUID(self, dev: FakeGpu | FakeMigDevice, buf: Any, size: Any) -> None:
        buf.value = dev.uuid.encode()

    @_device_call
    def nvmlDeviceGetName(self, dev: FakeGpu | FakeMigDevice, buf: Any, size: Any) -> None:
        buf.value = dev.name.encode()

    @_device_call
    def nvmlDeviceGetPciInfo_v3(self, dev: FakeGpu, info_ref: Any) -> None:
        info = _target(info_ref)
        info.busId = info.busIdLegacy = dev.bus_id.encode()

    @_device_call
    def nvmlDeviceGetMemoryInfo(self, dev: FakeGpu | FakeMigDevice, mem_ref: Any) -> None:
        mem = _target(mem_ref)
        used = dev.used + dev.reserved if isinstance(dev, FakeGpu) else dev.used
        mem.total, mem.used, mem.free = dev.total, used, dev.total - used

    @_device_call
    def nvmlDeviceGetMemoryInfo_v2(self, dev: FakeGpu, mem_ref: Any) -> int | None:
        mem = _target(mem_ref)
        if mem.version != pynvml.nvmlMemory_v2:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        mem.total, mem.reserved, mem.used = dev.total, dev.reserved, dev.used
        mem.free = dev.total - dev.reserved - dev.used
        return None

    @_device_call
    def nvmlDeviceGetUtilizationRates(self, dev: FakeGpu, util_ref: Any) -> None:
        util = _target(util_ref)
        util.gpu, util.memory = dev.utilization

    @_device_call
    def nvmlDeviceGetTemperature(self, dev: FakeGpu, sensor: Any, temp_ref: Any) -> int | None:
        if _value(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return NOT_SUPPORTED
        _target(temp_ref).value = dev.temperature
        return None

    @_device_call
    def nvmlDeviceSetComputeMode(self, dev: FakeGpu, mode: Any) -> int | None:
        if not 0 <= _value(mode) < pynvml.NVML_COMPUTEMODE_COUNT:
            return INVALID_ARGUMENT
        dev.compute_mode = _value(mode)
        return None

    @_device_call
    def nvmlDeviceGetRemappedRows(self, dev: FakeGpu, *refs: Any) -> None:
        for ref, value in zip(refs, dev.remapped_rows, strict=True):
            _target(ref).value = value

    @_device_call
    def nvmlDeviceGetRetiredPages(
        self, dev: FakeGpu, cause: Any, count_ref: Any, pages: Any
    ) -> int | None:
        found = dev.retired_pages[_value(cause)]
        count = _target(count_ref)
        if pages is None or count.value < len(found):
            count.value = len(found)
            return INSUFFICIENT_SIZE if found else None
        for k, address in enumerate(found):
            pages[k] = address
        count.value = len(found)
        return None

    @_device_call
    def nvmlDeviceGetCpuAffinity(self, dev: FakeGpu, words: int, mask_ref: Any) -> None:
        mask = _target(mask_ref)
        for k in range(min(words, len(dev.cpu_mask))):
            mask[k] = dev.cpu_mask[k]

    @_device_call
    def nvmlDeviceGetNvLinkState(self, dev: FakeGpu, link: int, active_ref: Any) -> int | None:
        if link >= pynvml.NVML_NVLINK_MAX_LINKS:
            return INVALID_ARGUMENT
        _target(active_ref).value = int(link < len(dev.nvlinks))
        return None

    @_device_call
    def nvmlDeviceGetNvLinkRemotePciInfo_v2(
        self, dev: FakeGpu, link: int, info_ref: Any
    ) -> int | None:
        if link >= len(dev.nvlinks):
            return INVALID_ARGUMENT
        _target(info_ref).busId = dev.nvlinks[link].encode()
        return None

    @_device_call
    def nvmlDeviceGetProcessUtilization(
        self, dev: FakeGpu, samples: Any, count_ref: Any, since_us: Any
    ) -> int:
        # Every sample is taken "now", so each is inside the window the caller asks for.
        sampled = [p for p in (*dev.compute, *dev.graphics) if p.sm_util is not None]
        count = _target(count_ref)
        if not sampled:
            return NOT_FOUND
        if samples is None or count.value < len(sampled):
            count.value = len(sampled)
            return INSUFFICIENT_SIZE
        for k, p in enumerate(sampled):
            samples[k].pid = p.pid
            samples[k].smUtil = p.sm_util or 0
            samples[k].timeStamp = _value(since_us) + 1
        count.value = len(sampled)
        return SUCCESS

    # -- MIG ------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetMigMode(self, dev: FakeGpu, current_ref: Any, pending_ref: Any) -> None:
        _target(current_ref).value = _target(pending_ref).value = dev.mig_mode

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: Any, handle_ref: Any) -> int:
        entry = self.devices.get(_token(handle))
        if entry is None or entry[1] is not entry[0]:
            return INVALID_ARGUMENT
        gpu = entry[0]
        if gpu.lost:
            return GPU_IS_LOST
        if gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return INVALID_ARGUMENT
        if _value(slot) not in gpu.mig_devices:
            return NOT_FOUND
        index = self.gpus.index(gpu)
        _write_handle(handle_ref, self._mig_token(index, _value(slot)))
        return SUCCESS

    @_device_call
    def nvmlDeviceGetGpuInstanceId(self, dev: FakeGpu | FakeMigDevice, id_ref: Any) -> int | None:
        if not isinstance(dev, FakeMigDevice):
            return INVALID_ARGUMENT  # a whole GPU is no MIG device
        _target(id_ref).value = dev.gpu_instance
        return None

    @_device_call
    def nvmlDeviceGetComputeInstanceId(
        self, dev: FakeGpu | FakeMigDevice, id_ref: Any
    ) -> int | None:
        if not isinstance(dev, FakeMigDevice):
            return INVALID_ARGUMENT
        _target(id_ref).value = dev.compute_instance
        return None


@contextmanager
def installed(library: FakeNvmlLibrary) -> Iterator[Any]:
    """pynvml with ``library`` as its loaded NVML for the block: nvmlInit finds it
    loaded instead of opening libnvidia-ml.so.1. pynvml keeps the library, its looked-up
    functions and its init count in module globals, so they are put back after."""
    saved = (pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache, pynvml._nvmlLib_refcount)
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache = {}
    pynvml._nvmlLib_refcount = 0
    try:
        yield pynvml
    finally:
        pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache, pynvml._nvmlLib_refcount = saved
