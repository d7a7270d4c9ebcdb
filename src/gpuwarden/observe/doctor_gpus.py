"""Doctor's rules about the GPUs themselves: how each is shared (Default compute mode, MPS,
MIG) and whether it is healthy (persistence mode, ECC errors, retired pages). Each rule
is a pure function of the doctor's Inputs; the registry that runs them is doctor.py."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwarden.mps.state import MpsDaemon, MpsState
from gpuwarden.observe.doctor_findings import CRITICAL, INFO, WARNING, Finding, Inputs, percent
from gpuwarden.observe.snapshot import ORPHAN, RUNNING, GpuView, ProcessView, Snapshot
from gpuwarden.units import GiB, format_bytes

NEARLY_FULL = 0.05  # free below this share of total: the next allocation may OOM
RETIRED_PAGES_MANY = 60  # NVIDIA's RMA guidance starts around this many retired pages


def _live(p: ProcessView) -> bool:
    """Still running code on the GPU (an orphan does; a zombie or a dead pid does not)."""
    return p.state in (RUNNING, ORPHAN)


def _users(g: GpuView) -> dict[str, int]:
    """Memory per user of the live processes on a GPU."""
    out: dict[str, int] = {}
    for p in g.processes:
        if p.user and _live(p):
            out[p.user] = out.get(p.user, 0) + (p.memory or 0)
    return out


def _nearly_full(g: GpuView) -> bool:
    f = g.facts
    return f.memory_total > 0 and f.memory_free < NEARLY_FULL * f.memory_total


def _free_text(g: GpuView) -> str:
    f = g.facts
    return (
        f"{format_bytes(f.memory_free)} of {format_bytes(f.memory_total)} free "
        f"({percent(f.memory_free, f.memory_total)})"
    )


def _idle_gpus(snap: Snapshot, but: int) -> list[int]:
    return [g.index for g in snap.gpus if g.index != but and not g.processes]


def _held_to_a_budget(p: ProcessView) -> bool:
    """In a gpuwarden job (the daemon holds it to its budget), or a PyTorch process that
    ``gpuwarden exec --mem`` started (its allocator capped: what this rule's fix
    suggests). An environment another user's doctor cannot read says neither."""
    if p.job is not None:
        return True
    env = p.info.env or {}
    return bool(env.get("GPUWARDEN_MEM_LIMIT")) and p.info.uses_torch is True


def _uncapped(g: GpuView) -> bool:
    """Some live process on the GPU is held to no budget."""
    return any(_live(p) and not _held_to_a_budget(p) for p in g.processes)


def shared_default_mode(inp: Inputs) -> Iterator[Finding]:
    """Default mode lets every user's job believe it owns the GPU: two jobs, one OOM.
    gpuwarden's jobs are held to their budgets, so users whose processes are all in its
    jobs share a GPU safely: the daemon packs them so (sched/placement.py)."""
    for g in inp.snapshot.gpus:
        users = _users(g)
        if (
            g.facts.compute_mode != "Default"
            or g.facts.mps
            or len(users) < 2
            or g.facts.mig_instances  # MIG isolates its instances: see mig_instances
            or not _uncapped(g)
        ):
            continue
        full = _nearly_full(g)
        who = ", ".join(f"{u} {format_bytes(m)}" for u, m in sorted(users.items()))
        risk = (
            "nearly full: the next allocation of any of them fails with CUDA OOM"
            if full
            else "each job assumes the whole GPU, so together they run out of memory"
        )
        idle = _idle_gpus(inp.snapshot, g.index)
        hint = f" (idle now: GPU {', '.join(map(str, idle))})" if idle else ""
        yield Finding(
            rule="shared_default_mode",
            severity=CRITICAL if full else WARNING,
            gpu=g.index,
            pid=None,
            evidence=(
                f"GPU {g.index} is in Default compute mode and runs processes of "
                f"{len(users)} users ({who}); {_free_text(g)}; {risk}"
            ),
            remedy=(
                f"nvidia-smi -i {g.index} -c EXCLUSIVE_PROCESS\n"
                f"or give each user its own GPU{hint}:\n"
                "gpuwarden exec --mem SIZE -- CMD  or  CUDA_VISIBLE_DEVICES=N CMD"
            ),
        )


