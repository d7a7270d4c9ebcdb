"""gpuwarden, gpusched and gflow side by side on one GPU, with real torch jobs (issue 17).

    PYTHONPATH=src:SITE python3 bench/bench_peers.py --json OUT [--sets a,b,c]
        [--tools gpuwarden,gpusched,gflow] [--time-scale 1] [--budget 540]
    python3 bench/bench_peers.py --merge A.json B.json --json OUT   (no GPU: join split runs)

scripts/gpu-bench.sh installs the carried peers and runs this on the GPU machine.

Three job sets, each run by every tool in turn on a fresh state (set by set, tool after
tool), all jobs submitted at once:

- ``a``: 12 jobs of equal duration, 10-60 GiB, each declared exactly what it takes;
- ``b``: 8 training-like jobs whose memory rises over their first 8 seconds, packed tight
  (declarations add up to more than the GPU), two of them declaring 10 GiB and growing to
  25 GiB;
- ``c``: 14 honest jobs of mixed sizes (10-70 GiB) and durations (10-45 s).

Each job (bench/peers_job.py) writes its own result file per attempt: those files, not
the tools' reports, are measured. A job's duration counts from its process start, so a
job's wall time does not depend on how busy the GPU is; only the scheduling differs.

How each tool is driven, as its documentation says a user would:
- gpuwarden: a private daemon (fresh ``GPUWARDEN_HOME``, no config file), ``gpuwarden
  submit --mem DECLARED -- CMD`` (``--gw-args`` adds options, none by default);
- gpusched: one jobs file of ``[vram=DECLARED retries=R] CMD`` lines, ``--poll 1``, a fresh
  log directory (it keeps its journal there and would resume from it);
- gflow (runqd): a private ``gflowd`` (fresh XDG directories, its own tmux server),
  ``gbatch --gpus 1 --shared --gpu-memory DECLARED [--max-retries R] CMD``.
R is ``--peer-retries`` (default 2); gpuwarden gets its defaults.

An OOM is *self* when the job held or asked for more than it declared, *cap* when it was
within its declaration and the GPU had room (the tool's own cap sat below the
declaration), *neighbour* when it was within its declaration and the GPU was full (someone
else's memory). The lower bound of a set is max(longest job, Σ peak × duration ÷ the
GPU's memory).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import SET_C

MiB = 1 << 20
GiB = 1 << 30
PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "peers_job.py"
TERMINAL_GFLOW = {"Finished", "Failed", "Cancelled", "Timeout"}


def _job(
    name: str,
    gib: float,
    seconds: float,
    declared: float | None = None,
    start_frac: float = 1.0,
    grow_s: float = 0.0,
) -> dict[str, Any]:
    declared = gib if declared is None else declared
    return {
        "name": name,
        "final_mib": int(gib * 1024),
        "declared_mib": int(declared * 1024),
        "seconds": seconds,
        "start_frac": start_frac,
        "grow_s": grow_s,
        "honest": declared >= gib,
    }


def job_sets() -> dict[str, dict[str, Any]]:
    a = [
        _job(f"a{i:02d}", g, 13)
        for i, g in enumerate([30, 55, 10, 45, 20, 60, 15, 40, 25, 50, 35, 30])
    ]
    b_sizes: list[tuple[float, float | None]] = [
        (35, None),
        (25, 10),
        (20, None),
        (30, None),
        (25, 10),
        (15, None),
        (25, None),
        (15, None),
    ]
    b = [_job(f"b{i:02d}", g, 30, d, start_frac=0.4, grow_s=8) for i, (g, d) in enumerate(b_sizes)]
    c = [_job(f"c{i:02d}", g, s) for i, (g, s) in enumerate(SET_C)]
    return {
        "a": {
            "title": "12 jobs of equal duration, 10-60 GiB, each declared exactly what it takes",
            "jobs": a,
        },
        "b": {
            "title": "8 training-like jobs, memory rising over their first 8 s, packed "
            "tight; two declare 10 GiB and grow to 25 GiB",
            "jobs": b,
        },
        "c": {
            "title": "14 honest jobs of mixed sizes (10-70 GiB) and durations (10-45 s)",
            "jobs": c,
        },
    }


def scaled(jobs: list[dict[str, Any]], scale: float) -> list[dict[str, Any]]:
    return [
        dict(j, seconds=round(j["seconds"] * scale, 2), grow_s=round(j["grow_s"] * scale, 2))
        for j in jobs
    ]


def lower_bound(jobs: list[dict[str, Any]], capacity: int) -> dict[str, float]:
    area = sum(j["final_mib"] * MiB * j["seconds"] for j in jobs) / capacity
    longest = max(j["seconds"] for j in jobs)
    return {"area_s": area, "longest_s": longest, "bound_s": max(area, longest)}


def _cmd(job: dict[str, Any], results: Path) -> list[str]:
    return [
        PY,
        str(JOB),
        str(results / job["name"]),
        str(job["declared_mib"]),
        str(job["final_mib"]),
        str(job["start_frac"]),
        str(job["grow_s"]),
        str(job["seconds"]),
    ]


# --- what the result files say -------------------------------------------------------------


def _attempts(results: Path, name: str) -> list[dict[str, Any]]:
    recs = []
    for p in results.glob(f"{name}.*.json"):
        try:
            recs.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(recs, key=lambda r: r.get("attempt", 0))


def oom_kind(rec: dict[str, Any]) -> str | None:
    """self / cap / neighbour for an OOM attempt, None otherwise."""
    if rec.get("status") != "oom":
        return None
    held = rec.get("reserved_at_oom") or 0
    tried = rec.get("tried") or 0
    declared = rec["declared_mib"] * MiB
    if held + tried > declared:
        return "self"
    free = rec.get("free_at_oom")
    if rec.get("capped") or (free is not None and tried and free >= tried):
        return "cap"
    return "neighbour"


def collect(results: Path, jobs: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    per_job, ends = [], []
    ooms = {"self": 0, "cap": 0, "neighbour": 0}
    retries = failed = unfinished = killed = errors = 0
    for job in jobs:
        recs = _attempts(results, job["name"])
        kinds = [oom_kind(r) for r in recs]
        for k in kinds:
            if k:
                ooms[k] += 1
        killed += sum(1 for r in recs if r.get("status") in ("killed", "running"))
        errors += sum(1 for r in recs if r.get("status") == "error")
        retries += max(0, len(recs) - 1)
        last = recs[-1] if recs else None
        ok = last is not None and last.get("status") == "ok"
        if ok:
            ends.append(last["end"])
        elif last is None or last.get("status") == "running":
            unfinished += 1
        else:
            failed += 1
        per_job.append(
            {
                "name": job["name"],
                "declared_mib": job["declared_mib"],
                "final_mib": job["final_mib"],
                "honest": job["honest"],
                "ok": ok,
                "attempts": len(recs),
                # the successful attempt's figures; else the largest any attempt reached
                "peak_reserved_mib": int(
                    (last.get("peak_reserved") or 0)
                    if ok and last
                    else max((r.get("peak_reserved") or 0 for r in recs), default=0)
                )
                // MiB,
                "nvml_peak_mib": int(
                    (last.get("nvml_peak") or 0)
                    if ok and last
                    else max((r.get("nvml_peak") or 0 for r in recs), default=0)
                )
                // MiB,
                "context_mib": next(
                    (r["context"] // MiB for r in reversed(recs) if r.get("context")), None
                ),
                "end_s": (last["end"] - t0) if ok and last else None,
                "trace": [
                    {
                        "status": r.get("status"),
                        "oom": k,
                        "start_s": round(r["start"] - t0, 2),
                        "end_s": round(r["end"] - t0, 2) if r.get("end") else None,
                        "peak_reserved_mib": (r.get("peak_reserved") or 0) // MiB,
                        "error": (r.get("error") or "")[:240] or None,
                    }
                    for r, k in zip(recs, kinds, strict=True)
                ],
            }
        )
    done = [j["end_s"] for j in per_job if j["end_s"] is not None]
    return {
        "makespan_s": (max(ends) - t0) if len(ends) == len(jobs) else None,
        "last_end_s": (max(ends) - t0) if ends else None,
        "mean_completion_s": statistics.mean(done) if done else None,
        "ok": len(done),
        "failed": failed,
        "unfinished": unfinished,
        "ooms": ooms,
        "killed": killed,
        "errors": errors,
        "retries": retries,
        "jobs": per_job,
    }


def _reap(results: Path) -> int:
    """SIGKILL job processes of this run that are still alive (a cut run, a tool that left
    them): only pids our result files name whose command line is our job script."""
    n = 0
    for p in results.glob("*.json"):
        try:
            pid = json.loads(p.read_text()).get("pid")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, TypeError):
            continue
        if str(JOB).encode() in cmdline and str(results).encode() in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


# --- the GPU -------------------------------------------------------------------------------


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def gpu_facts() -> dict[str, Any]:
    nv = _nvml()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    name = nv.nvmlDeviceGetName(h)
    drv = nv.nvmlSystemGetDriverVersion()
    return {
        "gpu": name.decode() if isinstance(name, bytes) else name,
        "driver": drv.decode() if isinstance(drv, bytes) else drv,
        "gpu_memory": int(nv.nvmlDeviceGetMemoryInfo(h).total),
        "gpus": nv.nvmlDeviceGetCount(),
    }


def gpu_used() -> int:
    nv = _nvml()
    return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).used)


def drain(baseline: int, timeout: float = 30.0) -> float:
    """Wait until the GPU's memory is back near where it was before the runs."""
    t = time.monotonic()
    while time.monotonic() - t < timeout and gpu_used() > baseline + GiB:
        time.sleep(0.5)
    return time.monotonic() - t


