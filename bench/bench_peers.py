"""The same real torch jobs through gpuwarden, gpusched and gq-local, one after the
other on one GPU machine: makespan, OOM failures, neighbour crashes. Also one-shot
status next to nvidia-smi and nvitop.

    PYTHONPATH=src:EXTRA python3 bench/bench_peers.py --json OUT     (GPU machine; EXTRA
    holds gpusched, gq-local and nvitop, carried as wheels: scripts/gpu-bench.sh)

Each job allocates X GiB, then computes for T seconds (a matmul every 50 ms for light
jobs, back to back for heavy ones) and writes what happened to a result file: that file,
not the tools' own reports, is what is measured, so the tools are judged alike. Two jobs
are mis-declared (they declare two thirds of what they allocate, plus 1 GiB): their OOMs
are their own.
A *neighbour crash* is a job that declared enough and still ran out of memory.
- gpuwarden: a private daemon, ``submit --mem DECLARED`` (+ ``--retries 2``).
- gpusched: one jobs file, ``[vram=DECLARED retries=2] CMD``, ``--poll 0.5``.
- gq-local: ``gq -g 1 CMD``: a whole GPU per job.
"""

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
from pathlib import Path
from typing import Any

GiB = 1 << 30
PY = sys.executable
REPO = Path(__file__).resolve().parent.parent

JOB = r"""
import json, os, sys, time
out, gib, seconds, heavy = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
started = time.time()
record = {"start": started, "pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    import torch
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    a = torch.randn(2048, 2048, device="cuda")
    deadline = time.time() + seconds
    while time.time() < deadline:
        b = a @ a
        torch.cuda.synchronize()
        if not heavy:
            time.sleep(0.05)
    record["status"] = "ok"
except Exception as e:
    import traceback
    traceback.print_exc()  # as any torch program dies: the tools read it from the log
    record["status"] = "oom" if "out of memory" in str(e) else "error"
    record["error"] = str(e).splitlines()[0][:200]
record["end"] = time.time()
attempt = 0
while os.path.exists(f"{out}.{attempt}"):
    attempt += 1
with open(f"{out}.{attempt}", "w") as f:
    json.dump(record, f)
sys.exit(0 if record["status"] == "ok" else 1)
"""


