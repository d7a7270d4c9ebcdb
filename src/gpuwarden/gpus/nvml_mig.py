"""A GPU in MIG mode as NVML shows it: its MIG devices (the handle, GPU and compute
instance ids and MIG- UUID of each) and their memory, named by profile. The queries go
through the backend's guard (``NvmlBackend._field``, passed in as ``field``: unsupported
is None, an error a warning), and a driver or pynvml without MIG sees such a GPU as it
sees any other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwarden.gpus.model import MigInstanceFacts

Guard = Callable[..., Any]  # (GPU index, what, query, *args) -> its answer, or None


def mig_handles(nv: Any, field: Guard, i: int, h: Any) -> list[tuple[Any, int, int, str]]:
    """(handle, GPU instance id, compute instance id, MIG- UUID) of each MIG device
    of a GPU in MIG mode; [] with MIG off, or where the driver or pynvml has no
    MIG support, so such a GPU is seen exactly as before."""
    needed = (
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
    )
    if not all(hasattr(nv, n) for n in needed):
        return []
    mode = field(i, "mig mode", nv.nvmlDeviceGetMigMode, h)
    if mode is None or int(mode[0]) != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
    count = field(i, "mig device count", nv.nvmlDeviceGetMaxMigDeviceCount, h)
    out: list[tuple[Any, int, int, str]] = []
    for k in range(int(count or 0)):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except nv.NVMLError:
            continue  # NOT_FOUND: no instance in this slot
        gi = field(i, "mig gpu instance id", nv.nvmlDeviceGetGpuInstanceId, mh)
        ci = field(i, "mig compute instance id", nv.nvmlDeviceGetComputeInstanceId, mh)
        uuid = field(i, "mig uuid", nv.nvmlDeviceGetUUID, mh)
        if gi is None or ci is None or uuid is None:
            continue
        text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        out.append((mh, int(gi), int(ci), text))
    return out


def mig_instances(nv: Any, field: Guard, i: int, h: Any) -> tuple[MigInstanceFacts, ...]:
    """The GPU's MIG instances with their own memory, each named by its profile
    (the MIG device's name ends with it: "NVIDIA A100-SXM4-80GB MIG 3g.40gb")."""
    out: list[MigInstanceFacts] = []
    for mh, gi, ci, uuid in mig_handles(nv, field, i, h):
        m = field(i, "mig memory", nv.nvmlDeviceGetMemoryInfo, mh)
        if m is None:
            continue
        name = field(i, "mig name", nv.nvmlDeviceGetName, mh)
        text = (name.decode() if isinstance(name, bytes) else str(name or "")).strip()
        profile = text.rsplit("MIG ", 1)[1] if "MIG " in text else "?"
        out.append(
            MigInstanceFacts(
                gpu_index=i,
                gi_id=gi,
                ci_id=ci,
                profile=profile,
                uuid=uuid,
                memory_total=int(m.total),
                memory_used=int(m.used),
                memory_free=int(m.free),
            )
        )
    return tuple(sorted(out, key=lambda x: x.gi_id))