# --- the tools -----------------------------------------------------------------------------


def _run(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 60, check: bool = False
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(cmd[:4])}...: exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}"
        )
    return r


def run_gpuwarden(
    jobs: list[dict[str, Any]], work: Path, results: Path, deadline: float, opts: argparse.Namespace
) -> dict[str, Any]:
    home = work / "gw-home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUWARDEN_", "CUDA_VISIBLE", "PYTORCH_CUDA_ALLOC"))
    }
    env["GPUWARDEN_HOME"] = str(home)
    gw = [PY, "-m", "gpuwarden"]
    _run([*gw, "daemon", "start"], env, check=True)
    extra = shlex.split(opts.gw_args)
    tool: dict[str, Any] = {
        "submit": shlex.join(["gpuwarden", "submit", "--mem", "<MiB>M", *extra, "--", "..."])
    }
    try:
        t0 = time.time()
        ids = [
            _run(
                [
                    *gw,
                    "submit",
                    "--mem",
                    f"{j['declared_mib']}M",
                    "--name",
                    j["name"],
                    *extra,
                    "--",
                    *_cmd(j, results),
                ],
                env,
                check=True,
            ).stdout.strip()
            for j in jobs
        ]
        left = max(1, int(deadline - time.time()))
        w = _run([*gw, "wait", "--timeout", f"{left}s", *ids], env, timeout=left + 30)
        tool["wait_exit"] = w.returncode
        tool["cut"] = w.returncode == 124
        if tool["cut"]:
            _run([*gw, "cancel", *ids], env)
        tool["show"] = {}
        for jid in ids:
            s = _run([*gw, "show", "--json", jid], env)
            try:
                tool["show"][jid] = _gw_brief(json.loads(s.stdout))
            except ValueError:
                tool["show"][jid] = s.stdout[-1000:]
        return {"t0": t0, "tool": tool}
    finally:
        _run([*gw, "daemon", "stop"], env)


