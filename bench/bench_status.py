"""Benchmark: one-shot ``gpuwarden status`` on a simulated 8 GPU x 200 process machine.

Two views of the same work, on the scenario from ``gen_scenario.py`` (or ``--scenario``):

(a) in-process, phase by phase, ``--runs`` times: open the backend (read and validate
    the scenario), ``take_snapshot`` (join every GPU process with its facts, scan
    /proc for device-file holders), ``find_leaks``, then the two renderings the CLI
    does: ``emit_json(snapshot_json(...))`` and the tables at 80 columns.
(b) the CLI as a user runs it, as a subprocess, ``--cli-runs`` rounds of:
    ``python -c pass`` (interpreter start-up), ``gpuwarden --help`` (start-up plus the
    CLI's imports), ``gpuwarden status --json`` and ``gpuwarden status`` (table; stdout
    is not a terminal, so the table has 80 columns and no colour). The order rotates
    every round so drift on a noisy machine hits every command alike.

(c) then with a daemon running on the same scenario, ``--cli-runs`` rounds of
    ``python -c pass``, ``status --json``, ``status`` and ``leaks --json`` answered from
    the daemon's snapshots, and ``status --json --fresh`` (the client's own snapshot).

A profile of one in-process run lists where the time goes (``hotspots``).

    python bench/bench_status.py [--scenario PATH] [--runs 30] [--cli-runs 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import machine, ms, summarize
from gen_scenario import write as write_scenario

TARGET_SECONDS = 0.100  # the goal for a one-shot status
# Every module `status --json` imports, without doing any work: start-up + imports.
STATUS_IMPORTS = (
    "import gpuwarden.cli.main, gpuwarden.cli.status, gpuwarden.cli.common, "
    "gpuwarden.gpus.backend, gpuwarden.gpus.sim, gpuwarden.observe.jsonview, "
    "gpuwarden.observe.leaks, gpuwarden.observe.snapshot"
)


def _env(scenario: Path, state: Path, pycache: Path) -> dict[str, str]:
    """The subprocesses' environment: the scenario, a private sim state directory, no
    COLUMNS/LINES (so the table has 80 columns), and bytecode cached under ``pycache``:
    this environment may set PYTHONDONTWRITEBYTECODE, which would recompile gpuwarden on
    every run, whereas an installed package has its bytecode. The prefix keeps the
    .pyc files out of the source tree."""
    drop = ("COLUMNS", "LINES", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["GPUWARDEN_SIM"] = str(scenario)
    env["GPUWARDEN_SIM_STATE"] = str(state)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _in_process_once(*, json_out: bool = True, table: bool = True) -> dict[str, float]:
    """One one-shot status, phase by phase (seconds), rendering JSON and/or the table.
    Reads GPUWARDEN_SIM from the environment."""
    from gpuwarden.cli.plain import emit_json
    from gpuwarden.cli.status import render
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.observe.jsonview import snapshot_json
    from gpuwarden.observe.leaks import find_leaks
    from gpuwarden.observe.snapshot import take_snapshot
    from gpuwarden.render.ink import Ink

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    b = open_backend()
    t1 = time.perf_counter()
    snap = take_snapshot(b)
    t2 = time.perf_counter()
    leaks = find_leaks([snap])
    t3 = time.perf_counter()
    if json_out:
        with contextlib.redirect_stdout(io.StringIO()):
            emit_json(snapshot_json(snap, leaks))
    t4 = time.perf_counter()
    if table:
        io.StringIO().write("\n".join(render(snap, leaks, (), None, None, Ink(False), 80)))
    t5 = time.perf_counter()
    b.close()
    t.update(
        open_backend=t1 - t0, take_snapshot=t2 - t1, find_leaks=t3 - t2, json=t4 - t3, table=t5 - t4
    )
    t["total_json"] = t4 - t0
    t["total_table"] = (t5 - t4) + (t3 - t0)
    return t


def _package(filename: str) -> str:
    """Group a profiled function by where it lives: gpuwarden, a third-party package,
    the standard library or a C built-in."""
    if filename == "~" or filename.startswith("<"):
        return "C built-ins"
    if "/src/gpuwarden/" in filename:
        return "gpuwarden"
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    return "standard library"


def _hotspots(path: str, limit: int = 10) -> dict[str, Any]:
    """Own time by package, and the functions with the most own time, in one profiled
    in-process run of the ``path`` ("json" or "table") one-shot status."""
    prof = cProfile.Profile()
    prof.enable()
    _in_process_once(json_out=path == "json", table=path == "table")
    prof.disable()
    stats = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    raw = stats.stats  # type: ignore[attr-defined]
    rows: list[dict[str, Any]] = []
    by_package: dict[str, float] = {}
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        pkg = _package(filename)
        by_package[pkg] = by_package.get(pkg, 0.0) + tottime
        short = filename
        if "site-packages/" in filename:
            short = filename.split("site-packages/", 1)[1]
        elif "/src/" in filename:
            short = filename.split("/src/", 1)[1]
        elif "lib/python" in filename:  # the standard library: drop lib/pythonX.Y/
            short = filename.split("lib/python", 1)[1].partition("/")[2]
        where = func if short == "~" else f"{short}:{line}({func})"
        rows.append({"function": where, "calls": ncalls, "own": tottime, "cumulative": cumtime})
    rows.sort(key=lambda r: -r["own"])
    return {
        "functions": rows[:limit],
        "packages": dict(sorted(by_package.items(), key=lambda kv: -kv[1])),
    }


def in_process(runs: int) -> dict[str, Any]:
    _in_process_once()  # warm-up: imports, the sim state directory, page cache
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        for k, v in _in_process_once().items():
            samples.setdefault(k, []).append(v)
    return {k: summarize(v) for k, v in samples.items()}


def _check_outputs(
    cmds: dict[str, list[str]], env: dict[str, str], gpus: int, per_gpu: int
) -> dict[str, Any]:
    """Run each status command once, capturing output, and check that it is whole."""
    r = subprocess.run(cmds["status --json"], env=env, capture_output=True, check=True)
    data = json.loads(r.stdout)
    counts = [len(g["processes"]) for g in data["gpus"]]
    if counts != [per_gpu] * gpus:
        raise AssertionError(f"status --json shows {counts} processes per GPU")
    t = subprocess.run(cmds["status"], env=env, capture_output=True, check=True)
    table = t.stdout.decode()
    if "Processes" not in table:
        raise AssertionError("status printed no process table")
    for out in (r, t):
        if out.stderr.strip():
            print(f"stderr of {' '.join(out.args)}: {out.stderr.decode()[-300:]}", file=sys.stderr)
    return {
        "json_bytes": len(r.stdout),
        "table_bytes": len(t.stdout),
        "table_lines": table.count("\n"),
        "leaks": len(data["leaks"]),
        "holders": len(data["holders"]),
    }


def cli(rounds: int, env: dict[str, str], gpus: int, per_gpu: int) -> dict[str, Any]:
    py = sys.executable
    exe = str(Path(sys.executable).parent / "gpuwarden")
    if not os.access(exe, os.X_OK):
        exe = shutil.which("gpuwarden") or exe
    cmds: dict[str, list[str]] = {
        "python -c pass": [py, "-c", "pass"],
        "gpuwarden --help": [exe, "--help"],
        "status's imports": [py, "-c", STATUS_IMPORTS],
        "status --json": [exe, "status", "--json"],
        "status": [exe, "status"],
    }
    output = _check_outputs(cmds, env, gpus, per_gpu)
    for argv in cmds.values():  # untimed warm-up: page cache, bytecode cache
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)

    def runner(argv: list[str]) -> Callable[[], None]:
        def go() -> None:
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)

        return go

    names = list(cmds)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = runner(cmds[name])
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    out = {n: summarize(v) for n, v in samples.items()}
    shown = {
        n: " ".join([Path(c[0]).name, *(repr(a) if " " in a else a for a in c[1:])])
        for n, c in cmds.items()
    }
    shown["status's imports"] = "python -c 'import …' (every module status loads)"
    return {"commands": shown, "results": out, "output": output}


def _until_served(argv: list[str], env: dict[str, str], timeout: float = 60) -> bytes:
    """``argv`` (a ``status --json``) once the daemon answers it from its snapshot: its
    first answer after a quiet spell is the client's own, and starts the daemon's."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(argv, env=env, capture_output=True, check=True).stdout
        if b'"daemon":{"age"' in out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError("the daemon never served status")
        time.sleep(0.2)