def persistence_off(inp: Inputs) -> Iterator[Finding]:
    """Without persistence the driver unloads between jobs: slow starts, lost settings."""
    for g in inp.snapshot.gpus:
        if g.facts.persistence_mode is False:
            yield Finding(
                rule="persistence_off",
                severity=WARNING,
                gpu=g.index,
                pid=None,
                evidence=(
                    f"GPU {g.index} has persistence mode off: the driver tears the GPU "
                    "down whenever its last client exits, so each job pays seconds of "
                    "init and settings such as the compute mode can be lost"
                ),
                remedy=(
                    f"nvidia-smi -i {g.index} -pm 1\n"
                    "or for every GPU at boot: systemctl enable --now nvidia-persistenced"
                ),
            )


def _server_user(mps: MpsState | None) -> str:
    if mps is None:
        return ""
    users = sorted({d.user for d in mps.servers if d.user})
    if not users:
        return ""
    return (
        f"; the MPS server runs as {', '.join(users)}, so other users' new clients "
        "wait until it exits"
    )


def mps_shared_users(inp: Inputs) -> Iterator[Finding]:
    """MPS shares compute, not memory: one client's fault or OOM takes the others down."""
    for g in inp.snapshot.gpus:
        users = _users(g)
        if not g.facts.mps or len(users) < 2:
            continue
        full = _nearly_full(g)
        who = ", ".join(f"{u} {format_bytes(m)}" for u, m in sorted(users.items()))
        yield Finding(
            rule="mps_shared_users",
            severity=CRITICAL if full else WARNING,
            gpu=g.index,
            pid=None,
            evidence=(
                f"GPU {g.index} is served by MPS and used by {len(users)} users ({who}); "
                f"{_free_text(g)}; MPS gives no memory isolation, and a client that "
                f"faults takes every other client down{_server_user(inp.mps)}"
            ),
            remedy=(
                "give each user its own GPU:\n"
                "gpuwarden exec --mem SIZE -- CMD  or  CUDA_VISIBLE_DEVICES=N CMD\n"
                "or stop MPS: echo quit | nvidia-cuda-mps-control\n"
                f"(memory isolation on one GPU needs MIG: nvidia-smi -i {g.index} -mig 1)"
            ),
        )


def _daemon_gpus(d: MpsDaemon, snap: Snapshot) -> list[int]:
    """Machine indices of the GPUs a control daemon serves (it is started with
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so its ordinals follow CUDA_VISIBLE_DEVICES)."""
    v = (d.visible_devices or "").strip()
    if not v:
        return [g.index for g in snap.gpus]
    parts = [x.strip() for x in v.split(",")]
    return [int(x) for x in parts] if all(x.isdigit() for x in parts) else []


def _limit_hint(gpus: list[int], snap: Snapshot) -> str:
    """A starting limit: an even share of the smallest GPU among the users on them."""
    views = [g for g in snap.gpus if g.index in gpus]
    if not views:
        return "16G"
    users = max(2, max(len(_users(g)) for g in views))
    gib = min(g.facts.memory_total for g in views) // users // GiB
    return f"{gib}G" if gib >= 1 else "16G"