GW_KEEP = (
    "id",
    "name",
    "state",
    "mem",
    "budget",
    "peak_memory",
    "attempts",
    "oom_retries",
    "oom",
    "preemptions",
    "declared_vs_peak",
    "reason",
    "enforcement",
)


def _gw_brief(show: dict[str, Any]) -> dict[str, Any]:
    """What `gpuwarden show --json` says of a job, less what the result files already hold."""
    brief = {k: show.get(k) for k in GW_KEEP if k in show}
    brief["events"] = [
        f"{e.get('at', '')[11:23]} {e.get('kind')}: {(e.get('detail') or '')[:300]}"
        for e in show.get("events", [])
    ]
    return brief


def run_gpusched(
    jobs: list[dict[str, Any]], work: Path, results: Path, deadline: float, opts: argparse.Namespace
) -> dict[str, Any]:
    lines = [
        f"[vram={j['declared_mib']} retries={opts.peer_retries}] " + shlex.join(_cmd(j, results))
        for j in jobs
    ]
    jobs_file = work / "jobs.txt"
    jobs_file.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_VISIBLE")}
    cmd = [
        PY,
        "-c",
        "import sys; from gpusched.cli import main; sys.exit(main())",
        str(jobs_file),
        "--poll",
        str(opts.gs_poll),
        "--log-dir",
        str(work / "gs-logs"),
    ]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    cut = False
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        cut = True
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    return {
        "t0": t0,
        "tool": {
            "exit": proc.returncode,
            "cut": cut,
            "tail": out[-3000:],
            "line": f"[vram=<MiB> retries={opts.peer_retries}] CMD; "
            f"gpusched jobs.txt --poll {opts.gs_poll}",
        },
    }


