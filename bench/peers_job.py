"""One benchmark job of bench_peers.py: a real torch program that takes GPU memory, keeps
it busy for a fixed wall time and writes what happened to its own result file.

    python3 peers_job.py OUT DECLARED_MIB FINAL_MIB START_FRAC GROW_S SECONDS

The job first runs one small matmul (so cuBLAS's workspace is in the allocator's pool) and
keeps its product, which every later matmul overwrites (a fresh 2 MiB product would need a
new 20 MiB segment once the memory is grown to its cap, an allocation past what the job
takes). It then takes memory in 256 MiB tensors (the last ones a multiple of 20 MiB) until
``torch.cuda.memory_reserved()`` reaches ``START_FRAC`` of FINAL_MIB, grows linearly to
FINAL_MIB over GROW_S seconds, and computes until SECONDS after the process started.
``max_memory_reserved`` never passes FINAL_MIB,
so a job whose FINAL_MIB equals its declaration holds exactly what it declared.

Each attempt claims ``OUT.N.json`` (N = 0, 1, ...; the first free one) at its start and
rewrites it at its end: start, end, status (ok / oom / error / killed; a file still saying
running was killed without warning), torch's peak ``max_memory_reserved``, the largest
figure NVML gave for this process, and for an OOM what the job held and tried to take and
how much the GPU had free. Runs stand-alone: no gpuwarden import.
"""

import contextlib
import json
import os
import re
import signal
import sys
import time

T0 = time.time()
MiB = 1 << 20
STEP = 256 * MiB
# PyTorch's allocator reserves memory for tensors over 1 MiB in 20 MiB pages (kLargeBuffer;
# expandable segments grow by it too): a finer step past the last whole page would
# reserve a page more than the job declared, where its cap stops it.
GRAIN = 20 * MiB


def _claim(out: str) -> str:
    n = 0
    while True:
        path = f"{out}.{n}.json"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            n += 1
            continue
        os.close(fd)
        return path


def _write(path: str, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


class _Nvml:
    """This process's memory as NVML counts it (what the driver charges, context included)."""

    def __init__(self, torch) -> None:
        self.handle = None
        self.nv = None
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.nv = nv
            uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                u = nv.nvmlDeviceGetUUID(h)
                u = u.decode() if isinstance(u, bytes) else u
                if uuid and u.endswith(uuid):
                    self.handle = h
            if self.handle is None and nv.nvmlDeviceGetCount() == 1:
                self.handle = nv.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.nv = None

    def used(self) -> "int | None":
        if self.nv is None or self.handle is None:
            return None
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == os.getpid():
                    return int(p.usedGpuMemory or 0) or None
        except Exception:
            return None
        return None


def _size(text: str) -> "int | None":
    m = re.match(r"([\d.]+)\s*(GiB|MiB|KiB|B)", text)
    if not m:
        return None
    mult = {"GiB": 1 << 30, "MiB": MiB, "KiB": 1 << 10, "B": 1}[m.group(2)]
    return int(float(m.group(1)) * mult)


def main() -> int:
    out, declared, final, start_frac, grow_s, seconds = sys.argv[1:7]
    declared_b, final_b = int(declared) * MiB, int(final) * MiB
    f0, grow, secs = float(start_frac), float(grow_s), float(seconds)
    path = _claim(out)
    rec = {
        "attempt": int(path.rsplit(".", 2)[1]),
        "start": T0,
        "pid": os.getpid(),
        "status": "running",
        "declared_mib": int(declared),
        "final_mib": int(final),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    _write(path, rec)

    def _term(signum, frame):  # a tool's cancel, preemption or watchdog: say so, then go
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    torch = None
    nvml = None
    held: list = []
    try:
        import torch

        a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        b = a @ a  # kept: every later product goes into it, so computing allocates nothing
        torch.cuda.synchronize()
        nvml = _Nvml(torch)
        rec["cuda_ready"] = time.time()
        rec["fraction"] = _fraction(torch)
        grown = time.time()

        def target() -> int:
            frac = 1.0 if grow <= 0 else min(1.0, f0 + (1 - f0) * (time.time() - grown) / grow)
            return int(final_b * frac)

        nv_peak = 0
        while True:
            want = target()
            while True:
                have = torch.cuda.memory_reserved()
                step = min(STEP, (want - have) // GRAIN * GRAIN)
                if step <= 0:
                    break
                rec["asking"] = step
                t = torch.empty(step, dtype=torch.uint8, device="cuda")
                t.fill_(1)
                held.append(t)
            rec.pop("asking", None)
            torch.matmul(a, a, out=b)
            torch.cuda.synchronize()
            used = nvml.used()
            if used:
                nv_peak = max(nv_peak, used)
            if time.time() >= T0 + secs:
                break
            time.sleep(0.2 if want < final_b else 0.05)
        rec["status"] = "ok"
        rec["nvml_peak"] = nv_peak or None
        rec["context"] = (nv_peak - torch.cuda.memory_reserved()) if nv_peak else None
    except SystemExit as e:
        rec["status"] = "killed"
        rec["error"] = str(e)
    except Exception as e:
        import traceback

        traceback.print_exc()  # as any torch program dies: the tools read it from the log
        text = str(e)
        rec["status"] = "oom" if "out of memory" in text.lower() else "error"
        rec["error"] = text[:600]
        if rec["status"] == "oom" and torch is not None:
            m = re.search(r"Tried to allocate ([\d.]+ \w+)", text)
            rec["tried"] = _size(m.group(1)) if m else rec.get("asking")
            try:
                rec["reserved_at_oom"] = torch.cuda.memory_reserved()
                rec["free_at_oom"] = torch.cuda.mem_get_info()[0]
            except Exception:
                pass
            rec["capped"] = " allowed;" in text
    finally:
        if torch is not None:
            with contextlib.suppress(Exception):
                rec["peak_reserved"] = torch.cuda.max_memory_reserved()
        if nvml is not None and rec.get("nvml_peak") is None:
            rec["nvml_peak"] = nvml.used()
        rec["over_declared"] = rec.get("peak_reserved", 0) > declared_b
        rec["end"] = time.time()
        _write(path, rec)
    return 0 if rec["status"] == "ok" else 1


def _fraction(torch) -> "float | None":
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    try:
        return float(get(0)) if get else None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
