"""How a command starts on its GPUs: environment, CPU affinity, NUMA memory binding and
the PyTorch memory cap.

``plan_launch`` is pure (the machine's facts come in as a ``Host``), so ``gpuwarden exec``
and the job daemon's launcher start commands the same way and the plan can be tested
without processes; ``apply_affinity`` and ``exec_plan`` are the two small impure steps.

- ``CUDA_VISIBLE_DEVICES`` gets NVML indices, made to mean the same GPUs to CUDA by
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA's default order is fastest-first).
- The cap: ``hooks/sitecustomize.py`` leads PYTHONPATH and, once a program imports torch,
  caps each visible device at GPUWARDEN_MEM_LIMIT bytes when CUDA initialises.
- CPUs: the union of the GPUs' local CPUs, within what the process may use already.
- Memory: ``numactl --membind=N`` when every GPU sits on the same NUMA node N."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.errors import GpuwardenError
from gpuwarden.gpus.model import GpuFacts
from gpuwarden.gpus.topology import format_cpulist, parse_cpulist

HOOK_DIR = Path(__file__).resolve().parent / "hooks"
MEM_LIMIT_ENV = "GPUWARDEN_MEM_LIMIT"  # bytes per GPU; also what the simulated job obeys
MEM_TOTALS_ENV = "GPUWARDEN_MEM_TOTALS"  # bytes per visible GPU, comma-separated


class CommandNotFound(GpuwardenError):
    """The command to run does not exist (as a shell says: 127)."""

    exit_code = 127


class CommandNotExecutable(GpuwardenError):
    """The command exists but cannot be executed (as a shell says: 126)."""

    exit_code = 126


@dataclass(frozen=True)
class Host:
    """What planning needs to know about this machine; ``None`` means unknown."""

    allowed_cpus: frozenset[int] | None
    numactl: str | None  # path of numactl, when installed
    numa_nodes: frozenset[int] | None  # nodes that exist here


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    env: dict[str, str]
    cpus: frozenset[int] | None  # CPU affinity to set; None leaves it alone
    membind: int | None  # NUMA node the argv binds memory to
    notes: tuple[str, ...] = ()  # why a binding was skipped, for people

    def describe(self) -> str:
        gpus = self.env.get("CUDA_VISIBLE_DEVICES", "")
        parts = [f"GPU {gpus}"]
        if MEM_LIMIT_ENV in self.env:
            parts.append(f"cap {self.env[MEM_LIMIT_ENV]} bytes/GPU")
        if self.cpus is not None:
            parts.append(f"CPUs {format_cpulist(self.cpus)}")
        if self.membind is not None:
            parts.append(f"memory on NUMA node {self.membind}")
        return ", ".join(parts)


def probe_host(env: Mapping[str, str] | None = None) -> Host:
    """Gather the host facts ``plan_launch`` needs (CPU mask, numactl, NUMA nodes)."""
    env = os.environ if env is None else env
    allowed: frozenset[int] | None = None
    if hasattr(os, "sched_getaffinity"):
        try:
            allowed = frozenset(os.sched_getaffinity(0))
        except OSError:
            allowed = None
    nodes: frozenset[int] | None = None
    try:
        nodes = frozenset(
            int(name[4:])
            for name in os.listdir("/sys/devices/system/node")
            if name.startswith("node") and name[4:].isdigit()
        )
    except OSError:
        nodes = None
    return Host(
        allowed_cpus=allowed,
        numactl=shutil.which("numactl", path=env.get("PATH")),
        numa_nodes=nodes,
    )


def _python_path(existing: str | None, *, with_hook: bool) -> str | None:
    hook = str(HOOK_DIR)
    rest = [p for p in (existing or "").split(os.pathsep) if p and os.path.abspath(p) != hook]
    parts = [hook, *rest] if with_hook else rest
    return os.pathsep.join(parts) or None


def plan_launch(
    command: Sequence[str],
    gpus: Sequence[GpuFacts],
    *,
    base_env: Mapping[str, str],
    host: Host,
    mem_limit: int | None,
    bind: bool = True,
    cores: frozenset[int] | None = None,
) -> LaunchPlan:
    """Plan running ``command`` on ``gpus`` (in CUDA_VISIBLE_DEVICES order), capped at
    ``mem_limit`` bytes per GPU (None: no cap), bound to their CPUs and NUMA node.
    ``cores``: exactly these CPUs (cores the job holds alone) instead of every local one."""
    if not command:
        raise ValueError("empty command")
    env = dict(base_env)
    # a MIG instance is named by its MIG- UUID (CUDA has no index for it)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        g.uuid if g.uuid.startswith("MIG-") else str(g.index) for g in gpus
    )
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if mem_limit is not None:
        env[MEM_LIMIT_ENV] = str(mem_limit)
        env[MEM_TOTALS_ENV] = ",".join(str(g.memory_total) for g in gpus)
    else:  # a capped parent's settings must not leak into an uncapped child
        env.pop(MEM_LIMIT_ENV, None)
        env.pop(MEM_TOTALS_ENV, None)
    pythonpath = _python_path(env.get("PYTHONPATH"), with_hook=mem_limit is not None)
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = pythonpath

    notes: list[str] = []
    cpus: frozenset[int] | None = None
    membind: int | None = None
    argv = tuple(command)
    if bind and gpus:
        lists = [g.cpus for g in gpus]
        if cores is not None:
            cpus = cores
        elif any(c is None for c in lists):
            notes.append("CPU affinity not set: a GPU's local CPUs are unknown")
        else:
            local = frozenset().union(*(parse_cpulist(c) for c in lists if c is not None))
            usable = local if host.allowed_cpus is None else local & host.allowed_cpus
            if usable:
                cpus = usable
            else:
                notes.append("CPU affinity not set: none of the GPUs' CPUs is allowed here")
        nodes = {g.numa_node for g in gpus}
        node = next(iter(nodes)) if len(nodes) == 1 else None
        if host.numa_nodes is not None and len(host.numa_nodes) <= 1:
            # Nothing to bind to: say so once instead of why each binding was skipped.
            notes.append(
                "one NUMA node here: binding to the GPUs' node changes nothing"
                + ("" if cores is None else "; the job's cores are its own")
            )
        elif node is None:
            notes.append("memory not bound: the GPUs are not on one known NUMA node")
        elif host.numactl is None:
            notes.append("memory not bound: numactl is not installed")
        elif host.numa_nodes is None or node not in host.numa_nodes:
            notes.append(f"memory not bound: NUMA node {node} does not exist here")
        else:
            membind = node
            argv = (host.numactl, f"--membind={node}", "--", *argv)
    return LaunchPlan(argv=argv, env=env, cpus=cpus, membind=membind, notes=tuple(notes))


def resolve_command(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The executable ``command[0]`` names on the PATH it will run with; one-line errors
    (exit 127 / 126, as a shell would) when there is none."""
    if not command:
        raise CommandNotFound("no command given")
    name = command[0]
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is not None:
        return found
    if os.sep in name and os.path.exists(name):
        if os.path.isdir(name):
            raise CommandNotExecutable(f"{name}: is a directory")
        raise CommandNotExecutable(f"{name}: permission denied")
    raise CommandNotFound(f"{name}: command not found")


