"""Scenario files: the JSON that declares a simulated machine (see docs/scenarios.md)."""

from __future__ import annotations

import json
import math
import os
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpuwarden.errors import BackendUnavailable
from gpuwarden.gpus.model import COMPUTE_MODES, MIG_PROFILE
from gpuwarden.gpus.topology import parse_cpulist
from gpuwarden.units import parse_size

PROCESS_STATES = ("running", "dead", "other_namespace", "garbage", "zombie", "orphan")
PROCESS_KINDS = ("compute", "graphics", "mps")
MAX_PID = 2**32 - 1  # NVML's pid field is 32 bits
T = TypeVar("T")
_MODE_ALIASES = {m.lower(): m for m in COMPUTE_MODES} | {
    "exclusive": "Exclusive_Process",
    "exclusive_process": "Exclusive_Process",
    "exclusive-process": "Exclusive_Process",
}


@dataclass(frozen=True)
class SimMig:
    """A MIG GPU instance (with one compute instance) of a GPU in MIG mode."""

    gi_id: int
    ci_id: int
    profile: str  # e.g. "3g.40gb"
    uuid: str  # "MIG-..."
    memory_total: int


@dataclass(frozen=True)
class SimGpu:
    index: int
    uuid: str
    name: str
    memory_total: int
    numa_node: int | None
    cpus: str | None
    compute_mode: str
    persistence_mode: bool
    mps: bool
    unaccounted_memory: int
    utilization: int
    temperature: int | None
    power_watts: float | None
    power_limit_watts: float | None
    mig_mode: bool
    driver_baseline: int
    pci_bus_id: str
    ecc_uncorrected: int | None
    retired_pages: int | None
    retired_pages_pending: bool | None
    nvlink_peers: tuple[int, ...]
    context_memory: int = 512 << 20  # what each process's CUDA context takes here
    mig_instances: tuple[SimMig, ...] = ()


@dataclass(frozen=True)
class SimProcess:
    pid: int
    gpu: int
    user: str
    command: str
    memory: int
    state: str = "running"
    container: str | None = None
    ppid: int | None = None
    uid: int | None = None
    started_ago: float = 3600.0
    cpus_allowed: str | None = None
    env: dict[str, str] | None = None
    torch: bool | None = None
    sm_utilization: int | None = None
    kinds: tuple[str, ...] = ("compute",)
    rss: int | None = None  # host memory resident, bytes
    cpu_percent: float | None = None  # host CPU it uses, steadily (100: one core)
    mig: int | None = None  # the GPU instance id it runs in, on a GPU in MIG mode


@dataclass(frozen=True)
class SimHolder:
    pid: int
    user: str
    command: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class Scenario:
    path: Path
    gpus: tuple[SimGpu, ...]
    processes: tuple[SimProcess, ...]
    holders: tuple[SimHolder, ...]
    driver_version: str = "sim"
    free_lag: float = 0.2  # seconds the driver takes to free a dead process's memory
    extra: dict[str, Any] = field(default_factory=dict)


class ScenarioError(BackendUnavailable):
    """A scenario file that cannot be read or does not describe a machine."""


