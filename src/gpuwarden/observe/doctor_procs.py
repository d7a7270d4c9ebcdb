"""Doctor's rules about the processes on the GPUs: memory and pids the leak finder
flagged, CPUs far from a process's GPU, PyTorch's allocator left unconfigured, and a
doctor that runs inside a container. Each rule is a pure function of the doctor's
Inputs; the registry that runs them is doctor.py."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwarden.errors import UsageError
from gpuwarden.gpus.topology import format_cpulist, parse_cpulist
from gpuwarden.observe.doctor_findings import INFO, WARNING, Finding, Inputs, percent
from gpuwarden.observe.leaks import Leak
from gpuwarden.observe.snapshot import RUNNING, GpuView, ProcessView, Snapshot
from gpuwarden.units import format_bytes

ALLOC_SHARE = 0.25  # a torch process holding this share of its GPU is worth tuning
NUMA_OUTSIDE = 0.5  # more than this share of allowed CPUs off the GPU's node: mismatch


def _cpus(text: str | None) -> frozenset[int] | None:
    """A GPU's local cpulist as a set; None when unknown or unparsable (never raises)."""
    if not text:
        return None
    try:
        cpus = parse_cpulist(text)
    except UsageError:
        return None
    return cpus or None


def residual_memory(inp: Inputs) -> Iterator[Finding]:
    """Memory in use with no process to blame: a CUDA context the driver never freed."""
    for lk in inp.leaks:
        if lk.kind != "unaccounted" or lk.gpu is None:
            continue
        n = lk.gpu
        yield Finding(
            rule="residual_memory",
            severity=WARNING,
            gpu=n,
            pid=None,
            evidence=lk.evidence,
            remedy=(
                f"gpuwarden reap --gpu {n} --yes\n"
                f"nvidia-smi -i {n} -pm 0 && nvidia-smi -i {n} -pm 1\n"
                "(reap what still holds the GPU, then cycle persistence mode so the "
                "driver drops the dead contexts)"
            ),
        )


def _pid_leak(lk: Leak, snap: Snapshot) -> Finding | None:
    """The per-pid leak kinds: each has its own cause and so its own fix."""
    n, pid = lk.gpu, lk.pid
    if pid is None:
        return None
    if lk.kind == "hidden_holder":
        return Finding(
            "hidden_holder",
            WARNING,
            n,
            pid,
            lk.evidence,
            f"gpuwarden reap --pid {pid} --yes\nor: kill {pid}",
        )
    if lk.kind == "dead_pid":
        cycle = (
            "nvidia-smi -pm 0 && nvidia-smi -pm 1"
            if n is None
            else f"nvidia-smi -i {n} -pm 0 && nvidia-smi -i {n} -pm 1"
        )
        return Finding(
            "dead_pid",
            WARNING,
            n,
            pid,
            lk.evidence,
            f"wait ~30 s for the driver to free the context; if it stays:\n{cycle}",
        )
    if lk.kind == "garbage_pid":
        drv = f" {snap.driver_version}" if snap.driver_version else ""
        return Finding(
            "garbage_pid",
            WARNING,
            n,
            pid,
            lk.evidence + "; its owner cannot be named",
            f"pip install -U nvidia-ml-py\n(bindings that match the driver{drv}; "
            "remove an old `pynvml` package that shadows them)",
        )
    if lk.kind == "other_namespace":
        return Finding(
            "other_namespace",
            INFO,
            n,
            pid,
            lk.evidence,
            "run gpuwarden on the host, or its container with --pid=host:\n"
            "docker run --pid=host ...",
        )
    if lk.kind == "zombie":
        parent = lk.parent
        fix = (
            f"kill -CHLD {parent}  (asks the parent to reap it)\nif it stays: kill {parent}"
            if parent and parent > 1
            else "kill its parent process; init then reaps it"
        )
        return Finding("zombie", WARNING, n, pid, lk.evidence, fix)
    if lk.kind == "orphan":
        return Finding(
            "orphan",
            WARNING,
            n,
            pid,
            lk.evidence,
            f"gpuwarden reap --pid {pid} --yes\nor: kill {pid}",
        )
    return None  # "monitor" holds no GPU: harmless