def launch_problem(
    command: Sequence[str], cwd: str, env: Mapping[str, str]
) -> tuple[int, str] | None:
    """Why ``command`` cannot start in ``cwd`` for the user this process runs as: (exit
    code as a shell's, one line), or None. Checked by ``submit`` as the submitter and by
    the supervisor as the job's user, never as root for another user: root's answer
    would tell that user what exists where they may not look. A relative command path
    is relative to ``cwd``, where the job runs."""
    try:
        is_dir = stat.S_ISDIR(os.stat(cwd).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return 127, f"working directory not found: {cwd}"
    except OSError as e:  # EACCES: the same answer whether it exists or not
        return 126, f"working directory not usable: {cwd}: {e.strerror or e}"
    if not is_dir:
        return 126, f"working directory is not a directory: {cwd}"
    if not os.access(cwd, os.X_OK):
        return 126, f"working directory not usable: {cwd}: Permission denied"
    name = command[0] if command else ""
    if os.sep in name and not os.path.isabs(name):
        name = os.path.join(cwd, name)
    try:
        resolve_command([name], env)
    except CommandNotFound:
        return 127, f"command not found: {name}"
    except CommandNotExecutable as e:
        return 126, f"command not executable: {e}"
    return None


def apply_affinity(cpus: frozenset[int] | None) -> str | None:
    """Set this process's CPU affinity (inherited across exec and fork); returns a
    warning instead of raising, since a job runs fine unbound."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        return f"could not set CPU affinity to {format_cpulist(cpus)}: {e.strerror or e}"
    return None


def exec_plan(plan: LaunchPlan) -> None:
    """Replace this process with the planned command: same pid, so its exit code is the
    command's and leases taken for this pid follow it. Returns only by raising."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(plan.argv[0], list(plan.argv), plan.env)
    except FileNotFoundError:
        raise CommandNotFound(f"{plan.argv[0]}: command not found") from None
    except OSError as e:
        raise CommandNotExecutable(f"{plan.argv[0]}: {e.strerror or e}") from None