def mps_no_memory_limit(inp: Inputs) -> Iterator[Finding]:
    """An MPS daemon without a pinned-memory limit lets one client take the whole GPU.
    A daemon whose environment was unreadable (pipe_dir None) is unknown, not unlimited."""
    if inp.mps is None:
        return
    for d in inp.mps.controls:
        if d.pipe_dir is None or (d.pinned_mem_limit and d.pinned_mem_limit.strip()):
            continue
        pipe = f"CUDA_MPS_PIPE_DIRECTORY={d.pipe_dir} "
        gpus = _daemon_gpus(d, inp.snapshot)
        size = _limit_hint(gpus, inp.snapshot)
        ordinals = list(range(len(gpus))) or [0]
        where = f" for GPU {', '.join(map(str, gpus))}" if gpus else ""
        by = f", user {d.user}" if d.user else ""
        ctl = f"{pipe}nvidia-cuda-mps-control"
        if len(ordinals) == 1:
            live = f"echo set_default_device_pinned_mem_limit 0 {size} | {ctl}"
        else:
            live = (
                f"for d in {' '.join(map(str, ordinals))}; do echo "
                f"set_default_device_pinned_mem_limit $d {size} | {ctl}; done"
            )
        env_limit = ",".join(f"{o}={size}" for o in ordinals)
        yield Finding(
            rule="mps_no_memory_limit",
            severity=WARNING,
            gpu=gpus[0] if len(gpus) == 1 else None,
            pid=d.pid,
            evidence=(
                f"the MPS control daemon (pid {d.pid}{by}){where} runs without "
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: any client may take all of the GPU's "
                "memory and the others fail with CUDA OOM"
            ),
            remedy=(
                f"{live}\n(servers started from now on get the limit; adjust the size)\n"
                f"or restart it limited: echo quit | {ctl}\n"
                f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='{env_limit}' {ctl} -d"
            ),
        )


def ecc_errors(inp: Inputs) -> Iterator[Finding]:
    """Uncorrected ECC errors crash jobs; pending retirements need a reset to take effect."""
    for g in inp.snapshot.gpus:
        f, n = g.facts, g.index
        inspect = f"nvidia-smi -i {n} -q -d ECC,PAGE_RETIREMENT"
        if f.ecc_uncorrected:
            yield Finding(
                rule="ecc_uncorrected",
                severity=CRITICAL,
                gpu=n,
                pid=None,
                evidence=(
                    f"GPU {n} has {f.ecc_uncorrected} volatile uncorrected ECC "
                    "error(s): data on it was corrupted and its CUDA jobs may crash"
                ),
                remedy=(
                    f"drain it (no new jobs; running ones finish): gpuwarden gpu drain {n} "
                    "--reason 'ECC errors'\n"
                    f"then reset it (or reboot): nvidia-smi -i {n} -r\n"
                    f"inspect: {inspect}\nif errors recur, replace the GPU; then "
                    f"gpuwarden gpu undrain {n}"
                ),
            )
        if f.retired_pages_pending:
            yield Finding(
                rule="retired_pages_pending",
                severity=CRITICAL,
                gpu=n,
                pid=None,
                evidence=(
                    f"GPU {n} has memory pages waiting to be retired: the bad pages stay "
                    "in use until the GPU is reset"
                ),
                remedy=(
                    f"drain GPU {n}, then reset it (or reboot): nvidia-smi -i {n} -r\n"
                    f"check: {inspect}"
                ),
            )
        if f.retired_pages:
            many = f.retired_pages >= RETIRED_PAGES_MANY
            yield Finding(
                rule="retired_pages",
                severity=WARNING if many else INFO,
                gpu=n,
                pid=None,
                evidence=(
                    f"GPU {n} has retired {f.retired_pages} memory page(s)"
                    + (
                        ": that many suggests the memory is failing"
                        if many
                        else ": ECC caught errors before; harmless while it stays low"
                    )
                ),
                remedy=(
                    f"watch it: {inspect}"
                    + ("\nask the vendor about replacing the GPU (RMA)" if many else "")
                ),
            )