def gflow_env(work: Path) -> dict[str, str]:
    """A private gflow: its own config, state and tmux server. tmux starts each job in a
    login shell, which resets PATH from /etc/profile: the private HOME's .bash_profile puts
    gflow's commands (gcancel marks the job's end) and tmux back, as a user's would."""
    root = work / "gflow"
    dirs = {n: root / n for n in ("config", "data", "run", "home", "tmux")}
    for d in dirs.values():
        d.mkdir(parents=True)
    dirs["run"].chmod(0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_VISIBLE", "TMUX"))}
    env.update(
        XDG_CONFIG_HOME=str(dirs["config"]),
        XDG_DATA_HOME=str(dirs["data"]),
        XDG_RUNTIME_DIR=str(dirs["run"]),
        HOME=str(dirs["home"]),
        TMUX_TMPDIR=str(dirs["tmux"]),
    )
    exports = "".join(
        f"export {k}={shlex.quote(env[k])}\n"
        for k in (
            "PATH",
            "LD_LIBRARY_PATH",
            "PYTHONPATH",
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
            "XDG_RUNTIME_DIR",
            "TMUX_TMPDIR",
        )
        if k in env
    )
    (dirs["home"] / ".bash_profile").write_text(exports)
    (dirs["home"] / ".bashrc").write_text(exports)
    return env


def run_gflow(
    jobs: list[dict[str, Any]], work: Path, results: Path, deadline: float, opts: argparse.Namespace
) -> dict[str, Any]:
    for binary in ("gflowd", "gbatch", "gqueue", "gcancel", "tmux"):
        if shutil.which(binary) is None:
            raise RuntimeError(f"{binary} is not on PATH")
    env = gflow_env(work)
    _run(["gflowd", "up"], env, check=True)
    tool: dict[str, Any] = {
        "submit": f"gbatch --gpus 1 --shared --gpu-memory <MiB>M "
        f"--max-retries {opts.peer_retries} CMD"
    }
    try:
        t = time.monotonic()
        while time.monotonic() - t < 30:
            st = _run(["gflowd", "status"], env).stdout
            if "Running" in st and "GPUs:      0 total" not in st:
                break
            time.sleep(0.5)
        tool["status"] = st[-600:]
        retries = ["--max-retries", str(opts.peer_retries)] if opts.peer_retries else []
        t0 = time.time()
        for j in jobs:
            _run(
                [
                    "gbatch",
                    "--gpus",
                    "1",
                    "--shared",
                    "--gpu-memory",
                    f"{j['declared_mib']}M",
                    "--name",
                    j["name"],
                    *retries,
                    *_cmd(j, results),
                ],
                env,
                check=True,
            )
        stable, queue = 0, {}
        while time.time() < deadline:
            q = _run(["gqueue", "-a", "-o", "json"], env)
            try:
                queue = json.loads(q.stdout)
                states = [x.get("state") for x in queue.get("jobs", [])]
            except ValueError:
                states = ["?"]
            stable = stable + 1 if states and all(s in TERMINAL_GFLOW for s in states) else 0
            if stable >= 3:
                break
            time.sleep(1)
        tool["cut"] = stable < 3
        tool["queue"] = queue
        if tool["cut"]:
            ids = [
                str(x["id"]) for x in queue.get("jobs", []) if x.get("state") not in TERMINAL_GFLOW
            ]
            if ids:
                _run(["gcancel", ",".join(ids)], env)
        return {"t0": t0, "tool": tool}
    finally:
        _run(["gflowd", "down"], env)
        _run(["tmux", "kill-server"], env)


RUNNERS = {"gpuwarden": run_gpuwarden, "gpusched": run_gpusched, "gflow": run_gflow}


def run_one(
    tool: str,
    set_name: str,
    jobs: list[dict[str, Any]],
    work: Path,
    deadline: float,
    opts: argparse.Namespace,
) -> dict[str, Any]:
    base = work / f"{set_name}-{tool}"
    results = base / "results"
    results.mkdir(parents=True)
    t = time.time()
    try:
        r = RUNNERS[tool](jobs, base, results, deadline, opts)
    except Exception as e:  # a peer that cannot run here is a finding, not a crash
        return {
            "error": f"{type(e).__name__}: {e}"[:800],
            "wall_s": time.time() - t,
            "reaped": _reap(results),
        }
    time.sleep(1)
    reaped = _reap(results)
    out = collect(results, jobs, r["t0"])
    out.update(
        wall_s=time.time() - t, reaped=reaped, tool=r["tool"], cut=bool(r["tool"].get("cut"))
    )
    return out


# --- one-shot views --------------------------------------------------------------------------


def _crowd(total: int, into: list[subprocess.Popen[bytes]]) -> None:
    """Idle processes into ``into`` until the machine has about ``total``: a shared
    machine's many, which every view of its processes walks. Into the caller's list,
    so that those started before a failure are stopped too."""
    have = sum(1 for d in os.listdir("/proc") if d.isdigit())
    for _ in range(max(0, total - have)):
        into.append(
            subprocess.Popen(
                ["sleep", "3600"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )


# What marks an answer the daemon gave from its snapshot (else the client took its own).
SERVED = {"status": b"from the daemon's snapshot", "json": b'"daemon":{"age"'}


def status_times(runs: int, work: Path) -> dict[str, Any]:
    """One-shot views, each as a user runs it (wall time, median of ``runs``): the
    interpreter alone, gpuwarden's standalone, then with a private daemon running
    (answered from its snapshot; a run it did not serve is not timed), nvidia-smi and
    nvitop."""
    gw = [PY, "-m", "gpuwarden"]
    # Bytecode cached as an installed package has it, for every tool alike: this image's
    # packages come without .pyc files and it may set PYTHONDONTWRITEBYTECODE, so each
    # run would compile pynvml and psutil again (70 ms and more on the H200's).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUWARDEN_", "CUDA_VISIBLE")) and k != "PYTHONDONTWRITEBYTECODE"
    } | {"COLUMNS": "120", "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    standalone = {
        "python3 -c pass": [PY, "-c", "pass"],
        "gpuwarden status": [*gw, "status"],
        "gpuwarden status --json": [*gw, "status", "--json"],
        "gpuwarden leaks --json": [*gw, "leaks", "--json"],
        "nvidia-smi": ["nvidia-smi"],
        "nvitop -1": [
            PY,
            "-c",
            "import sys; from nvitop.cli import main; "
            "sys.argv = ['nvitop', '-1']; sys.exit(main())",
        ],
    }
    served = {
        "gpuwarden status (daemon)": ([*gw, "status"], SERVED["status"]),
        "gpuwarden status --json (daemon)": ([*gw, "status", "--json"], SERVED["json"]),
        "gpuwarden leaks --json (daemon)": ([*gw, "leaks", "--json"], SERVED["json"]),
    }
    out: dict[str, Any] = {}

    def timed(
        name: str, cmd: list[str], environ: dict[str, str], mark: bytes | None = None
    ) -> None:
        times, code, missed = [], None, 0
        subprocess.run(cmd, capture_output=True, env=environ, timeout=60)  # caches warm
        while len(times) < runs and missed < 5 * runs:
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, env=environ, timeout=60)
            took = time.perf_counter() - t
            code = r.returncode
            if mark is not None and mark not in r.stdout:
                missed += 1
                time.sleep(0.2)
                continue
            times.append(took)
        if times:
            out[name] = {
                "median_s": statistics.median(times),
                "min_s": min(times),
                "exit": code,
                "not_served": missed,
            }

    for name, cmd in standalone.items():
        timed(name, cmd, env)
    home = work / "status-home"
    home.mkdir()
    denv = env | {"GPUWARDEN_HOME": str(home)}
    _run([*gw, "daemon", "start"], denv, check=True)
    try:
        for name, (cmd, mark) in served.items():
            timed(name, cmd, denv, mark)
    finally:
        _run([*gw, "daemon", "stop"], denv)
    return out


# --- reporting -------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def summary_table(result: dict[str, Any]) -> str:
    rows = [
        f"{'set':<4}{'tool':<11}{'makespan':>9}{'÷bound':>7}{'mean done':>10}"
        f"{'ok':>4}{'fail':>5}{'OOM self/cap/nbr':>18}{'retries':>8}  note"
    ]
    for s, runs in result["runs"].items():
        bound = result["sets"][s]["lower_bound"]["bound_s"]
        rows.append(f"{s:<4}{'bound':<11}{bound:>9.1f}")
        for tool, r in runs.items():
            if "error" in r:
                rows.append(f"{s:<4}{tool:<11}  did not run: {r['error'][:90]}")
                continue
            o = r["ooms"]
            ms = r["makespan_s"]
            note = "cut at its deadline" if r.get("cut") else ""
            if ms is None and r.get("last_end_s") is not None:
                note = (note + f"; last ok at {r['last_end_s']:.1f} s").lstrip("; ")
            rows.append(
                f"{s:<4}{tool:<11}{_f(ms):>9}"
                f"{(_f(ms / bound, 2) if ms else '-'):>7}"
                f"{_f(r['mean_completion_s']):>10}{r['ok']:>4}"
                f"{r['failed'] + r['unfinished']:>5}"
                f"{o['self']:>8}/{o['cap']}/{o['neighbour']:<6}{r['retries']:>6}  {note}"
            )
    return "\n".join(rows)


def merge(paths: list[Path]) -> dict[str, Any]:
    """Join result files of split runs: later files win per (set, tool). Each run keeps
    the gpuwarden commit it was measured on (``rev``), as split runs may differ; the
    one-shot view timings keep the machine and commit they were measured on
    (``status_on``), as a later run may have left them out."""
    merged: dict[str, Any] = {}
    status_keys = ("status", "status_processes", "status_bytecode_cached", "status_on")
    for p in paths:
        data = json.loads(p.read_text())
        runs = merged.get("runs", {})
        sets = merged.get("sets", {})
        versions = {
            **merged.get("versions", {}),  # a tool left out of this run keeps its
            **{k: v for k, v in data.get("versions", {}).items() if v is not None},
        }
        merged.update({k: v for k, v in data.items() if k not in ("runs", "sets", *status_keys)})
        merged["versions"] = versions
        rev = data.get("versions", {}).get("gpuwarden")
        for s, tools in data.get("runs", {}).items():
            if "gpuwarden" in tools and rev:
                tools["gpuwarden"].setdefault("rev", rev)
            runs.setdefault(s, {}).update(tools)
        sets.update(data.get("sets", {}))
        merged["runs"], merged["sets"] = runs, sets
        if data.get("status"):
            merged.update({k: data[k] for k in status_keys if k in data})
            if "status_on" not in data:  # measured in this run: on its machine
                merged["status_on"] = {"gpu": data.get("gpu"), "gpuwarden": rev}
    return merged


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--sets", default="a,b,c")
    ap.add_argument("--tools", default="gpuwarden,gpusched,gflow")
    ap.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every job's duration (smoke runs: 0.3)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=540,
        help="seconds for all runs together; a run past it is cut",
    )
    ap.add_argument(
        "--deadline-factor",
        type=float,
        default=3.0,
        help="a run is cut after max(this × its bound, bound + 60 s)",
    )
    ap.add_argument("--peer-retries", type=int, default=2)
    ap.add_argument("--gs-poll", type=float, default=1.0)
    ap.add_argument("--gw-args", default="", help="extra `gpuwarden submit` options")
    ap.add_argument("--status-runs", type=int, default=5, help="0: skip the one-shot views")
    ap.add_argument(
        "--status-procs",
        type=int,
        default=2000,
        help="processes on the machine while the views are timed (idle ones "
        "are started up to this many; default 2000)",
    )
    ap.add_argument("--keep", type=Path, help="copy the work tree (logs, result files) here")
    ap.add_argument("--merge", type=Path, nargs="+", help="join these result files instead")
    args = ap.parse_args(argv)
    if args.merge:
        args.json.write_text(json.dumps(merge(args.merge), indent=1))
        return 0
    started = time.monotonic()
    facts = gpu_facts()
    baseline = gpu_used()
    all_sets = job_sets()
    result: dict[str, Any] = {
        **facts,
        "baseline_used": baseline,
        "time_scale": args.time_scale,
        "settings": {
            "peer_retries": args.peer_retries,
            "gs_poll": args.gs_poll,
            "gw_args": args.gw_args,
            "budget_s": args.budget,
            "deadline_factor": args.deadline_factor,
        },
        "versions": {
            "torch": _version("torch"),
            "gpusched": _version("gpusched"),
            "runqd": _version("runqd"),
            "nvitop": _version("nvitop"),
            "gpuwarden": _git_rev(),
        },
        "sets": {},
        "runs": {},
    }
    work = Path(tempfile.mkdtemp(prefix="gw-peers-"))
    try:
        for s in [x for x in args.sets.split(",") if x]:  # --sets "": the views alone
            jobs = scaled(all_sets[s]["jobs"], args.time_scale)
            lb = lower_bound(jobs, facts["gpu_memory"])
            result["sets"][s] = {"title": all_sets[s]["title"], "jobs": jobs, "lower_bound": lb}
            result["runs"][s] = {}
            for tool in args.tools.split(","):
                waited = drain(baseline)
                left = args.budget - (time.monotonic() - started)
                allowed = min(max(args.deadline_factor * lb["bound_s"], lb["bound_s"] + 60), left)
                if allowed < lb["bound_s"]:
                    result["runs"][s][tool] = {"error": "skipped: the budget is spent"}
                    continue
                print(
                    f"== set {s}, {tool}: {len(jobs)} jobs, bound {lb['bound_s']:.1f} s, "
                    f"deadline {allowed:.0f} s (drained {waited:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                r = run_one(tool, s, jobs, work, time.time() + allowed, args)
                r["drained_s"] = waited
                result["runs"][s][tool] = r
                brief = {
                    k: r.get(k)
                    for k in (
                        "makespan_s",
                        "mean_completion_s",
                        "ok",
                        "failed",
                        "unfinished",
                        "ooms",
                        "retries",
                        "cut",
                        "error",
                        "wall_s",
                    )
                }
                print(f"   {brief}", file=sys.stderr, flush=True)
                args.json.write_text(json.dumps(result, indent=1))
        if args.status_runs:
            crowd: list[subprocess.Popen[bytes]] = []
            try:
                _crowd(args.status_procs, crowd)
                result["status_processes"] = sum(1 for d in os.listdir("/proc") if d.isdigit())
                result["status"] = status_times(args.status_runs, work)
                result["status_bytecode_cached"] = True
            finally:
                for p in crowd:
                    p.kill()
                for p in crowd:
                    p.wait()
    finally:
        if args.keep:
            shutil.copytree(
                work,
                args.keep,
                dirs_exist_ok=True,
                copy_function=_copy_regular,
                ignore=shutil.ignore_patterns("tmux-*"),
            )
        shutil.rmtree(work, ignore_errors=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(summary_table(result))
    return 0


def _copy_regular(src: str, dst: str) -> None:
    """Copy plain files only: the work tree holds sockets (the daemons', tmux's)."""
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst)


def _git_rev() -> str | None:
    if os.environ.get("GPUWARDEN_REV"):  # gpuwarden runs from a tree other than this one
        return os.environ["GPUWARDEN_REV"]
    try:
        r = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


if __name__ == "__main__":
    raise SystemExit(main())
