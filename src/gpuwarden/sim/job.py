"""A simulated GPU job: ``python -m gpuwarden.sim.job --mem 4G --seconds 3``.

It plays a CUDA program against the simulated backend: opens the device files of the
GPUs that CUDA_VISIBLE_DEVICES gives it, registers the memory it "allocates" on each,
honours the caps gpuwarden sets (GPUWARDEN_MEM_LIMIT, as the PyTorch hook does, and
MPS's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), and dies with PyTorch's CUDA-OOM message when
an allocation exceeds a cap or the GPU's free memory.

As a CUDA program does, it is an MPS client when a control daemon listens in
CUDA_MPS_PIPE_DIRECTORY (the simulated one, sim/mps.py): it then sees that daemon's GPUs
numbered from 0, and the pinned limit (its own, else the daemon's default) caps its
whole use, CUDA context included. With no daemon there, CUDA runs without MPS and the
MPS variables mean nothing."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

import psutil

from gpuwarden.errors import GpuwardenError
from gpuwarden.gpus.model import GpuFacts
from gpuwarden.gpus.sim import SimBackend
from gpuwarden.gpus.visible import devices, visible_gpus
from gpuwarden.hooks.gpuwarden_torch_cap import allowed_bytes, memory_fraction
from gpuwarden.units import GiB, parse_size


def _fmt(n: int) -> str:
    """A size as PyTorch's allocator prints it (format_size in CUDACachingAllocator.cpp)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 2**20:
        return f"{n / 1024:.2f} KiB"
    if n <= GiB:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


def torch_oom(
    *,
    tried: int,
    ordinal: int,
    total: int,
    free: int,
    in_use: int,
    allocated: int,
    cached: int = 0,
    allowed: int | None = None,
) -> str:
    """PyTorch's CUDA-OOM message, word for word (torch 2.x's caching allocator), so the
    daemon parses here what it parses from real jobs. ``allowed``: the memory fraction's
    cap, which PyTorch names only when one is set."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {_fmt(tried)}. "
        f"GPU {ordinal} has a total capacity of {_fmt(total)} of which {_fmt(free)} is "
        f"free. Including non-PyTorch memory, this process has {_fmt(in_use)} memory in "
        "use. "
        + ("" if allowed is None else f"{_fmt(allowed)} allowed; ")
        + f"Of the allocated memory {_fmt(allocated)} is allocated by PyTorch, and "
        f"{_fmt(cached)} is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-"
        "variables)"
    )


def mps_limits(env: Mapping[str, str], visible: int) -> dict[int, int]:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as {visible ordinal: bytes}: '0=1G,1=2G' or '2G'."""
    spec = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").strip()
    if not spec:
        return {}
    out: dict[int, int] = {}
    for part in spec.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[int(k)] = parse_size(v.strip())
        else:
            limit = parse_size(part.strip())
            out.update({i: limit for i in range(visible)})
    return out


@dataclass(frozen=True)
class MpsSession:
    """What the control daemon told this client: the GPUs its server serves (machine
    indices, None: all) and its default limits by device ordinal."""

    devices: str | None
    limits: dict[int, int]
    server: int


