"""A mixed set of real torch jobs on one GPU, through gpuwarden's queue packed by memory and,
side by side in the same session, through whole-GPU queueing (one job at a time, the
same daemon with no ``--mem``): makespan, mean wait and OOM failures.

Needs a real GPU with torch. Run on the GPU machine from the source tree:

    PYTHONPATH=src python3 bench/bench_mixed.py --json bench/results/mixed.json

The job set is fixed by ``--seed``: sizes from 4 to 32 GiB on an H200-class GPU (scaled to
the GPU's memory), durations from 4 to 14 s, most jobs light on the SMs (a small matmul
every 50 ms: evaluation, data-loader-bound training, an inference worker), every fourth
compute-heavy (matmuls back to back). Each job declares its allocation plus 1.5 GiB
(context and slack) as ``--mem``; one job in the set is under-declared on purpose (80% of
what it allocates, with ``--retries 2``), so the OOM-retry path runs too. The two runs go
in the order given by ``--order`` and nothing else runs on the GPU meanwhile."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

GiB = 1 << 30
JOB = """\
import sys, time
import torch
n, seconds, heavy = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
hold = torch.empty(n, dtype=torch.uint8, device="cuda")
hold.fill_(1)
a = torch.randn(2048, 2048, device="cuda")
end = time.monotonic() + seconds
steps = 0
while time.monotonic() < end:
    b = a @ a
    steps += 1
    if not heavy:
        torch.cuda.synchronize()
        time.sleep(0.05)
torch.cuda.synchronize()
print("steps", steps, flush=True)
"""


def job_set(seed: int, total: int, count: int) -> list[dict[str, Any]]:
    """The jobs: bytes to hold, seconds, heavy or light, declared memory."""
    rng = random.Random(seed)
    scale = total / (140 * GiB)
    jobs = []
    for i in range(count):
        size = int(rng.choice([4, 6, 8, 12, 16, 24, 32]) * GiB * scale)
        seconds = float(rng.randint(4, 14))
        heavy = i % 4 == 3
        declared = size + int(1.5 * GiB)
        jobs.append(
            {"bytes": size, "seconds": seconds, "heavy": heavy, "mem": declared, "retries": 0}
        )
    # One under-declared job: it runs out of memory under its cap and is retried bigger.
    jobs[count // 2]["mem"] = int(jobs[count // 2]["bytes"] * 0.8)
    jobs[count // 2]["retries"] = 2
    return jobs


class GpuDaemon:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gwm-"))
        self.home = self.root / "home"
        self.home.mkdir()
        (self.home / "config.toml").write_text('interval = "200ms"\nretry_backoff = "1s"\n')
        src = str(Path(__file__).resolve().parents[1] / "src")
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_VISIBLE"))
        }
        self.env.update(
            GPUWARDEN_HOME=str(self.home),
            PYTHONPATH=os.pathsep.join(filter(None, [src, self.env.get("PYTHONPATH")])),
        )

    def cli(self, *args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if r.returncode != 0 and args[0] != "wait":
            raise RuntimeError(f"gpuwarden {' '.join(args)}: {r.stderr}")
        return r.stdout

    def close(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "gpuwarden", "daemon", "stop"],
            env=self.env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def _t(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).timestamp()


def run(jobs: list[dict[str, Any]], packed: bool) -> dict[str, Any]:
    d = GpuDaemon()
    try:
        d.cli("daemon", "start")
        ids = []
        t0 = time.time()
        for j in jobs:
            opts = ["--mem", f"{j['mem']}B", "--retries", str(j["retries"])] if packed else []
            out = d.cli(
                "submit",
                *opts,
                "--",
                sys.executable,
                "-c",
                JOB,
                str(j["bytes"]),
                str(j["seconds"]),
                "1" if j["heavy"] else "0",
            )
            ids.append(int(out))
        for jid in ids:
            d.cli("wait", str(jid))
        shown = [json.loads(d.cli("show", str(jid), "--json")) for jid in ids]
    finally:
        d.close()
    ends = [_t(j["ended_at"]) or t0 for j in shown]
    starts = [_t(j["started_at"]) for j in shown]
    submits = [_t(j["submitted_at"]) or t0 for j in shown]
    waits = [(s - sub) for s, sub in zip(starts, submits, strict=True) if s is not None]
    kinds = [[e["kind"] for e in j["events"]] for j in shown]
    return {
        "mode": "packed by memory" if packed else "whole GPU, one at a time",
        "makespan_s": max(ends) - t0,
        "mean_wait_s": statistics.mean(waits) if waits else None,
        "succeeded": sum(1 for j in shown if j["state"] == "succeeded"),
        "failed": sum(1 for j in shown if j["state"] != "succeeded"),
        "oom_events": sum(k.count("oom") for k in kinds),
        "oom_retried": sum(k.count("retried") for k in kinds),
        "most_at_once": _most_at_once(starts, ends),
        "peaks_over_budget": sum(
            1 for j in shown if j["peak_memory"] and j["budget"] and j["peak_memory"] > j["budget"]
        ),
        "jobs": [
            {
                **{
                    k: j[k]
                    for k in (
                        "id",
                        "state",
                        "mem",
                        "budget",
                        "peak_memory",
                        "oom_retries",
                        "started_at",
                        "ended_at",
                    )
                },
                "oom": "oom" in k,
            }
            for j, k in zip(shown, kinds, strict=True)
        ],
    }


def _most_at_once(starts: list[float | None], ends: list[float]) -> int:
    points = sorted(
        [(s, 1) for s in starts if s is not None]
        + [(e, -1) for s, e in zip(starts, ends, strict=True) if s is not None]
    )
    most = cur = 0
    for _, step in points:
        cur += step
        most = max(most, cur)
    return most


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--order", choices=["packed-first", "whole-first"], default="packed-first")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    props = torch.cuda.get_device_properties(0)
    total = int(props.total_memory)
    jobs = job_set(args.seed, total, args.jobs)
    order = [True, False] if args.order == "packed-first" else [False, True]
    results = {("packed" if p else "whole"): run(jobs, p) for p in order}
    packed, whole = results["packed"], results["whole"]
    summary = {
        "gpu": props.name,
        "gpu_memory": total,
        "torch": torch.__version__,
        "seed": args.seed,
        "order": args.order,
        "job_set": jobs,
        "results": results,
        "makespan_ratio": packed["makespan_s"] / whole["makespan_s"],
        "goal": "makespan <= 0.5x of one-at-a-time with zero neighbour OOMs",
        # OOMs of jobs that declared enough: a neighbour took their memory. The one
        # under-declared job's own OOM (and retry) does not count.
        "neighbour_ooms": sum(
            1
            for spec, j in zip(jobs, packed["jobs"], strict=True)
            if j["oom"] and not spec["retries"]
        ),
    }
    for name, r in results.items():
        print(
            f"{name}: makespan {r['makespan_s']:.1f} s, mean wait {r['mean_wait_s']:.1f} s, "
            f"{r['succeeded']} ok / {r['failed']} failed, {r['oom_events']} OOM "
            f"({r['oom_retried']} retried), up to {r['most_at_once']} at once",
            file=sys.stderr,
        )
    print(f"makespan ratio packed/whole: {summary['makespan_ratio']:.2f}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