def _req(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ScenarioError(f"{where}: missing field {key!r}")
    return obj[key]


def _size(value: Any, where: str) -> int:
    try:
        n = parse_size(value)
    except Exception as e:  # UsageError carries a good message
        raise ScenarioError(f"{where}: {e}") from None
    return n


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(f"{where}: expected true or false, got {value!r}")
    return value


def _int(value: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"at least {lo}" if hi is None else f"{lo}-{hi}"
        raise ScenarioError(f"{where}: must be {span}, got {value}")
    return value


def _number(value: Any, where: str, *, lo: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScenarioError(f"{where}: expected a number, got {value!r}")
    if value < lo:
        raise ScenarioError(f"{where}: must be at least {lo:g}, got {value}")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: expected a string, got {value!r}")
    return value


def _opt(value: Any, parse: Callable[[Any, str], T], where: str) -> T | None:
    """An optional field: null (or absent with a null default) is None."""
    return None if value is None else parse(value, where)


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ScenarioError(f"{where} must be a list, got {value!r}")
    return value


def _count(value: Any, where: str) -> int:
    return _int(value, where, 0)


def _parse_gpu(raw: Any, pos: int) -> SimGpu:
    where = f"gpus[{pos}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    index = _int(raw.get("index", pos), f"{where}.index", 0)
    mode_raw = _str(raw.get("compute_mode", "Default"), f"{where}.compute_mode")
    mode = _MODE_ALIASES.get(mode_raw.lower())
    if mode is None:
        raise ScenarioError(
            f"{where}.compute_mode: {mode_raw!r} is not one of "
            "Default, Exclusive_Process, Prohibited"
        )
    cpus = raw.get("cpus")
    if cpus is not None:
        try:
            parse_cpulist(str(cpus))
        except Exception as e:
            raise ScenarioError(f"{where}.cpus: {e}") from None
    util = _int(raw.get("utilization", 0), f"{where}.utilization")
    if not 0 <= util <= 100:
        raise ScenarioError(f"{where}.utilization: must be 0-100, got {util}")
    total = _size(_req(raw, "memory_total", where), f"{where}.memory_total")
    if total <= 0:
        raise ScenarioError(f"{where}.memory_total: must be positive")
    uuid = _str(
        raw.get("uuid") or f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'sim-{index}')}",
        f"{where}.uuid",
    )
    peers = [
        _int(x, f"{where}.nvlink_peers", 0)
        for x in _list(raw.get("nvlink_peers", []), f"{where}.nvlink_peers")
    ]
    mig_mode = _bool(raw.get("mig_mode", False), f"{where}.mig_mode")
    migs = tuple(
        _parse_mig(m, i, index, f"{where}.mig_instances")
        for i, m in enumerate(_list(raw.get("mig_instances", []), f"{where}.mig_instances"))
    )
    if migs and not mig_mode:
        raise ScenarioError(
            f"{where}.mig_instances: the GPU is not in MIG mode (set mig_mode to true)"
        )
    if len({m.gi_id for m in migs}) != len(migs):
        raise ScenarioError(f"{where}.mig_instances: GPU instance ids must be unique")
    if sum(m.memory_total for m in migs) > total:
        raise ScenarioError(
            f"{where}.mig_instances: the instances' memory exceeds the GPU's memory_total"
        )
    return SimGpu(
        index=index,
        uuid=uuid,
        name=_str(raw.get("name", "Simulated GPU"), f"{where}.name"),
        memory_total=total,
        numa_node=_opt(raw.get("numa_node", 0), _count, f"{where}.numa_node"),
        cpus=None if cpus is None else str(cpus),
        compute_mode=mode,
        persistence_mode=_bool(raw.get("persistence_mode", True), f"{where}.persistence_mode"),
        mps=_bool(raw.get("mps", False), f"{where}.mps"),
        unaccounted_memory=_size(raw.get("unaccounted_memory", 0), f"{where}.unaccounted_memory"),
        utilization=util,
        temperature=_opt(raw.get("temperature", 35), _int, f"{where}.temperature"),
        power_watts=_opt(raw.get("power_watts", 60.0), _number, f"{where}.power_watts"),
        power_limit_watts=_opt(
            raw.get("power_limit_watts", 400.0), _number, f"{where}.power_limit_watts"
        ),
        mig_mode=mig_mode,
        driver_baseline=_size(raw.get("driver_baseline", 0), f"{where}.driver_baseline"),
        pci_bus_id=_str(
            raw.get("pci_bus_id", f"00000000:{0x10 + index:02X}:00.0"), f"{where}.pci_bus_id"
        ),
        ecc_uncorrected=_opt(raw.get("ecc_uncorrected", 0), _count, f"{where}.ecc_uncorrected"),
        retired_pages=_opt(raw.get("retired_pages", 0), _count, f"{where}.retired_pages"),
        retired_pages_pending=_opt(
            raw.get("retired_pages_pending", False), _bool, f"{where}.retired_pages_pending"
        ),
        nvlink_peers=tuple(peers),
        context_memory=_size(raw.get("context_memory", 512 << 20), f"{where}.context_memory"),
        mig_instances=migs,
    )


def _parse_mig(raw: Any, pos: int, gpu: int, where: str) -> SimMig:
    where = f"{where}[{pos}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    profile = _str(_req(raw, "profile", where), f"{where}.profile")
    m = MIG_PROFILE.match(profile)
    if m is None:
        raise ScenarioError(
            f"{where}.profile: {profile!r} is not a MIG profile such as 1g.10gb or 3g.40gb"
        )
    gi = _int(raw.get("gi_id", pos + 1), f"{where}.gi_id", 0)
    total = _size(raw.get("memory_total", int(m.group(2)) * 10**9), f"{where}.memory_total")
    if total <= 0:
        raise ScenarioError(f"{where}.memory_total: must be positive")
    uuid = _str(
        raw.get("uuid") or f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'sim-{gpu}-mig-{gi}')}",
        f"{where}.uuid",
    )
    if not uuid.startswith("MIG-"):
        raise ScenarioError(f"{where}.uuid: a MIG instance's UUID starts with MIG-")
    return SimMig(
        gi_id=gi,
        ci_id=_int(raw.get("ci_id", 0), f"{where}.ci_id", 0),
        profile=profile,
        uuid=uuid,
        memory_total=total,
    )