def mps_connect(env: Mapping[str, str], pid: int) -> MpsSession | None:
    """Connect to the control daemon of CUDA_MPS_PIPE_DIRECTORY as CUDA does; None when
    none listens there (CUDA then runs without MPS)."""
    from gpuwarden.sim import mps

    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    try:
        reply = json.loads(mps.ask(pipe, f"{mps.HELLO} {pid}"))
        return MpsSession(
            devices=reply["devices"],
            limits={int(k): int(v) for k, v in reply["limits"].items()},
            server=int(reply["server"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def client_gpus(
    gpus: list[GpuFacts], env: Mapping[str, str], session: MpsSession | None
) -> list[GpuFacts]:
    """The GPUs this process sees: an MPS client sees its server's GPUs numbered from 0
    and picks among them by CUDA_VISIBLE_DEVICES; without MPS, CUDA's own rule."""
    if session is None:
        return visible_gpus(gpus, env)
    served = (
        gpus
        if session.devices is None
        else visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": session.devices})
    )
    return visible_gpus(served, env, ordinals=True)


def charge_server(backend: SimBackend, session: MpsSession) -> None:
    """The driver lists the MPS server with its own memory on each GPU it serves, from
    its first client on: registered for it (it has no simulated CUDA of its own)."""
    from gpuwarden.sim.mps import SERVER_MEMORY

    registry = backend.registry
    with registry.locked():
        if (registry.alloc_dir / f"{session.server}.json").exists():
            return
        try:
            start = psutil.Process(session.server).create_time()
        except psutil.Error:
            return
        served = client_gpus(backend.gpus(), {}, session)
        registry.write(
            session.server,
            start,
            {g.uuid: SERVER_MEMORY for g in served},
            leak=False,
            command="nvidia-cuda-mps-server",
        )


class SimOOM(Exception):
    pass


class Job:
    def __init__(
        self,
        backend: SimBackend,
        visible: list[GpuFacts],
        *,
        leak: bool,
        mps: MpsSession | None = None,
    ) -> None:
        self.backend = backend
        self.visible = visible
        self.leak = leak
        self.pid = os.getpid()
        self.start_time = psutil.Process().create_time()
        self.held: dict[str, int] = {}
        self.command = " ".join(
            [os.path.basename(sys.executable), "-m", "gpuwarden.sim.job", *sys.argv[1:]]
        )
        self.caps: dict[int, int] = {}  # the PyTorch cap: what allocations may hold
        torch_cap = os.environ.get("GPUWARDEN_MEM_LIMIT")
        if torch_cap:
            cap = parse_size(torch_cap, bare_bytes=True)  # bytes, as the launcher writes it
            # What torch's allocator may hold at the fraction the hook sets: its rounding
            # too, so that a cap a byte short shows here as it does on a GPU.
            self.caps = {
                i: allowed_bytes(memory_fraction(cap, g.memory_total), g.memory_total)
                for i, g in enumerate(visible)
            }
        # MPS limits the whole client, its CUDA context included: the client's own limit,
        # else the daemon's default. Without an MPS daemon, no MPS limit holds.
        self.mps = mps
        self.mps_caps: dict[int, int] = {}
        if mps is not None:
            self.mps_caps = {i: n for i, n in mps.limits.items() if i < len(visible)}
            self.mps_caps.update(mps_limits(os.environ, len(visible)))
        # The CUDA context each GPU charges a process beside its allocations, once it
        # first allocates there (the real driver's context, per the scenario).
        contexts = {g.uuid: g.context_memory for g in backend.scenario.gpus} | {
            m.uuid: g.context_memory for g in backend.scenario.gpus for m in g.mig_instances
        }
        self.context = {g.uuid: contexts.get(g.uuid, 0) for g in visible}
        self._files: list[IO[bytes]] = []

    def open_devices(self) -> None:
        dev = self.backend.registry.dev_dir
        names = ["nvidiactl", "nvidia-uvm"] + [f"nvidia{g.index}" for g in self.visible]
        self._files = [open(dev / n, "rb") for n in names]  # noqa: SIM115 — held on purpose

    def grow_to(self, per_gpu: int) -> None:
        """Hold ``per_gpu`` bytes on every visible GPU, or raise SimOOM like PyTorch."""
        registry = self.backend.registry
        with registry.locked():
            facts = {g.uuid: g for g in devices(self.backend.gpus())}
            for ordinal, g in enumerate(self.visible):
                have = self.held.get(g.uuid, 0)
                want = per_gpu - have
                if want <= 0:
                    continue
                cap = self.caps.get(ordinal)
                if ordinal in self.mps_caps:  # what MPS leaves allocations beside the context
                    left = max(self.mps_caps[ordinal] - self.context[g.uuid], 0)
                    cap = left if cap is None else min(cap, left)
                free = facts[g.uuid].memory_free
                new_context = 0 if g.uuid in self.held else self.context[g.uuid]
                if (cap is not None and per_gpu > cap) or want + new_context > free:
                    raise SimOOM(
                        torch_oom(
                            tried=want,
                            ordinal=ordinal,
                            total=g.memory_total,
                            free=free,
                            in_use=self.in_use(g.uuid),
                            allocated=have,
                            allowed=cap if cap is not None and per_gpu > cap else None,
                        )
                    )
            for g in self.visible:
                self.held[g.uuid] = max(per_gpu, self.held.get(g.uuid, 0))
            registry.write(
                self.pid,
                self.start_time,
                {u: self.in_use(u) for u in self.held},
                leak=self.leak,
                command=self.command,
                mps=self.mps is not None,
            )

    def in_use(self, uuid: str) -> int:
        """What the driver lists for this process on that GPU (PyTorch's "this process
        has ... memory in use"): its allocations, and its CUDA context where one is
        charged."""
        if uuid not in self.held:
            return 0
        return self.held[uuid] + self.context.get(uuid, 0)

    def report_allocator(self) -> None:
        """As the cap hook does at exit: the allocator's peak per visible device, into
        the file the daemon named (GPUWARDEN_ALLOCATOR_REPORT)."""
        path = os.environ.get("GPUWARDEN_ALLOCATOR_REPORT")
        if not path or not self.held:
            return
        peaks = [self.held.get(g.uuid, 0) for g in self.visible]
        try:
            with open(path, "w") as f:
                f.write(json.dumps({"max_reserved": peaks}) + "\n")
        except OSError:
            pass

    def release(self) -> None:
        """At exit. The driver frees the memory once the process is gone, after its lag
        (sim/registry.py); with no lag the registration is dropped now."""
        self.report_allocator()
        if not self.leak and self.backend.registry.free_lag <= 0:
            self.backend.registry.forget(self.pid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuwarden.sim.job", description=__doc__)
    ap.add_argument("--mem", default="1G", help="memory to hold on each visible GPU")
    ap.add_argument(
        "--grow-to",
        help="then grow to this much per GPU over --grow-seconds, "
        "like a training job whose memory rises",
    )
    ap.add_argument(
        "--grow-seconds",
        type=float,
        help="how long the growth takes (default: 1 s, at most half of --seconds)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=1,
        help="allocations the growth comes in (default 1: a first training "
        "step allocates its activations and optimizer state at once; an OOM "
        "message shows only the allocation that failed)",
    )
    ap.add_argument("--seconds", type=float, default=1.0, help="how long to run")
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument(
        "--leak",
        action="store_true",
        help="the driver keeps this job's memory charged after it dies",
    )
    ap.add_argument(
        "--hold-only",
        action="store_true",
        help="open the device files but allocate nothing the driver lists",
    )
    args = ap.parse_args(argv)

    scenario = os.environ.get("GPUWARDEN_SIM")
    if not scenario:
        print(
            "gpuwarden.sim.job: GPUWARDEN_SIM is not set (it names the scenario file)",
            file=sys.stderr,
        )
        return 2
    try:
        backend = SimBackend.from_file(scenario)
        mem = parse_size(args.mem)
        grow = parse_size(args.grow_to) if args.grow_to else None
        session = mps_connect(os.environ, os.getpid())
        visible = client_gpus(backend.gpus(), os.environ, session)
        job = Job(backend, visible, leak=args.leak, mps=session)
        if session is not None:
            charge_server(backend, session)
    except GpuwardenError as e:
        print(f"gpuwarden.sim.job: {e}", file=sys.stderr)
        return 2
    if not visible:
        print("RuntimeError: CUDA error: no CUDA-capable device is detected", file=sys.stderr)
        return 1

    def on_term(signum: int, _frame: object) -> None:
        job.release()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    job.open_devices()
    deadline = time.monotonic() + args.seconds
    try:
        if not args.hold_only:
            job.grow_to(mem)
        print(f"ready pid={job.pid} gpus={','.join(str(g.index) for g in visible)}", flush=True)
        if grow is not None and not args.hold_only:
            span = (
                args.grow_seconds if args.grow_seconds is not None else min(1.0, args.seconds / 2)
            )
            step_wait = max(span, 0.0) / max(args.steps, 1)
            for i in range(1, args.steps + 1):
                time.sleep(step_wait)
                job.grow_to(mem + (grow - mem) * i // args.steps)
    except SimOOM as e:
        print(str(e), file=sys.stderr, flush=True)
        job.release()
        return 1
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    job.release()
    return int(args.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
