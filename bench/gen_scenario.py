"""Generate a large simulated machine for the ``status`` benchmark.

8 GPUs (H100-SXM5-80GB, two NUMA nodes, NVLink all-to-all) with **200 processes per
GPU**, i.e. 1,600 GPU-process entries with 1,600 distinct pids. The mix is meant to look
like a busy shared inference/training box: users and service accounts, vLLM / sglang /
torchrun / Jupyter / Triton / Ray commands with realistic argv lengths, about half of
them in docker or Kubernetes containers, and a sprinkle of every leak kind (dead,
zombie, orphan, other-namespace and garbage pids, unaccounted memory, hidden holders),
so the leak classifier and the leak section of the table have work to do too.

The output is deterministic for a given ``--seed``.

    python bench/gen_scenario.py [-o PATH] [--gpus 8] [--per-gpu 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
GPU_MEMORY_MIB = 81559  # what an H100 80GB HBM3 reports

USERS = [
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "mallory",
    "niaj",
    "olivia",
    "peggy",
    "rupert",
    "sybil",
    "trent",
    "victor",
    "walter",
    "yuki",
    "zhang.wei",
    "priya.r",
    "svc-inference",
    "svc-eval",
    "jupyter",
    "ray",
]
MODELS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "google/gemma-2-9b-it",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
    "microsoft/Phi-3.5-mini-instruct",
]
# Relative weights of the process states (about 2.5% of processes leak something).
STATE_WEIGHTS = {
    "running": 0.975,
    "dead": 0.005,
    "zombie": 0.005,
    "orphan": 0.005,
    "other_namespace": 0.0075,
    "garbage": 0.0025,
}
GARBAGE_PIDS = (4294967295, 2147483647, 0)


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _command(rng: random.Random, user: str, port: int) -> tuple[str, bool]:
    """A realistic argv line and whether the process uses torch."""
    model = rng.choice(MODELS)
    kind = rng.randrange(9)
    if kind == 0:
        return (
            f"python3 -m vllm.entrypoints.openai.api_server --model {model} "
            f"--port {port} --gpu-memory-utilization 0.{rng.randint(10, 30)} "
            f"--max-model-len {rng.choice([4096, 8192, 32768])}",
            True,
        )
    if kind == 1:
        return "VLLM::EngineCore", True
    if kind == 2:
        return (
            f"python3 -m sglang.launch_server --model-path {model} --port {port} "
            f"--mem-fraction-static 0.{rng.randint(10, 30)}",
            True,
        )
    if kind == 3:
        run = _hex(rng, 8)
        return (
            f"/usr/bin/python3 -u train.py --config configs/{run}.yaml "
            f"--output /scratch/{user}/runs/{run} --local_rank={rng.randrange(8)}",
            True,
        )
    if kind == 4:
        return (
            f"/opt/conda/bin/python -m ipykernel_launcher -f "
            f"/home/{user}/.local/share/jupyter/runtime/kernel-{_hex(rng, 8)}-"
            f"{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 12)}.json",
            True,
        )
    if kind == 5:
        return (
            f"tritonserver --model-repository=/models/{user} --http-port={port} "
            f"--grpc-port={port + 1} --metrics-port={port + 2}",
            False,
        )
    if kind == 6:
        return f"ray::RayWorkerWrapper.execute_method_{rng.randrange(100)}", True
    if kind == 7:
        return (
            f"python eval_harness.py --tasks mmlu,gsm8k,hellaswag --model {model} "
            f"--batch_size {rng.choice([8, 16, 32, 64])}",
            True,
        )
    return (
        f"{user}-bench --size {rng.choice([256, 1024, 4096])}M --iters "
        f"{rng.randrange(1000, 100000)}",
        False,
    )


def _container(rng: random.Random, pods: list[str], dockers: list[str]) -> str | None:
    r = rng.random()
    if r < 0.30:
        return rng.choice(pods)
    if r < 0.55:
        return rng.choice(dockers)
    return None


def _gpu(index: int) -> dict[str, Any]:
    numa = 0 if index < 4 else 1
    return {
        "index": index,
        "uuid": f"GPU-6b1c0f2e-8d3a-4c5b-9e7f-{index:012x}",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": f"{GPU_MEMORY_MIB}MiB",
        "numa_node": numa,
        "cpus": "0-47,96-143" if numa == 0 else "48-95,144-191",
        "compute_mode": "Default",
        "persistence_mode": True,
        "mps": index == 7,
        "driver_baseline": "4MiB",
        # GPU 5 carries 1.5 GiB that no process accounts for (a leaked context).
        "unaccounted_memory": "1536MiB" if index == 5 else 0,
        "utilization": 40 + (index * 7) % 60,
        "temperature": 38 + index,
        "power_watts": 310.0 + index * 11,
        "power_limit_watts": 700.0,
        "pci_bus_id": f"00000000:{(0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[index % 8]:02X}"
        ":00.0",
        "nvlink_peers": [j for j in range(8) if j != index],
    }


def generate(gpus: int = 8, per_gpu: int = 200, seed: int = 1) -> dict[str, Any]:
    """The scenario as a JSON-able dict: ``gpus`` GPUs with ``per_gpu`` processes each."""
    rng = random.Random(seed)
    pods = [
        f"k8s:{_hex(rng, 8)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 4)}-{_hex(rng, 12)}"
        f"/{_hex(rng, 12)}"
        for _ in range(40)
    ]
    dockers = [f"docker:{_hex(rng, 12)}" for _ in range(25)]
    pids = rng.sample(range(100_000, 3_999_999), gpus * per_gpu + 64)
    states = list(STATE_WEIGHTS)
    weights = list(STATE_WEIGHTS.values())
    budget = GPU_MEMORY_MIB - 2048  # leave room for the baseline and the leak on GPU 5
    processes: list[dict[str, Any]] = []
    for g in range(gpus):
        # Split the GPU's used memory (60-95% of it) over its processes, unevenly.
        used = int(budget * rng.uniform(0.6, 0.95))
        shares = [rng.paretovariate(1.5) for _ in range(per_gpu)]
        scale = used / sum(shares)
        for k in range(per_gpu):
            pid = pids.pop()
            user = rng.choice(USERS)
            command, torch = _command(rng, user, 8000 + (pid % 1000))
            state = rng.choices(states, weights)[0]
            entry: dict[str, Any] = {
                "pid": rng.choice(GARBAGE_PIDS) if state == "garbage" else pid,
                "gpu": g,
                "user": user,
                "command": command,
                "memory": f"{max(int(shares[k] * scale), 64)}MiB",
                "sm_utilization": rng.randrange(0, 100),
                "started_ago": round(rng.uniform(5, 14 * 86400), 1),
                "cpus_allowed": "0-47,96-143" if g < 4 else "48-95,144-191",
                "torch": torch,
            }
            if state != "running":
                entry["state"] = state
            container = _container(rng, pods, dockers)
            if container:
                entry["container"] = container
            if torch and rng.random() < 0.4:
                entry["env"] = {
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                    "CUDA_VISIBLE_DEVICES": str(g),
                }
            if rng.random() < 0.05:
                entry["kinds"] = ["compute", "graphics"]
            processes.append(entry)
    holders: list[dict[str, Any]] = []
    for i in range(12):  # hidden holders: processes with device files open, listed nowhere
        g = rng.randrange(gpus)
        holders.append(
            {
                "pid": pids.pop(),
                "user": rng.choice(USERS),
                "command": "python notebook_kernel.py" if i % 2 else "python -c import torch",
                "devices": [f"/dev/nvidia{g}", "/dev/nvidia-uvm", "/dev/nvidiactl"],
            }
        )
    for cmd in ("nvtop", "nvidia-smi dmon", "dcgm-exporter"):  # monitors: harmless
        holders.append(
            {"pid": pids.pop(), "user": "root", "command": cmd, "devices": ["/dev/nvidiactl"]}
        )
    return {
        "description": f"Generated by bench/gen_scenario.py (seed {seed}): {gpus}x H100 80GB "
        f"with {per_gpu} processes per GPU ({gpus * per_gpu} in all), every "
        "leak kind sprinkled in.",
        "driver_version": "550.90.07",
        "gpus": [_gpu(i) for i in range(gpus)],
        "processes": processes,
        "holders": holders,
    }


def write(path: Path, gpus: int = 8, per_gpu: int = 200, seed: int = 1) -> Path:
    path.write_text(json.dumps(generate(gpus, per_gpu, seed), indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "-o", "--output", type=Path, help="where to write the scenario (default: a new temp file)"
    )
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--per-gpu", type=int, default=200, help="processes per GPU")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    out: Path | None = args.output
    if out is None:
        fd, name = tempfile.mkstemp(prefix="gpuwarden-bench-", suffix=".json")
        os.close(fd)
        out = Path(name)
    write(out, args.gpus, args.per_gpu, args.seed)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