def _parse_process(raw: Any, pos: int, gpus: dict[int, SimGpu]) -> SimProcess:
    where = f"processes[{pos}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    state = _str(raw.get("state", "running"), f"{where}.state")
    if state not in PROCESS_STATES:
        raise ScenarioError(f"{where}.state: {state!r} is not one of {', '.join(PROCESS_STATES)}")
    # A garbage pid is what a driver/library mismatch reports (0, 2**32 - 1); a real
    # process has a positive one.
    pid = _int(_req(raw, "pid", where), f"{where}.pid", 0 if state == "garbage" else 1, MAX_PID)
    gpu = _int(_req(raw, "gpu", where), f"{where}.gpu")
    if gpu not in gpus:
        raise ScenarioError(f"{where}.gpu: no GPU with index {gpu}")
    mig = _opt(raw.get("mig"), _count, f"{where}.mig")
    instances = [m.gi_id for m in gpus[gpu].mig_instances]
    if mig is None and instances:
        raise ScenarioError(
            f"{where}.mig: GPU {gpu} is in MIG mode: name the GPU "
            f"instance id it runs in ({', '.join(map(str, instances))})"
        )
    if mig is not None and mig not in instances:
        raise ScenarioError(
            f"{where}.mig: GPU {gpu} has no MIG instance with GPU instance id {mig}"
        )
    env = raw.get("env")
    if env is not None and not isinstance(env, dict):
        raise ScenarioError(f"{where}.env: expected an object")
    cpus_allowed = _opt(raw.get("cpus_allowed"), _str, f"{where}.cpus_allowed")
    if cpus_allowed is not None:
        try:
            parse_cpulist(cpus_allowed)
        except Exception as e:
            raise ScenarioError(f"{where}.cpus_allowed: {e}") from None
    kinds = [
        _str(k, f"{where}.kinds") for k in _list(raw.get("kinds", ["compute"]), f"{where}.kinds")
    ]
    bad_kinds = sorted(set(kinds) - set(PROCESS_KINDS))
    if bad_kinds:
        raise ScenarioError(
            f"{where}.kinds: {bad_kinds[0]!r} is not one of {', '.join(PROCESS_KINDS)}"
        )
    sm = _opt(raw.get("sm_utilization"), _int, f"{where}.sm_utilization")
    if sm is not None and not 0 <= sm <= 100:
        raise ScenarioError(f"{where}.sm_utilization: must be 0-100, got {sm}")
    return SimProcess(
        pid=pid,
        gpu=gpu,
        user=_str(raw.get("user", "root"), f"{where}.user"),
        command=_str(raw.get("command", f"process-{pid}"), f"{where}.command"),
        memory=_size(_req(raw, "memory", where), f"{where}.memory"),
        state=state,
        container=_opt(raw.get("container"), _str, f"{where}.container"),
        ppid=_opt(raw.get("ppid"), _count, f"{where}.ppid"),
        uid=_opt(raw.get("uid"), _count, f"{where}.uid"),
        started_ago=_number(raw.get("started_ago", 3600.0), f"{where}.started_ago"),
        cpus_allowed=cpus_allowed,
        env={str(k): str(v) for k, v in env.items()} if env else None,
        torch=_opt(raw.get("torch"), _bool, f"{where}.torch"),
        sm_utilization=sm,
        kinds=tuple(kinds),
        rss=_opt(raw.get("rss"), _size, f"{where}.rss"),
        cpu_percent=_opt(raw.get("cpu_percent"), _number, f"{where}.cpu_percent"),
        mig=mig,
    )


def _parse_holder(raw: Any, pos: int) -> SimHolder:
    where = f"holders[{pos}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected an object")
    devices = _req(raw, "devices", where)
    if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
        raise ScenarioError(f"{where}.devices: expected a non-empty list of device paths")
    return SimHolder(
        pid=_int(_req(raw, "pid", where), f"{where}.pid", 1, MAX_PID),
        user=_str(raw.get("user", "root"), f"{where}.user"),
        command=_str(raw.get("command", "?"), f"{where}.command"),
        devices=tuple(sorted(devices)),
    )


def parse_scenario(data: Any, path: Path) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario is a JSON object with a 'gpus' list")
    raw_gpus = data.get("gpus")
    if not isinstance(raw_gpus, list) or not raw_gpus:
        raise ScenarioError(f"{path}: 'gpus' must be a non-empty list")
    gpus = tuple(_parse_gpu(g, i) for i, g in enumerate(raw_gpus))
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise ScenarioError(f"{path}: GPU indices must be unique")
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise ScenarioError(f"{path}: GPU uuids must be unique")
    migs = [m.uuid for g in gpus for m in g.mig_instances]
    if len(set(migs)) != len(migs):
        raise ScenarioError(f"{path}: MIG instance uuids must be unique")
    procs = tuple(
        _parse_process(p, i, {g.index: g for g in gpus})
        for i, p in enumerate(_list(data.get("processes", []), f"{path}: 'processes'"))
    )
    holders = tuple(
        _parse_holder(h, i)
        for i, h in enumerate(_list(data.get("holders", []), f"{path}: 'holders'"))
    )
    return Scenario(
        path=path,
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        processes=procs,
        holders=holders,
        driver_version=_str(data.get("driver_version", "sim-550.00"), f"{path}: driver_version"),
        free_lag=_lag(data.get("free_lag", 0.2)),
        extra={
            k: v for k, v in data.items() if k not in ("gpus", "processes", "holders", "free_lag")
        },
    )


def _lag(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= 60:
        raise ScenarioError("free_lag: expected seconds from 0 to 60")
    return float(raw)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate a scenario; every problem is one ScenarioError line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"scenario {p} is not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScenarioError(f"scenario {p} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:  # "[" x 100000: the decoder recurses once per level
        raise ScenarioError(f"scenario {p} is nested too deeply") from None
    return parse_scenario(data, p.resolve())
