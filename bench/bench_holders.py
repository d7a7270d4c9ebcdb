"""Benchmark: gpuwarden's /proc/*/fd holder scan against ``fuser -v`` on ~5,000 processes.

What it does:

1. Checks the machine's limits (RLIMIT_NPROC, pid_max, threads-max, a pids cgroup, free
   memory) and scales the process count down, with a note, if 5,000 would not fit.
2. Creates a simulated device directory (``<state>/dev/nvidia0..7``, ``nvidiactl``,
   ``nvidia-uvm``) with gpuwarden's own sim ``Registry``.
3. Starts N real idle processes in one new process group, for each population (one
   after the other): ``sleep`` processes (few memory mappings: fuser's best case) and
   forks of this interpreter that just pause (about 200 mappings, like any Python
   process). Each has /dev/null as stdin/stdout/stderr plus 1-8 ordinary files open;
   ``--holders`` of them (default 50) also hold some of the device files: most hold
   ``nvidiaK``, ``nvidiactl`` and ``nvidia-uvm`` like a CUDA process, every fifth only
   ``nvidiactl`` like a monitor. The parent closes its own copies, so exactly those
   processes hold them.
4. Alternates, round by round (the order flips every round, so drift hits all alike):
   ``scan_holders`` (the raw scan), the same scan with ``FdTables`` kept across rounds
   (what the daemon and the exporter do: a table whose descriptor count did not change
   is not read again, each is re-read within 10 s anyway), the same as a one-shot
   command does it (its last run's tables read from a file, used and written back),
   ``LiveProcesses.holders``
   (scan plus user/command of each holder, what a snapshot does) and ``fuser -v <device
   files>`` as a subprocess; plus ``/bin/true`` to show the fixed cost of starting any
   subprocess. Every round asserts that each scan and fuser found exactly the expected
   pids.
5. Kills the whole process group and reaps every child, on success, error or signal.
   Each process also exits by itself after ``--lifetime`` seconds as a last resort.

    python bench/bench_holders.py [--procs 5000] [--holders 50] [--mix both] [--rounds 11]
                                  [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from _common import machine, mem_available, ms, summarize

from gpuwarden.procs.holders import FdTables, scan_holders
from gpuwarden.procs.live import KeptFacts, LiveProcesses
from gpuwarden.sim.registry import Registry

FUSER = "/usr/bin/fuser"
GPUS = 8
# A generous guess at what one idle process costs in memory (a paused fork of this
# interpreter measures about 1.2 MiB), used only to decide whether N fit; the measured
# figure is reported afterwards.
ASSUMED_BYTES_PER_PROC = 2 * 1024 * 1024


# --------------------------------------------------------------------------- limits


def _int_file(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _tasks_now() -> int:
    """Scheduling entities (threads) that exist now: the 4th field of /proc/loadavg."""
    text = Path("/proc/loadavg").read_text().split()
    return int(text[3].split("/")[1])


def _pids_cgroup() -> tuple[int | None, int | None]:
    """(pids.max, pids.current) of this process's pids cgroup, v2 or v1, if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        hier, controllers, path = line.split(":", 2)
        if hier == "0":
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
        elif "pids" in controllers.split(","):
            base = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
        else:
            continue
        limit = _int_file(str(base / "pids.max"))
        if limit is not None:
            return limit, _int_file(str(base / "pids.current"))
    return None, None