def daemon_served(rounds: int, env: dict[str, str], gpus: int, per_gpu: int) -> dict[str, Any]:
    """The same CLI with a daemon running on the same scenario: ``status --json`` and
    ``status`` answered from its snapshot (``cli/fast.py``), beside ``python -c pass``
    and ``status --json --fresh`` (a snapshot taken by the client, the daemon running),
    and ``leaks --json`` (from the daemon's last snapshots), in rotating order. A run
    the daemon did not serve (the client took its own snapshot: the daemon did not
    answer within 100 ms) is counted in ``not_served``, not timed."""
    py = sys.executable
    exe = str(Path(sys.executable).parent / "gpuwarden")
    if not os.access(exe, os.X_OK):
        exe = shutil.which("gpuwarden") or exe
    home = Path(tempfile.mkdtemp(prefix="gw-bench-"))  # short: a unix socket path
    denv = {**env, "GPUWARDEN_HOME": str(home)}
    cmds: dict[str, list[str]] = {
        "python -c pass": [py, "-c", "pass"],
        "status --json (daemon)": [exe, "status", "--json"],
        "status (daemon)": [exe, "status"],
        "leaks --json (daemon)": [exe, "leaks", "--json"],
        "status --json --fresh (daemon running)": [exe, "status", "--json", "--fresh"],
    }
    served_mark = {
        "status --json (daemon)": b'"daemon":{"age"',
        "status (daemon)": b"from the daemon's snapshot",
        "leaks --json (daemon)": b'"daemon":{"age"',
    }
    subprocess.run([exe, "daemon", "start"], env=denv, check=True, capture_output=True)
    try:
        doc = json.loads(_until_served(cmds["status --json (daemon)"], denv))
        counts = [len(g["processes"]) for g in doc["gpus"]]
        if counts != [per_gpu] * gpus:
            raise AssertionError(f"the daemon's status shows {counts} processes per GPU")
        names = list(cmds)
        samples: dict[str, list[float]] = {n: [] for n in names}
        ages: list[float] = []
        missed = {n: 0 for n in served_mark}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.perf_counter()
                run = subprocess.run(cmds[name], env=denv, capture_output=True)
                took = time.perf_counter() - t0
                if run.returncode not in ((0, 1) if name.startswith("leaks") else (0,)):
                    raise AssertionError(f"{name}: exit {run.returncode}: {run.stderr!r}")
                if name in served_mark and served_mark[name] not in run.stdout:
                    missed[name] += 1  # the client took its own: not this path's figure
                    continue
                samples[name].append(took)
                if name == "status --json (daemon)":
                    ages.append(json.loads(run.stdout)["daemon"]["age"])
    finally:
        subprocess.run([exe, "daemon", "stop"], env=denv, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    out_ = {n: summarize(v) for n, v in samples.items()}
    shown = {n: " ".join([Path(c[0]).name, *c[1:]]) for n, c in cmds.items()}
    base = out_["python -c pass"]["median"]
    return {
        "commands": shown,
        "results": out_,
        "snapshot_age": summarize(ages),
        "not_served": missed,
        "ratio_to_python": {
            n: v["median"] / base for n, v in out_.items() if n != "python -c pass"
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--scenario", type=Path, help="scenario file (default: generate 8 GPUs x 200 processes)"
    )
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--per-gpu", type=int, default=200)
    ap.add_argument("--runs", type=int, default=30, help="in-process runs (default 30)")
    ap.add_argument(
        "--cli-runs", type=int, default=15, help="rounds of subprocess runs (default 15)"
    )
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    facts = machine()  # before any work, so the load average is the machine's own

    tmp = Path(tempfile.mkdtemp(prefix="gpuwarden-bench-status-"))
    try:
        scenario: Path = args.scenario or write_scenario(
            tmp / "scenario.json", args.gpus, args.per_gpu
        )
        env = _env(scenario.resolve(), tmp / "state", tmp / "pycache")
        os.environ.update({k: env[k] for k in ("GPUWARDEN_SIM", "GPUWARDEN_SIM_STATE")})
        data = json.loads(scenario.read_text())
        gpus = len(data["gpus"])
        per_gpu = len(data["processes"]) // gpus
        inproc = in_process(args.runs)
        hot = {path: _hotspots(path) for path in ("json", "table")}
        sub = cli(args.cli_runs, env, gpus, per_gpu)
        served = daemon_served(args.cli_runs, env, gpus, per_gpu)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    res = sub["results"]
    med = {k: v["median"] for k, v in res.items()}
    out = {
        "scenario": {
            "source": str(args.scenario)
            if args.scenario
            else f"bench/gen_scenario.py --gpus {args.gpus} --per-gpu {args.per_gpu} --seed 1",
            "sha256": hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16],
            "gpus": gpus,
            "processes": len(data["processes"]),
            "declared_holders": len(data.get("holders", [])),
        },
        "status_imports": STATUS_IMPORTS,
        "runs": args.runs,
        "cli_runs": args.cli_runs,
        "in_process": inproc,
        "hotspots": hot,
        "cli": sub,
        "daemon": served,
        "derived": {
            "import_overhead": med["gpuwarden --help"] - med["python -c pass"],
            "status_import_overhead": med["status's imports"] - med["python -c pass"],
            "status_json_work": med["status --json"] - med["status's imports"],
            "status_json_beyond_help": med["status --json"] - med["gpuwarden --help"],
            "status_table_beyond_help": med["status"] - med["gpuwarden --help"],
            "target": TARGET_SECONDS,
            "status_json_meets_target": med["status --json"] < TARGET_SECONDS,
            "status_table_meets_target": med["status"] < TARGET_SECONDS,
        },
        "machine": facts,
    }
    print(f"scenario: {gpus} GPUs, {len(data['processes'])} processes")
    print(f"in-process ({args.runs} runs), median / p95:")
    for k, v in inproc.items():
        print(f"  {k:14s} {ms(v['median']):>10s} {ms(v['p95']):>10s}")
    print(f"CLI subprocess ({args.cli_runs} rounds), median / p95:")
    for k, v in res.items():
        print(f"  {k:18s} {ms(v['median']):>10s} {ms(v['p95']):>10s}")
    print(f"with a daemon running ({args.cli_runs} rounds), median / p95, x python -c pass:")
    for k, v in served["results"].items():
        ratio = served["ratio_to_python"].get(k)
        print(
            f"  {k:38s} {ms(v['median']):>10s} {ms(v['p95']):>10s}"
            + ("" if ratio is None else f" {ratio:5.1f}x")
        )
    d = out["derived"]
    print(
        f"import overhead (--help minus python -c pass): {ms(d['import_overhead'])}; "
        f"status's imports: {ms(d['status_import_overhead'])}"
    )
    print(
        f"target {ms(TARGET_SECONDS)}: status --json "
        f"{'met' if d['status_json_meets_target'] else 'MISSED'}, status (table) "
        f"{'met' if d['status_table_meets_target'] else 'MISSED'}"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