def leaked_pids(inp: Inputs) -> Iterator[Finding]:
    """Hidden holders and dead, garbage, other-namespace, zombie and orphan pids."""
    for lk in inp.leaks:
        f = _pid_leak(lk, inp.snapshot)
        if f is not None:
            yield f


def numa_mismatch(inp: Inputs) -> Iterator[Finding]:
    """CPU threads on the far socket halve host-device bandwidth (H2D crosses QPI/UPI)."""
    by_pid: dict[int, list[tuple[GpuView, ProcessView]]] = {}
    for g in inp.snapshot.gpus:
        for p in g.processes:
            if p.state == RUNNING and p.info.cpus_allowed:
                by_pid.setdefault(p.pid, []).append((g, p))
    for pid, places in sorted(by_pid.items()):
        # A process on several GPUs is judged against all their local CPUs together.
        local_sets = [_cpus(g.facts.cpus) for g, _ in places]
        if any(s is None for s in local_sets):
            continue
        local = frozenset().union(*(s for s in local_sets if s is not None))
        g, p = places[0]
        allowed = p.info.cpus_allowed or frozenset()
        outside = allowed - local
        if allowed & local and len(outside) <= NUMA_OUTSIDE * len(allowed):
            continue
        gpus = ", ".join(str(gg.index) for gg, _ in places)
        nodes = sorted({gg.facts.numa_node for gg, _ in places if gg.facts.numa_node is not None})
        node_txt = f"NUMA node {', '.join(map(str, nodes))}, " if nodes else ""
        yield Finding(
            rule="numa_mismatch",
            severity=WARNING,
            gpu=g.index,
            pid=pid,
            evidence=(
                f"pid {pid} ({p.describe()}) uses GPU {gpus} ({node_txt}local CPUs "
                f"{format_cpulist(local)}) but may run only on CPUs "
                f"{format_cpulist(allowed)}, {len(outside)} of {len(allowed)} of them off "
                "the GPU's node: host-device copies cross the socket"
            ),
            remedy=(
                f"taskset -a -cp {format_cpulist(local)} {pid}\n"
                "next start: gpuwarden exec --mem SIZE -- CMD (binds to the GPU's node)"
                + (
                    f"\nor: numactl --cpunodebind={nodes[0]} --membind={nodes[0]} CMD"
                    if len(nodes) == 1
                    else ""
                )
            ),
        )


def alloc_conf_unset(inp: Inputs) -> Iterator[Finding]:
    """PyTorch's caching allocator fragments big heaps unless told to use segments."""
    for g in inp.snapshot.gpus:
        total = g.facts.memory_total
        for p in g.processes:
            env = p.info.env
            if (
                p.state != RUNNING
                or p.info.uses_torch is not True
                or env is None
                or "PYTORCH_CUDA_ALLOC_CONF" in env
                or "PYTORCH_ALLOC_CONF" in env
                or p.memory is None
                or total <= 0
                or p.memory < ALLOC_SHARE * total
            ):
                continue
            yield Finding(
                rule="alloc_conf_unset",
                severity=INFO,
                gpu=g.index,
                pid=p.pid,
                evidence=(
                    f"pid {p.pid} ({p.describe()}) is a PyTorch process holding "
                    f"{format_bytes(p.memory)} ({percent(p.memory, total)} of GPU "
                    f"{g.index}) with neither PYTORCH_CUDA_ALLOC_CONF nor "
                    "PYTORCH_ALLOC_CONF set: its caching allocator fragments, and "
                    "reserved-but-unused memory can end in OOM"
                ),
                remedy=(
                    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                    "(in the job's environment, then restart it)"
                ),
            )


def container_namespace(inp: Inputs) -> Iterator[Finding]:
    """From inside a container the driver's pids (host pids) do not match our /proc."""
    if inp.snapshot.in_child_namespace:
        yield Finding(
            rule="container_namespace",
            severity=INFO,
            gpu=None,
            pid=None,
            evidence=(
                "gpuwarden runs in a child PID namespace (a container): the driver "
                "reports host pids, so processes may look dead or foreign"
            ),
            remedy=(
                "run gpuwarden on the host, or start its container with --pid=host:\n"
                "docker run --pid=host ..."
            ),
        )