def plan(requested: int) -> tuple[int, dict[str, Any], list[str]]:
    """How many processes to start, the limits that decided it, and notes."""
    notes: list[str] = []
    nproc_soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    pid_max = _int_file("/proc/sys/kernel/pid_max") or 32768
    threads_max = _int_file("/proc/sys/kernel/threads-max")
    tasks = _tasks_now()
    cg_max, cg_cur = _pids_cgroup()
    avail = mem_available()
    limits: dict[str, Any] = {
        "rlimit_nproc": None if nproc_soft == resource.RLIM_INFINITY else nproc_soft,
        "pid_max": pid_max,
        "threads_max": threads_max,
        "tasks_now": tasks,
        "pids_cgroup_max": cg_max,
        "pids_cgroup_current": cg_cur,
        "mem_available": avail,
        "euid": os.geteuid(),
    }
    margin = 512  # leave room for the rest of the machine
    caps: list[tuple[str, int]] = [("pid_max", pid_max - tasks - margin)]
    if threads_max:
        caps.append(("threads-max", threads_max - tasks - margin))
    if limits["rlimit_nproc"] is not None and os.geteuid() != 0:  # root is exempt
        caps.append(("ulimit -u", int(nproc_soft) - tasks - margin))
    if cg_max is not None:
        caps.append(("pids cgroup", cg_max - (cg_cur or tasks) - margin))
    if avail is not None:
        caps.append(
            (
                "memory (half of MemAvailable at 2 MiB a process)",
                avail // 2 // ASSUMED_BYTES_PER_PROC,
            )
        )
    n = requested
    for why, cap in caps:
        if cap < n:
            n = max(cap, 0)
            notes.append(f"scaled down from {requested} to {n} processes: limited by {why}")
    return n, limits, notes


# --------------------------------------------------------------------------- processes


@dataclass
class Population:
    """Idle processes in one process group; ``kill`` ends and reaps every one of them."""

    mix: str
    pgid: int | None = None
    popens: list[subprocess.Popen[bytes]] = field(default_factory=list)
    forked: list[int] = field(default_factory=list)
    holders: dict[int, tuple[str, ...]] = field(default_factory=dict)  # pid -> devices

    @property
    def size(self) -> int:
        return len(self.popens) + len(self.forked)

    def pids(self) -> list[int]:
        return [p.pid for p in self.popens] + self.forked

    def kill(self) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
        for p in self.popens:  # anything that somehow left the group
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            p.wait()
        for pid in self.forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.popens.clear()
        self.forked.clear()