def job_set(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    jobs = []
    for _ in range(n):
        gib = round(rng.choice([2, 3, 4, 6, 8, 12, 16, 24]) * rng.uniform(0.9, 1.1), 1)
        jobs.append({"gib": gib, "seconds": round(rng.uniform(3, 9), 1),
                     "heavy": rng.random() < 0.2, "declared": gib + 1.5, "misdeclared": False})
    for i in (3, n // 2):  # mis-declared: they use 50% more than they say
        jobs[i]["misdeclared"] = True
        jobs[i]["declared"] = round(jobs[i]["gib"] / 1.5 + 1.0, 1)
    return jobs


def _mib(job: dict[str, Any]) -> int:
    return int(job["declared"] * 1024)


def _cmd(job: dict[str, Any], results: Path, i: int, script: Path) -> list[str]:
    return [PY, str(script), str(results / f"job{i}"), str(job["gib"]), str(job["seconds"]),
            "1" if job["heavy"] else "0"]


def _collect(results: Path, jobs: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    finals, ooms, neighbour, failed = [], 0, 0, 0
    for i, job in enumerate(jobs):
        attempts = sorted(results.glob(f"job{i}.*"), key=lambda p: int(p.suffix[1:]))
        recs = [json.loads(p.read_text()) for p in attempts]
        ooms += sum(1 for r in recs if r["status"] == "oom")
        neighbour += sum(1 for r in recs if r["status"] == "oom" and not job["misdeclared"])
        if not recs or recs[-1]["status"] != "ok":
            failed += 1
        if recs:
            finals.append(recs[-1])
    ends = [r["end"] for r in finals]
    starts = [r["start"] for r in finals]
    return {"makespan_s": (max(ends) - t0) if ends else None, "failed": failed, "ooms": ooms,
            "neighbour_ooms": neighbour, "finished": len(finals),
            "mean_start_s": statistics.mean(s - t0 for s in starts) if starts else None}


def _wait_files(results: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = {p.name.split(".")[0] for p in results.glob("job*.*")}
        if len(done) >= n:
            return
        time.sleep(0.2)


def run_gpuwarden(jobs: list[dict[str, Any]], work: Path, script: Path) -> dict[str, Any]:
    home = work / "gw"
    home.mkdir()
    (home / "config.toml").write_text('interval = "200ms"\nretry_backoff = "1s"\n'
                                      'history_interval = "0"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_VIS"))}
    env["GPUWARDEN_HOME"] = str(home)
    results = work / "gw-results"
    results.mkdir()

    def gw(*args: str) -> str:
        return subprocess.run([PY, "-m", "gpuwarden", *args], env=env, check=True,
                              capture_output=True, text=True, timeout=600).stdout

    gw("daemon", "start")
    try:
        t0 = time.time()
        ids = [gw("submit", "--mem", f"{_mib(j)}M", "--retries", "2", "--",
                  *_cmd(j, results, i, script)).strip() for i, j in enumerate(jobs)]
        for jid in ids:
            subprocess.run([PY, "-m", "gpuwarden", "wait", jid], env=env, timeout=400,
                           capture_output=True)
        return _collect(results, jobs, t0)
    finally:
        subprocess.run([PY, "-m", "gpuwarden", "daemon", "stop"], env=env, timeout=60,
                       capture_output=True)


def run_gpusched(jobs: list[dict[str, Any]], work: Path, script: Path) -> dict[str, Any]:
    results = work / "gs-results"
    results.mkdir()
    lines = [f"[vram={_mib(j)} retries=2] " + " ".join(_cmd(j, results, i, script))
             for i, j in enumerate(jobs)]
    (work / "jobs.txt").write_text("\n".join(lines) + "\n")
    t0 = time.time()
    out = subprocess.run([PY, "-c", "import sys; from gpusched.cli import main; "
                          "sys.exit(main())", str(work / "jobs.txt"), "--poll", "0.5",
                          "--log-dir", str(work / "gs-logs")], cwd=work, capture_output=True,
                         text=True, timeout=400)
    result = _collect(results, jobs, t0)
    result["tool_exit"] = out.returncode
    result["tool_tail"] = (out.stdout + out.stderr)[-1500:]
    return result


def run_gq(jobs: list[dict[str, Any]], work: Path, script: Path) -> dict[str, Any]:
    results = work / "gq-results"
    results.mkdir()
    env = dict(os.environ, GQ_DATA_DIR=str(work / "gq-data"),
               GQ_RUNTIME_DIR=str(work / "gq-run"))
    gq = [PY, "-c", "import sys; from gq.cli import main; sys.exit(main())"]
    subprocess.run([*gq, "daemon", "start"], env=env, capture_output=True, timeout=60)
    try:
        t0 = time.time()
        for i, j in enumerate(jobs):
            r = subprocess.run([*gq, "-g", "1", *_cmd(j, results, i, script)], env=env,
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"gq submit failed: {r.stdout} {r.stderr}")
        _wait_files(results, len(jobs), timeout=400)
        return _collect(results, jobs, t0)
    finally:
        subprocess.run([*gq, "daemon", "stop"], env=env, capture_output=True, timeout=60)


def status_times(runs: int) -> dict[str, Any]:
    """One-shot views, each as a user runs it (wall time, median of ``runs``)."""
    cmds = {"gpuwarden status": [PY, "-m", "gpuwarden", "status"],
            "gpuwarden status --json": [PY, "-m", "gpuwarden", "status", "--json"],
            "nvidia-smi": ["nvidia-smi"],
            "nvitop -1": [PY, "-c", "import sys; from nvitop.cli import main; "
                                    "sys.argv = ['nvitop', '-1']; sys.exit(main())"]}
    out: dict[str, Any] = {}
    for name, cmd in cmds.items():
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, env=dict(os.environ, COLUMNS="120"),
                               timeout=60)
            times.append(time.perf_counter() - t)
        out[name] = {"median_s": statistics.median(times), "min_s": min(times),
                     "exit": r.returncode}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tools", default="gpuwarden,gpusched,gq-local")
    ap.add_argument("--status-runs", type=int, default=7)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    jobs = job_set(args.jobs, args.seed)
    work = Path(tempfile.mkdtemp(prefix="gw-peers-"))
    script = work / "job.py"
    script.write_text(JOB)
    import torch

    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                              "gpu_memory": torch.cuda.get_device_properties(0).total_memory,
                              "jobs": jobs, "seed": args.seed, "tools": {}}
    runners = {"gpuwarden": run_gpuwarden, "gpusched": run_gpusched, "gq-local": run_gq}
    try:
        for name in args.tools.split(","):
            t = time.time()
            try:
                result["tools"][name] = runners[name](jobs, work, script)
            except Exception as e:  # a peer that cannot run here is a finding, not a crash
                result["tools"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            result["tools"][name]["wall_s"] = time.time() - t
            print(name, result["tools"][name], file=sys.stderr, flush=True)
        result["status"] = status_times(args.status_runs)
        print(result["status"], file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
