"""What ``gpuwarden top`` shows, as plain values: per-GPU memory bars split by who holds
the memory, and the rows of processes and daemon jobs. Pure functions of a Snapshot, the
leaks found over recent snapshots and the daemon's job list, so they are tested without
a terminal; ``tui/table.py`` cuts the rows into cells, ``tui/draw.py`` styles them and
the textual app places them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuwarden.observe.leaks import Leak
from gpuwarden.observe.snapshot import RUNNING, GpuView, ProcessView, Snapshot
from gpuwarden.printable import visible
from gpuwarden.units import format_bytes, format_bytes_short, format_duration

if TYPE_CHECKING:
    from gpuwarden.client.views import JobDoc

# Segment kinds of a memory bar, in the order they are drawn.
JOB, FOREIGN, LEAKED, FREE = "job", "foreign", "leaked", "free"
BAR_CHARS = {JOB: "█", FOREIGN: "▓", LEAKED: "▒", FREE: "·"}
# Leak kinds whose memory is charged to nobody who will give it back. ``other_namespace``
# is left out: a container's process is alive, just invisible here, so it counts as foreign.
LEAK_KINDS = frozenset({"unaccounted", "dead_pid", "garbage_pid", "zombie", "orphan"})
# Job colours cycle by job id, so a job keeps its colour across refreshes and GPUs.
JOB_COLORS = (
    "green",
    "cyan",
    "magenta",
    "yellow",
    "bright_blue",
    "bright_green",
    "bright_cyan",
    "bright_magenta",
)

SORTS = ("memory", "pid", "user", "gpu")
PROCESS, QUEUED_JOB = "process", "job"


def job_color(job: int) -> str:
    return JOB_COLORS[job % len(JOB_COLORS)]


def job_id_of(p: ProcessView) -> int | None:
    """The daemon job a process belongs to, from its GPUWARDEN_JOB; None if not a job."""
    raw = p.job
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw.strip())


@dataclass(frozen=True)
class Segment:
    """One stretch of a memory bar: ``bytes`` held by a job, foreign processes, leaks,
    or free; ``job`` names the job of a JOB segment."""

    kind: str
    bytes: int
    job: int | None = None

    @property
    def style(self) -> str:
        """A style key the app maps to colours: ``job:ID`` or the kind."""
        return f"job:{self.job}" if self.kind == JOB else self.kind


def memory_segments(g: GpuView, leaks: Sequence[Leak] = ()) -> list[Segment]:
    """Split a GPU's memory into job segments (one per job, by id), foreign, leaked and
    free. Leaked is what ``find_leaks`` charges to nobody on this GPU; foreign is the rest
    of the used memory (other processes, the driver's baseline). Never negative: when the
    driver's figures disagree (processes summing over ``used``) the parts are clamped."""
    leaked_pids = {
        lk.pid for lk in leaks if lk.gpu == g.index and lk.kind in LEAK_KINDS and lk.pid is not None
    }
    per_job: dict[int, int] = {}
    leaked = sum(
        max(lk.memory or 0, 0) for lk in leaks if lk.gpu == g.index and lk.kind == "unaccounted"
    )
    for p in g.processes:
        mem = max(p.memory or 0, 0)
        if p.pid in leaked_pids:
            leaked += mem
            continue
        job = job_id_of(p)
        if job is not None:
            per_job[job] = per_job.get(job, 0) + mem
    used = max(g.facts.memory_used, 0)
    total = max(g.facts.memory_total, 0)
    jobs = sum(per_job.values())
    foreign = max(used - jobs - leaked, 0)
    free = max(total - max(used, jobs + leaked), 0)
    out = [Segment(JOB, b, job) for job, b in sorted(per_job.items())]
    out += [Segment(FOREIGN, foreign), Segment(LEAKED, leaked), Segment(FREE, free)]
    return out


def bar_widths(values: Sequence[int], width: int) -> list[int]:
    """Cells per segment: proportional to ``values`` (largest remainder), summing to
    exactly ``width``, and at least one cell for every non-zero value while the widest
    segment can spare it — so a small leak stays visible."""
    width = max(width, 0)
    vals = [max(v, 0) for v in values]
    if not vals:
        return []
    total = sum(vals)
    if total == 0:
        return [0] * (len(vals) - 1) + [width]
    exact = [v * width / total for v in vals]
    cells = [int(x) for x in exact]
    order = sorted(range(len(vals)), key=lambda i: (-(exact[i] - cells[i]), i))
    for i in order[: width - sum(cells)]:
        cells[i] += 1
    for i, v in enumerate(vals):
        if v > 0 and cells[i] == 0:
            donor = max(range(len(cells)), key=lambda j: cells[j])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[i] = 1
    return cells


@dataclass(frozen=True)
class GpuLine:
    """Everything one GPU line shows."""

    index: int
    name: str
    used: int
    total: int
    utilization: int | None
    numa_node: int | None
    leaked: int
    segments: tuple[Segment, ...]


def gpu_lines(snap: Snapshot, leaks: Sequence[Leak] = ()) -> list[GpuLine]:
    out = []
    for g in snap.gpus:
        segs = tuple(memory_segments(g, leaks))
        out.append(
            GpuLine(
                index=g.index,
                name=g.facts.name.removeprefix("NVIDIA ").strip(),
                used=g.facts.memory_used,
                total=g.facts.memory_total,
                utilization=g.facts.utilization,
                numa_node=g.facts.numa_node,
                leaked=sum(s.bytes for s in segs if s.kind == LEAKED),
                segments=segs,
            )
        )
    return out


Piece = tuple[str, str]  # (text, style key: "" plain, "dim", a segment style, "mark")


def render_gpu_lines(
    lines: Sequence[GpuLine], width: int, selected: int | None = None
) -> list[list[Piece]]:
    """Each GPU as one line of at most ``width`` cells, columns aligned over GPUs:
    ``idx name [bar] used/total util% N<numa> leak <bytes>``. The bar takes what the
    other fields leave; the name goes first when the terminal is narrow, and below about
    40 columns the line is cut."""
    if not lines:
        return []
    iw = max(len(str(ln.index)) for ln in lines)
    mem = [f"{format_bytes_short(ln.used)}/{format_bytes_short(ln.total)}" for ln in lines]
    mw = max(len(m) for m in mem)
    leak = ["" if ln.leaked <= 0 else f"leak {format_bytes_short(ln.leaked)}" for ln in lines]
    lw = max(len(x) for x in leak)
    nw = max(len(str(ln.numa_node)) if ln.numa_node is not None else 1 for ln in lines)
    name_w = min(max(len(ln.name) for ln in lines), 14)
    # marker, index + gap, brackets, gap, memory, gap, util, " N", numa, " leak ..."
    fixed = 1 + iw + 1 + 2 + 1 + mw + 1 + 4 + 2 + nw + (lw + 1 if lw else 0)
    if width - fixed - name_w - 1 < 16:
        name_w = 0
    bar_w = max(width - fixed - (name_w + 1 if name_w else 0), 4)
    out: list[list[Piece]] = []
    for ln, m, lk in zip(lines, mem, leak, strict=True):
        mark = "▶" if selected == ln.index else " "
        row: list[Piece] = [(mark, "mark"), (f"{ln.index:>{iw}} ", "bold")]
        if name_w:
            name = ln.name if len(ln.name) <= name_w else ln.name[: name_w - 1] + "…"
            row.append((f"{name:<{name_w}} ", "dim"))
        row.append(("[", "dim"))
        cells = bar_widths([s.bytes for s in ln.segments], bar_w)
        for seg, n in zip(ln.segments, cells, strict=True):
            if n:
                row.append((BAR_CHARS[seg.kind] * n, seg.style))
        util = "n/a" if ln.utilization is None else f"{ln.utilization}%"
        numa = "?" if ln.numa_node is None else str(ln.numa_node)
        row += [("]", "dim"), (f" {m:>{mw}} {util:>4} N{numa:<{nw}}", "")]
        if lw:
            row.append((f" {lk:<{lw}}", LEAKED if lk else ""))
        out.append(_clip(row, width))
    return out


def _clip(pieces: list[Piece], width: int) -> list[Piece]:
    """Cut a line at ``width`` cells: on a terminal too narrow for every field the
    right-hand ones go first."""
    out: list[Piece] = []
    left = max(width, 0)
    for text, key in pieces:
        if left <= 0:
            break
        out.append((text[:left], key))
        left -= len(out[-1][0])
    return out


@dataclass(frozen=True)
class Row:
    """A row of the table: a GPU process (perhaps of a job), or a job with no process
    on any GPU yet (queued, held, reserved, starting). ``key`` is stable across refreshes
    so the cursor stays on the same row."""

    key: str
    kind: str  # PROCESS or QUEUED_JOB
    gpus: tuple[int, ...]
    pid: int | None
    user: str | None
    job: int | None
    qos: str | None
    memory: int | None  # bytes the process holds now
    budget: int | None  # the job's limit per GPU (None: not a job, or a whole GPU)
    over_budget: bool
    state: str
    command: str
    cpu: float | None = None  # host CPU % since the previous refresh (100: one core)
    rss: int | None = None  # host memory resident, bytes


@dataclass(frozen=True)
class Observation:
    """One refresh: the snapshot, the leaks over recent ones, the daemon's jobs (None:
    no daemon answered, ``daemon`` says why) or an error that stopped the snapshot."""

    snapshot: Snapshot | None
    leaks: tuple[Leak, ...] = ()
    jobs: tuple[JobDoc, ...] | None = None
    daemon: str | None = None
    error: str | None = None
    rows: tuple[Row, ...] = field(default_factory=tuple)


def cpu_percent(p: ProcessView, previous: Snapshot | None, now: float) -> float | None:
    """The process's host CPU use since ``previous`` (the same pid and start time): CPU
    seconds over wall seconds, as top and nvitop show it. None without an earlier
    sample of it."""
    if previous is None or p.info.cpu_time is None or now <= previous.taken_at:
        return None
    for g in previous.gpus:
        for q in g.processes:
            if (
                q.pid == p.pid
                and q.info.start_time == p.info.start_time
                and q.info.cpu_time is not None
            ):
                spent = max(p.info.cpu_time - q.info.cpu_time, 0.0)
                return 100.0 * spent / (now - previous.taken_at)
    return None


def _limit(job: JobDoc) -> int | None:
    """What the job may use per GPU: its enforced limit, else its budget or request."""
    enf = job.get("enforcement")
    for v in (
        enf.get("limit") if isinstance(enf, Mapping) else None,
        job.get("mem_limit"),
        job.get("budget"),
        job.get("request"),
        job.get("mem"),
    ):
        if isinstance(v, int) and v > 0:
            return v
    return None


def build_rows(
    snap: Snapshot, jobs: Sequence[JobDoc] | None, previous: Snapshot | None = None
) -> list[Row]:
    """Every GPU process (joined to its daemon job through GPUWARDEN_JOB), then every
    listed job that has no process on a GPU. ``jobs`` is the daemon's ``/v1/jobs`` list,
    or None when no daemon answers; ``previous``, the snapshot before, gives %CPU."""
    by_id: dict[int, JobDoc] = {}
    for j in jobs or ():
        if isinstance(j.get("id"), int):
            by_id[j["id"]] = j
    rows: list[Row] = []
    seen_jobs: set[int] = set()
    for g in snap.gpus:
        per_job: dict[int, int] = {}
        for p in g.processes:
            jid = job_id_of(p)
            if jid is not None:
                per_job[jid] = per_job.get(jid, 0) + (p.memory or 0)
        listed: dict[int, int] = {}  # NVML may list one pid (a garbage one) many times
        for p in g.processes:
            nth = listed[p.pid] = listed.get(p.pid, -1) + 1
            jid = job_id_of(p)
            job = by_id.get(jid) if jid is not None else None
            limit = _limit(job) if job is not None else None
            if jid is not None:
                seen_jobs.add(jid)
            state = p.state
            if state == RUNNING and job is not None:
                state = str(job.get("state") or RUNNING)
            rows.append(
                Row(
                    key=f"p:{g.index}:{p.pid}" + (f":{nth}" if nth else ""),
                    kind=PROCESS,
                    gpus=(g.index,),
                    pid=p.pid,
                    user=p.user,
                    job=jid,
                    qos=None if job is None else job.get("qos"),
                    memory=p.memory,
                    budget=limit,
                    over_budget=(limit is not None and jid is not None and per_job[jid] > limit),
                    state=state,
                    command=visible(p.command or "?"),
                    cpu=cpu_percent(p, previous, snap.taken_at),
                    rss=p.info.rss,
                )
            )
    for jid, j in by_id.items():
        if jid in seen_jobs:
            continue
        gpus = tuple(x for x in (j.get("gpus") or ()) if isinstance(x, int))
        command = " ".join(str(c) for c in j.get("command") or ())
        reason = j.get("reason")
        rows.append(
            Row(
                key=f"j:{jid}",
                kind=QUEUED_JOB,
                gpus=gpus,
                pid=None,
                user=j.get("user"),
                job=jid,
                qos=j.get("qos"),
                memory=None,
                budget=_limit(j),
                over_budget=False,
                state=str(j.get("state") or "?"),
                command=visible(f"{reason} · {command}" if reason else command),
            )
        )  # as `ps` does
    return rows


def filter_rows(
    rows: Sequence[Row], *, user: str | None = None, gpu: int | None = None
) -> list[Row]:
    """Rows of ``user`` (exact name) on ``gpu``. A job not placed yet is on no GPU, so a
    GPU filter hides it."""
    return [r for r in rows if (not user or r.user == user) and (gpu is None or gpu in r.gpus)]


def sort_rows(rows: Sequence[Row], by: str) -> list[Row]:
    """``memory``: largest first, jobs without a process last; ``pid``, ``user``,
    ``gpu``: ascending. Ties keep a stable, readable order (GPU, then pid/job)."""

    def base(r: Row) -> tuple[int, int, int]:
        return (
            r.gpus[0] if r.gpus else 1 << 30,
            r.pid if r.pid is not None else 1 << 62,
            r.job or 0,
        )

    if by == "memory":
        return sorted(rows, key=lambda r: (r.memory is None, -(r.memory or 0), base(r)))
    if by == "pid":
        return sorted(rows, key=lambda r: (r.pid is None, r.pid or 0, r.job or 0))
    if by == "user":
        return sorted(rows, key=lambda r: (r.user is None, r.user or "", base(r)))
    if by == "gpu":
        return sorted(rows, key=base)
    raise ValueError(f"unknown sort {by!r}")


def process_details(snap: Snapshot, gpu: int, pid: int) -> list[tuple[str, str]]:
    """What we know about one GPU process, as (label, value) lines."""
    g = snap.gpu(gpu)
    p = next((x for x in (g.processes if g else ()) if x.pid == pid), None)
    if g is None or p is None:
        return [("gone", f"pid {pid} is no longer listed on GPU {gpu}")]
    i = p.info
    out = [
        ("pid", str(p.pid)),
        ("gpu", f"{gpu} ({g.facts.name})"),
        ("state", p.state),
        ("user", f"{i.user or '?'}" + ("" if i.uid is None else f" (uid {i.uid})")),
        ("command", p.command or "?"),
        ("memory", format_bytes(p.memory)),
        ("sm", "n/a" if p.gpu.sm_utilization is None else f"{p.gpu.sm_utilization}%"),
        ("kinds", ", ".join(p.gpu.kinds)),
        ("running for", format_duration(p.elapsed)),
    ]
    if p.container:
        out.append(("container", p.container))
    if p.job:
        out.append(("gpuwarden job", p.job))
    if i.ppid is not None:
        out.append(("parent", f"{i.ppid} (process group {i.pgid})"))
    if i.cpus_allowed is not None:
        from gpuwarden.gpus.topology import format_cpulist

        out.append(("cpus allowed", format_cpulist(sorted(i.cpus_allowed))))
    if i.namespace_hint:
        out.append(("namespace", i.namespace_hint))
    for k, v in sorted((i.env or {}).items()):
        out.append((k, v))
    return [(visible(k), visible(v)) for k, v in out]  # command lines, environments


def job_details(j: JobDoc) -> list[tuple[str, str]]:
    """A job as ``gpuwarden show`` prints it (the same lines)."""
    from gpuwarden.jobs.request import OPTION_DEFAULTS
    from gpuwarden.render.jobtext import job_lines

    return job_lines(j, OPTION_DEFAULTS)
