"""Write bench/RESULTS.md from the JSON that bench_status.py and bench_holders.py wrote.

Every figure in RESULTS.md comes from those files; the prose around them is fixed.
Run through ``bench/run.sh``, which passes the exact commands it ran."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import ms

MIN_RATIO = 5.0  # the goal: the scan at least 5x faster than fuser


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB"


def _num(v: int | None, none: str) -> str:
    return none if v is None else f"{v:,}"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _machine(m: dict[str, Any]) -> list[str]:
    return [
        "| | |", "|---|---|",
        f"| CPUs (nproc) | {m['nproc']} |",
        f"| CPU model | {m['cpu_model']} |",
        f"| Kernel | {m['kernel']} |",
        f"| Python | {m['python_impl']} {m['python']} |",
        f"| Memory | {_gib(m['mem_total'])} |",
        f"| fuser | {m['fuser']} |",
        f"| /proc/loadavg before the status benchmark | `{m['loadavg']}` |",
    ]


def _status(s: dict[str, Any]) -> list[str]:
    sc, inproc, cli, d = s["scenario"], s["in_process"], s["cli"], s["derived"]
    out = [
        "## 1. One-shot `gpuwarden status`",
        "",
        f"Scenario: `{sc['source']}` — {sc['gpus']} GPUs with "
        f"{sc['processes'] // sc['gpus']} processes **per GPU** ({sc['processes']:,} GPU "
        f"processes in all, distinct pids) plus {sc['declared_holders']} declared "
        f"device-file holders; users, commands, containers and every leak kind mixed in "
        f"(content hash `{sc['sha256']}`). The CLI printed {cli['output']['leaks']} leaks, "
        f"{cli['output']['json_bytes']:,} bytes of JSON and {cli['output']['table_lines']:,} "
        "table lines.",
        "",
        "**What this measures.** (a) In-process, each phase of one status, repeated: "
        "opening the simulated backend (reading and validating the scenario), "
        "`take_snapshot` (joining every GPU process with its process facts and scanning "
        "/proc for device-file holders), `find_leaks`, and the two renderings — "
        "`emit_json(snapshot_json(...))` and the rich tables at 80 columns. "
        "(b) The CLI as a user runs it, as a subprocess, wall time including interpreter "
        "start-up and imports; `python -c pass`, `gpuwarden --help` and a bare import of "
        "every module `status` loads are the baselines that separate start-up and import "
        "cost from work. The commands run in rotating order round by round, so drift on "
        "this shared machine falls on all of them alike. Subprocesses run with bytecode "
        "cached (a private `PYTHONPYCACHEPREFIX`), as an installed package would.",
        "",
        f"### (a) In-process, {s['runs']} runs",
        "",
        "| Phase | median | p95 | min |", "|---|---:|---:|---:|",
    ]
    names = {"open_backend": "open backend (load scenario)", "take_snapshot": "take_snapshot",
             "find_leaks": "find_leaks", "json": "JSON (snapshot_json + emit_json)",
             "table": "table (render + rich print, 80 cols)",
             "total_json": "**total, --json path**", "total_table": "**total, table path**"}
    for key, label in names.items():
        v = inproc[key]
        out.append(f"| {label} | {ms(v['median'])} | {ms(v['p95'])} | {ms(v['min'])} |")
    out += ["", f"### (b) CLI as a subprocess, {s['cli_runs']} rounds", "",
            "| Command | median | p95 | min |", "|---|---:|---:|---:|"]
    for name, v in cli["results"].items():
        out.append(f"| `{cli['commands'][name]}` | {ms(v['median'])} | {ms(v['p95'])} | "
                   f"{ms(v['min'])} |")
    out += [
        "",
        f"- Import overhead of the CLI (`gpuwarden --help` − `python -c pass`): "
        f"{ms(d['import_overhead'])}; of everything `status` imports: "
        f"{ms(d['status_import_overhead'])}.",
        f"- Work done by `status --json` beyond start-up and imports: "
        f"{ms(d['status_json_work'])}.",
        f"- Goal, one-shot status well under {ms(d['target'])}: `status --json` "
        f"{_verdict(d['status_json_meets_target'])}, `status` (table) "
        f"{_verdict(d['status_table_meets_target'])}.",
        "",
        f"The import baseline is `python -c \"{s['status_imports']}\"`.",
        "",
        "Where the time goes, from one profiled in-process run of each path (profiling "
        "inflates many small calls, so read these as shares, not times).",
    ]
    for path, title in (("json", "`status --json` path"), ("table", "`status` (table) path")):
        hot = s["hotspots"][path]
        shares = ", ".join(f"{pkg} {ms(t)}" for pkg, t in hot["packages"].items()
                           if t >= 0.001)
        out += ["", f"{title} — own time by package: {shares}.", "",
                "| Function | calls | own | cumulative |", "|---|---:|---:|---:|"]
        for h in hot["functions"][:8]:
            fn = h["function"].replace("|", "\\|")
            out.append(f"| `{fn}` | {h['calls']:,} | {ms(h['own'])} | "
                       f"{ms(h['cumulative'])} |")
    return out


def _holders(h: dict[str, Any]) -> list[str]:
    cfg = h["config"]
    out = [
        "## 2. /dev/nvidia* holder scan vs `fuser -v`",
        "",
        "**What this measures.** The time to find every process holding one of the "
        f"{cfg['device_files']} NVIDIA device files (simulated: `<state>/dev/nvidia0..7`, "
        "`nvidiactl`, `nvidia-uvm`) among about "
        f"{cfg['requested_procs']:,} real processes. Each population is a process group of "
        "idle processes, each with /dev/null as stdin/stdout/stderr plus 1-8 ordinary "
        f"files open; {cfg['holders']} of them also hold device files (most a GPU, "
        "`nvidiactl` and `nvidia-uvm` like a CUDA process, every fifth only `nvidiactl` "
        "like a monitor). Timed side by side, alternating order every round: "
        "`scan_holders` (gpuwarden's raw /proc/*/fd scan, in-process), "
        "`LiveProcesses.holders` (the scan plus user and command of each holder, what a "
        "snapshot does), `fuser -v <device files>` as a subprocess, and `/bin/true` (the "
        "fixed cost of starting any subprocess, included in fuser's figure). Every round "
        "asserts that the scan, the snapshot path and fuser found exactly the expected "
        "pids (and the scan exactly the expected devices per pid). fuser also reads each "
        "process's memory mappings (`/proc/<pid>/maps`) and cwd/root/exe, so its cost "
        "grows with the size of the processes, while the scan's grows only with their open "
        "files: hence two populations. `sleep` processes have few mappings — fuser's "
        "best case; forks of the benchmark's Python interpreter have several times more "
        "(see the table), still far fewer than a CUDA/PyTorch process (thousands).",
        "",
        "| | " + " | ".join(f"`{m}` population" for m in h["populations"]) + " |",
        "|---|" + "---:|" * len(h["populations"]),
    ]
    pops = list(h["populations"].values())

    def row(label: str, fn: Any) -> str:
        return f"| {label} | " + " | ".join(fn(p) for p in pops) + " |"

    out += [
        row("processes started", lambda p: f"{p['procs']:,}"),
        row("/proc entries / open fds scanned", lambda p: f"{p['proc_entries_scanned']:,} / "
            f"{p['fds_scanned']:,}"),
        row("mappings per process (median)", lambda p: f"{p['maps_lines_median']:.0f}"),
        row("holders (verified every round)", lambda p: f"{p['holders']}"),
        row("memory per process", lambda p: "n/a" if p["bytes_per_proc"] is None
            else f"{p['bytes_per_proc'] / 2**20:.2f} MiB"),
        row("start-up of the population", lambda p: f"{p['spawn_seconds']:.1f} s"),
        row("timed rounds", lambda p: f"{p['rounds']}"),
    ]
    labels = {"scan": "`scan_holders`", "holders": "`LiveProcesses.holders`",
              "fuser": "`fuser -v`", "true": "`/bin/true` (spawn cost)"}
    for key, label in labels.items():
        out.append(row(f"{label} median (p95)", lambda p, k=key: (
            f"{ms(p['results'][k]['median'])} ({ms(p['results'][k]['p95'])})")))
    out += [
        row("**fuser ÷ scan** (medians)", lambda p: f"**{p['ratios']['fuser_over_scan']:.1f}×**"),
        row("fuser ÷ scan (median of per-round ratios)",
            lambda p: f"{p['ratios']['fuser_over_scan_paired']:.1f}×"),
        row("fuser ÷ snapshot path", lambda p: f"{p['ratios']['fuser_over_holders']:.1f}×"),
        row("(fuser − spawn) ÷ scan",
            lambda p: f"{p['ratios']['fuser_without_spawn_over_scan']:.1f}×"),
        row(f"goal ≥ {MIN_RATIO:.0f}×",
            lambda p: _verdict(p["ratios"]["fuser_over_scan"] >= MIN_RATIO)),
        "",
    ]
    lim = h["limits"]
    out.append(
        f"Limits checked before starting: pid_max {lim['pid_max']:,}, threads-max "
        f"{_num(lim['threads_max'], 'n/a')}, tasks already running {lim['tasks_now']}, ulimit -u "
        f"{_num(lim['rlimit_nproc'], 'unlimited')}"
        f"{' (not enforced for root)' if lim['euid'] == 0 else ''}, pids cgroup max "
        f"{_num(lim['pids_cgroup_max'], 'none')}, MemAvailable {_gib(lim['mem_available'])}.")
    notes = h["notes"] or [f"no scaling needed: {cfg['procs']:,} processes per population."]
    out += ["", *[f"- {n}" for n in notes]]
    return out


def _summary(status: dict[str, Any], holders: dict[str, Any]) -> list[str]:
    res, d = status["cli"]["results"], status["derived"]
    sc = status["scenario"]
    out = [
        f"- One-shot `gpuwarden status --json` on {sc['gpus']} GPUs × "
        f"{sc['processes'] // sc['gpus']} processes: {ms(res['status --json']['median'])} "
        f"median, `gpuwarden status` (table) {ms(res['status']['median'])}; goal "
        f"< {ms(d['target'])}: {_verdict(d['status_json_meets_target'])} / "
        f"{_verdict(d['status_table_meets_target'])}.",
    ]
    for mix, p in holders["populations"].items():
        r = p["ratios"]["fuser_over_scan"]
        out.append(
            f"- Holder scan over {p['procs']:,} `{mix}` processes: "
            f"{ms(p['results']['scan']['median'])} vs `fuser -v` "
            f"{ms(p['results']['fuser']['median'])}, **{r:.1f}×**; goal ≥ {MIN_RATIO:.0f}×: "
            f"{_verdict(r >= MIN_RATIO)}.")
    return out


def render(status: dict[str, Any], holders: dict[str, Any], commands: list[str]) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# gpuwarden benchmark results",
        "",
        f"Generated by `bench/run.sh` on {now}. Do not edit by hand: rerun the script, "
        "which rewrites this file. Figures are wall-clock times on the machine below; "
        "compare ratios across machines, not absolute times.",
        "",
        "## Summary",
        "",
        *_summary(status, holders),
        "",
        "## Machine",
        "",
        *_machine(status["machine"]),
        f"| /proc/loadavg before the holder benchmark | `{holders['machine']['loadavg']}` |",
        "",
        "## Commands",
        "",
        "```",
        *commands,
        "```",
        "",
        *_status(status),
        "",
        *_holders(holders),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--status", type=Path, required=True)
    ap.add_argument("--holders", type=Path, required=True)
    ap.add_argument("--command", action="append", default=[],
                    help="a command that produced the figures (repeatable)")
    ap.add_argument("-o", "--output", type=Path, help="default: stdout")
    args = ap.parse_args(argv)
    text = render(json.loads(args.status.read_text()), json.loads(args.holders.read_text()),
                  args.command)
    if args.output:
        tmp = args.output.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.output)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