def _mig_commands(n: int) -> str:
    """The ``nvidia-smi mig`` commands that change a GPU's instances: gpuwarden runs
    none of them (an admin does, on an idle GPU)."""
    return (
        f"list: nvidia-smi mig -i {n} -lgi  (profiles it offers: nvidia-smi mig -i {n} "
        "-lgip)\n"
        f"create (as root, in free slices): nvidia-smi mig -i {n} -cgi PROFILE -C\n"
        f"destroy (as root, instance idle): nvidia-smi mig -i {n} -dci -gi GI && "
        f"nvidia-smi mig -i {n} -dgi -gi GI\n"
        "(gpuwarden creates and destroys no instances)"
    )


def mig_instances(inp: Inputs) -> Iterator[Finding]:
    """A GPU in MIG mode runs CUDA work only in its instances: say which there are, which
    is nearly full, and how an admin changes them."""
    for g in inp.snapshot.gpus:
        f, n = g.facts, g.index
        if not f.mig_mode:
            continue
        if not f.mig_instances:
            yield Finding(
                rule="mig_no_instances",
                severity=WARNING,
                gpu=n,
                pid=None,
                evidence=(
                    f"GPU {n} is in MIG mode but has no MIG instances: no CUDA work can run on it"
                ),
                remedy=(
                    _mig_commands(n) + "\nor leave MIG mode (as root, GPU idle): "
                    f"nvidia-smi -i {n} -mig 0"
                ),
            )
            continue
        listed = ", ".join(
            f"{n}/{m.gi_id} {m.profile} {m.uuid} ({format_bytes(m.memory_free)} free)"
            for m in f.mig_instances
        )
        yield Finding(
            rule="mig_instances",
            severity=INFO,
            gpu=n,
            pid=None,
            evidence=(
                f"GPU {n} is in MIG mode with {len(f.mig_instances)} instance(s): "
                f"{listed}; each is a device of its own (CUDA_VISIBLE_DEVICES=MIG-...)"
            ),
            remedy=(
                "place a job on one: gpuwarden exec --mem SIZE --mig PROFILE -- CMD\n"
                + _mig_commands(n)
            ),
        )
        for m in f.mig_instances:
            procs = [p for p in g.processes if p.gpu.mig_uuid == m.uuid]
            users = _users(GpuView(g.facts, tuple(procs)))
            if len(users) >= 2:
                who = ", ".join(f"{u} {format_bytes(b)}" for u, b in sorted(users.items()))
                yield Finding(
                    rule="mig_shared_users",
                    severity=WARNING,
                    gpu=n,
                    pid=None,
                    evidence=(
                        f"MIG instance {n}/{m.gi_id} ({m.profile}) runs processes of "
                        f"{len(users)} users ({who}): they share its memory, without "
                        "the isolation MIG gives between instances"
                    ),
                    remedy=(
                        "give each user an instance of their own:\n"
                        "gpuwarden exec --mem SIZE --mig PROFILE -- CMD"
                    ),
                )
            if m.memory_total <= 0 or m.memory_free >= NEARLY_FULL * m.memory_total:
                continue
            pids = [p.pid for p in procs]
            yield Finding(
                rule="mig_instance_full",
                severity=WARNING,
                gpu=n,
                pid=None,
                evidence=(
                    f"MIG instance {n}/{m.gi_id} ({m.profile}, {m.uuid}) has "
                    f"{format_bytes(m.memory_free)} of {format_bytes(m.memory_total)} "
                    f"free ({percent(m.memory_free, m.memory_total)}); processes: "
                    f"{', '.join(map(str, pids)) or 'none listed'}: the next "
                    "allocation there fails with CUDA OOM"
                ),
                remedy=(
                    "move work to an instance with room: gpuwarden select --mem SIZE\n"
                    "or, as root with the instance idle, replace it by a bigger one:\n"
                    f"nvidia-smi mig -i {n} -dci -gi {m.gi_id} && "
                    f"nvidia-smi mig -i {n} -dgi -gi {m.gi_id} && "
                    f"nvidia-smi mig -i {n} -cgi PROFILE -C"
                ),
            )