def _start_sleep(keep: tuple[int, ...], pgid: int, lifetime: int) -> subprocess.Popen[bytes]:
    """``sleep LIFETIME`` in process group ``pgid`` (0: a new group led by it), inheriting
    the fds in ``keep`` plus /dev/null as stdin/stdout/stderr."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    kwargs: dict[str, Any] = {}
    if sys.version_info >= (3, 11):
        kwargs["process_group"] = pgid
    else:  # Python 3.10: slower (no vfork) but equivalent
        kwargs["preexec_fn"] = lambda: os.setpgid(0, pgid)
    return subprocess.Popen(
        [sleep, str(lifetime)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        pass_fds=keep,
        **kwargs,
    )


def _start_fork(
    keep: tuple[int, ...], pgid: int, lifetime: int, devnull: int, parent_fds: tuple[int, ...]
) -> int:
    """A fork of this interpreter that keeps only ``keep`` (and /dev/null as 0-2) and
    pauses until killed or until ``lifetime`` seconds pass (SIGALRM, default action)."""
    pid = os.fork()
    if pid == 0:  # child: never return into the benchmark, whatever happens
        try:
            os.setpgid(0, pgid)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            for std in (0, 1, 2):
                os.dup2(devnull, std)
            wanted = set(keep)
            for fd in parent_fds:
                if fd > 2 and fd not in wanted:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            signal.alarm(lifetime)
            while True:
                signal.pause()
        finally:
            os._exit(0)
    with contextlib.suppress(OSError):  # also from the parent: no race with the child
        os.setpgid(pid, pgid or pid)
    return pid


@contextlib.contextmanager
def population(
    mix: str, n: int, n_holders: int, dev: Path, files_dir: Path, lifetime: int, notes: list[str]
) -> Iterator[Population]:
    """Start ``n`` idle processes of ``mix`` ("sleep" or "python"), ``n_holders`` of them
    holding simulated device files; kill and reap all of them on the way out."""
    rng = random.Random(5000)
    files = []
    for i in range(16):
        path = files_dir / f"data-{i}.bin"
        path.write_bytes(b"x" * 64)
        files.append(path)
    ordinary = [os.open(p, os.O_RDONLY) for p in files]
    device_fds = {
        name: os.open(dev / name, os.O_RDWR)
        for name in [*(f"nvidia{i}" for i in range(GPUS)), "nvidiactl", "nvidia-uvm"]
    }
    devnull = os.open(os.devnull, os.O_RDWR)
    own = [devnull, *ordinary, *device_fds.values()]
    parent_fds = tuple(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    # Spread the holders evenly through the start order (and so through /proc).
    step = max(n // max(n_holders, 1), 1)
    holder_slots = set(range(0, n, step)[:n_holders])
    group = Population(mix)
    try:
        for i in range(n):
            keep = tuple(rng.sample(ordinary, rng.randint(1, 8)))
            held: tuple[str, ...] = ()
            if i in holder_slots:
                k = len(group.holders)
                if k % 5 == 4:  # a monitor: only the control device
                    held = ("nvidiactl",)
                else:  # a CUDA process: its GPU(s), the control device and UVM
                    gpus = {k % GPUS} | ({(k + 1) % GPUS} if k % 7 == 0 else set())
                    held = (*(f"nvidia{g}" for g in sorted(gpus)), "nvidiactl", "nvidia-uvm")
                keep += tuple(device_fds[d] for d in held)
            try:
                if mix == "sleep":
                    p = _start_sleep(keep, group.pgid or 0, lifetime)
                    pid = p.pid
                    group.popens.append(p)
                else:
                    pid = _start_fork(keep, group.pgid or 0, lifetime, devnull, parent_fds)
                    group.forked.append(pid)
            except OSError as e:
                notes.append(f"{mix}: could only start {i} of {n} processes: {e}")
                break
            if group.pgid is None:
                group.pgid = pid
            if held:
                group.holders[pid] = tuple(sorted(str(dev / d) for d in held))
        for fd in own:
            os.close(fd)
        own = []
        yield group
    finally:
        for fd in own:
            with contextlib.suppress(OSError):
                os.close(fd)
        group.kill()


# --------------------------------------------------------------------------- measuring


def fuser_pids(paths: list[str]) -> set[int]:
    """Pids that ``fuser -v`` reports for ``paths``. With -v, fuser writes the pids to
    stdout and the USER/ACCESS/COMMAND table to stderr (plus "Cannot stat" noise for
    processes it may not inspect); exit status 1 means "no process found"."""
    r = subprocess.run([FUSER, "-v", *paths], capture_output=True, check=False)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"fuser failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return {int(tok.rstrip(b"cefFrm")) for tok in r.stdout.split()}


def _proc_sizes(sample: list[int]) -> tuple[int, int, float]:
    """(processes, open fds) in all of /proc now — the size of what both tools walk — and
    the median number of memory mappings of ``sample`` (what fuser also reads)."""
    procs = fds = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        procs += 1
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{name}/fd"))
    maps = []
    for pid in sample:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", "rb") as f:
            maps.append(sum(1 for _ in f))
    return procs, fds, statistics.median(maps) if maps else math.nan


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _psutil_facts(pid: int) -> object:
    """A process's facts as LiveProcesses read them through psutil before procs/procfs.py
    (the same calls, in the same order)."""
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            facts: list[object] = [p.uids().real, p.status(), p.ppid(), p.create_time()]
            name = p.name()
            facts += [name, " ".join(p.cmdline()) or f"[{name}]"]
            facts += [frozenset(p.cpu_affinity() or ()), p.memory_info().rss, p.cpu_times()]
        pgid = os.getpgid(pid)
        facts.append(pgid == pid or psutil.Process(pgid).status() != psutil.STATUS_ZOMBIE)
        facts.append(os.getpgid(p.ppid()))
        return facts
    except (psutil.Error, OSError):
        return None


def _facts_per_process(pids: list[int], rounds: int) -> dict[str, Any]:
    """Seconds per process to read the facts a snapshot reads of a live process:
    ``LiveProcesses.info`` (procs/procfs.py; lasting facts kept, as across snapshots)
    against the same through psutil, alternating."""
    kept = KeptFacts()
    for pid in pids:
        LiveProcesses(kept).info(pid, detail=False)
    out: dict[str, list[float]] = {"procfs": [], "psutil": []}
    for r in range(rounds):
        for name in ("procfs", "psutil") if r % 2 == 0 else ("psutil", "procfs"):
            t = time.perf_counter()
            if name == "procfs":
                live = LiveProcesses(kept)
                for pid in pids:
                    live.info(pid, detail=False)
            else:
                for pid in pids:
                    _psutil_facts(pid)
            out[name].append((time.perf_counter() - t) / len(pids))
    return {"processes": len(pids), **{k: statistics.median(v) for k, v in out.items()}}


def measure(mix: str, n: int, args: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    """Start a population of ``mix``, time the tools over it in alternating rounds."""
    state = Path(tempfile.mkdtemp(prefix=f"gpuwarden-bench-holders-{mix}-"))
    try:
        registry = Registry(state)
        registry.ensure(GPUS)
        files_dir = state / "files"
        files_dir.mkdir()
        paths = sorted(str(p) for p in registry.dev_dir.iterdir())
        device_files: dict[str, int | None] = {}
        for p in paths:
            tail = p.rsplit("nvidia", 1)[1]
            device_files[p] = int(tail) if tail.isdigit() else None
        mem_before = mem_available()
        t0 = time.perf_counter()
        with population(
            mix, n, args.holders, registry.dev_dir, files_dir, args.lifetime, notes
        ) as group:
            spawn_s = time.perf_counter() - t0
            started = group.size
            mem_after = mem_available()
            per_proc = (
                None
                if mem_before is None or mem_after is None or not started
                else (mem_before - mem_after) / started
            )
            print(
                f"{mix}: started {started} processes ({len(group.holders)} holders) "
                f"in {spawn_s:.1f}s",
                file=sys.stderr,
            )
            expected = set(group.holders)
            nprocs, nfds, maps = _proc_sizes(group.pids()[:: max(started // 50, 1)])
            samples: dict[str, list[float]] = {
                "scan": [],
                "kept": [],
                "next_run": [],
                "holders": [],
                "fuser": [],
                "true": [],
            }
            paired: list[float] = []
            tables = FdTables()  # what the daemon and the exporter keep across scans

            def do_scan() -> set[int]:
                return {h.pid for h in scan_holders(device_files)}

            def do_kept() -> set[int]:
                return {h.pid for h in scan_holders(device_files, tables=tables)}

            saved = state / "fd-tables.json"

            def do_next_run() -> set[int]:
                """A one-shot command's scan: the tables its last run left, read, used
                and written back (cli/plain.backend)."""
                run = FdTables()
                run.load(saved)
                found = {h.pid for h in scan_holders(device_files, tables=run)}
                run.save(saved)
                return found

            def do_holders() -> set[int]:
                return {h.pid for h in LiveProcesses().holders(device_files)}

            def do_fuser() -> set[int]:
                return fuser_pids(paths)

            def do_true() -> None:
                subprocess.run(["/bin/true"], check=True)

            steps: list[tuple[str, Callable[[], Any]]] = [
                ("scan", do_scan),
                ("kept", do_kept),
                ("next_run", do_next_run),
                ("fuser", do_fuser),
                ("holders", do_holders),
                ("true", do_true),
            ]
            for _, fn in steps:  # untimed warm-up (dentry caches for /proc/<pid>/fd)
                fn()
            for r in range(args.rounds):
                got: dict[str, float] = {}
                for name, fn in steps if r % 2 == 0 else steps[::-1]:
                    dt, found = _timed(fn)
                    samples[name].append(dt)
                    got[name] = dt
                    if name != "true" and found != expected:
                        raise AssertionError(
                            f"{mix}: {name} found {len(found)} holders, expected "
                            f"{len(expected)}: missing {sorted(expected - found)[:10]}, "
                            f"extra {sorted(found - expected)[:10]}"
                        )
                paired.append(got["fuser"] / got["scan"])
            facts = _facts_per_process(group.pids()[:1000], args.rounds)
            # Not only the pids: the devices each one holds must be right too.
            scanned = {h.pid: h.devices for h in scan_holders(device_files)}
            if scanned != group.holders:
                raise AssertionError(f"{mix}: scan_holders reported the wrong devices")
            kept = {h.pid: h.devices for h in scan_holders(device_files, tables=tables)}
            if kept != group.holders:
                raise AssertionError(f"{mix}: the scan with kept fd tables was wrong")
            kept_tables = tables.enabled
    finally:
        shutil.rmtree(state, ignore_errors=True)
    results = {k: summarize(v) for k, v in samples.items()}
    med = {k: v["median"] for k, v in results.items()}
    return {
        "mix": mix,
        "procs": started,
        "holders": len(expected),
        "rounds": args.rounds,
        "spawn_seconds": spawn_s,
        "bytes_per_proc": per_proc,
        "proc_entries_scanned": nprocs,
        "fds_scanned": nfds,
        "maps_lines_median": maps,
        "verified": True,
        "kept_tables": kept_tables,
        "facts": facts,
        "recheck_seconds": tables.recheck,
        "results": results,
        "ratios": {
            "fuser_over_scan": med["fuser"] / med["scan"],
            "fuser_over_scan_paired": statistics.median(paired),
            "fuser_over_kept": med["fuser"] / med["kept"],
            "fuser_over_next_run": med["fuser"] / med["next_run"],
            "fuser_over_holders": med["fuser"] / med["holders"],
            "fuser_without_spawn_over_scan": (med["fuser"] - med["true"]) / med["scan"],
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    facts = machine()  # before any work, so the load average is the machine's own
    notes: list[str] = []
    n, limits, plan_notes = plan(args.procs)
    notes += plan_notes
    mixes = ["sleep", "python"] if args.mix == "both" else [args.mix]
    populations = {mix: measure(mix, n, args, notes) for mix in mixes}
    return {
        "config": {
            "requested_procs": args.procs,
            "procs": n,
            "holders": args.holders,
            "rounds": args.rounds,
            "lifetime": args.lifetime,
            "gpus": GPUS,
            "device_files": GPUS + 2,
            "mixes": mixes,
        },
        "limits": limits,
        "notes": notes,
        "populations": populations,
        "machine": facts,
    }


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: children die


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--procs", type=int, default=5000, help="processes to start per mix (default 5000)"
    )
    ap.add_argument(
        "--holders",
        type=int,
        default=50,
        help="how many of them hold simulated device files (default 50)",
    )
    ap.add_argument(
        "--mix",
        choices=("sleep", "python", "both"),
        default="both",
        help="sleep: `sleep` processes (few mappings, fuser's best case); "
        "python: forks of this interpreter (~200 mappings); both (default)",
    )
    ap.add_argument("--rounds", type=int, default=11, help="timed rounds per mix (default 11)")
    ap.add_argument(
        "--lifetime",
        type=int,
        default=600,
        help="each process exits by itself after this many seconds (default 600)",
    )
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    if not os.access(FUSER, os.X_OK):
        print(f"{FUSER} not found (install psmisc)", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    out = run(args)
    for mix, pop in out["populations"].items():
        res, ratios = pop["results"], pop["ratios"]
        print(
            f"{mix}: {pop['procs']} processes, {pop['fds_scanned']} fds, "
            f"{pop['maps_lines_median']:.0f} mappings each, {pop['holders']} holders; "
            f"{pop['rounds']} rounds"
        )
        for name in ("scan", "kept", "next_run", "holders", "fuser", "true"):
            print(
                f"  {name:8s} median {ms(res[name]['median']):>10s}  "
                f"p95 {ms(res[name]['p95']):>10s}"
            )
        print(
            f"  fuser / scan: {ratios['fuser_over_scan']:.1f}x (medians), "
            f"{ratios['fuser_over_scan_paired']:.1f}x (median of per-round ratios)"
        )
    for note in out["notes"]:
        print(f"note: {note}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
