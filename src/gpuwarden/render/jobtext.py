"""One job as people read it (``gpuwarden show`` and the details page of ``top``): label
and text pairs from the daemon's JSON for a job. Missing fields read as absent, so an
older daemon's answer still renders."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from gpuwarden.printable import visible
from gpuwarden.units import format_bytes

if TYPE_CHECKING:
    from gpuwarden.client.views import JobDoc


def _b(v: Any) -> str:
    return format_bytes(v) if isinstance(v, int) else "n/a"


def _service_text(j: JobDoc, svc: Mapping[str, Any]) -> str:
    """A service's restart policy, restarts and health: what ``show`` says of it."""
    from gpuwarden.units import format_duration

    def d(v: Any) -> str:
        return format_duration(v) if isinstance(v, (int, float)) else "n/a"

    text = (
        f"restart {svc.get('restart')}, {j.get('restarts') or 0} restart(s) so far "
        f"(limit {svc.get('restart_limit')} in {d(svc.get('restart_window'))})"
    )
    what = (
        f"command {svc['health_cmd']!r}"
        if svc.get("health_cmd")
        else f"GET {svc['health_url']}"
        if svc.get("health_url")
        else None
    )
    if what is None:
        return text + "; no health check"
    text += (
        f"; health: {what} every {d(svc.get('health_interval'))} after "
        f"{d(svc.get('health_grace'))}, {j.get('health_failures') or 0} failure(s)"
    )
    last = [e for e in j.get("events") or () if e.get("kind") == "health_failed"]
    return text + (f", last {last[-1].get('at')}: {last[-1].get('detail')}" if last else "")


def fair_text(user: Any, fair: Mapping[str, Any]) -> str:
    """A user's fair-share usage (byte-seconds) as GiB-hours, and how fast it fades."""
    from gpuwarden.units import GiB, format_duration

    usage = fair.get("usage") or 0.0
    halflife = fair.get("halflife") or 0.0
    return (
        f"{user} used {usage / GiB / 3600:.2f} GiB·h lately (half of it gone every "
        f"{format_duration(halflife)})"
    )


def option_lines(j: JobDoc, options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A line for each field of the options document (``options``: each one's name and
    default, jobs/request.OPTION_DEFAULTS) that is not its default, under its name:
    such a field needs no line of its own here."""
    doc = cast(Mapping[str, Any], j)
    out = []
    for name, default in options.items():
        value = doc.get(name)
        if value is None or value == default or value == []:
            continue
        if isinstance(value, list):
            text = ", ".join(map(str, value))
        else:
            text = "yes" if value is True else "no" if value is False else str(value)
        out.append((name.replace("_", " "), text))
    return out


def job_lines(j: JobDoc, options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Request, placement, memory, QoS, times, limits, release, then ("events", "") and
    one ("", text) per event. A ("", text) before "events" continues the line above.
    Every text has its control characters made visible (it carries user-supplied
    names, commands, reasons and event details)."""
    out = [
        (
            "job",
            f"{j.get('id')}  {j.get('state')}  user {j.get('user')}"
            + (f"  name {j['name']}" if j.get("name") else "")
            + (f"  group {j['group']}" if j.get("group") else ""),
        ),
        ("command", shlex.join(str(c) for c in j.get("command") or ())),
        ("cwd", str(j.get("cwd"))),
    ]
    if j.get("attach"):
        out.append(
            (
                "started by",
                f"{j['attach']} (attached: it starts and ends the "
                "command; the daemon places and watches it)",
            )
        )
    gpus = ",".join(map(str, j.get("gpus") or ())) or "-"
    out.append(("gpus", f"{gpus} (asked {j.get('gpu_count')})"))
    context = f" + {_b(j['context'])} CUDA context" if j.get("context") else ""
    mem = (
        f"declared {_b(j['mem']) if j.get('mem') else 'whole GPU'}, reserved "
        f"{_b(j.get('budget'))}{context}, peak {_b(j.get('peak_memory'))}"
    )
    if j.get("mem_limit"):
        mem += f", limit {_b(j['mem_limit'])}"
    if j.get("request") and j.get("request") != j.get("mem"):
        mem += f", retry budget {_b(j['request'])}"
    out.append(("memory", mem))
    for said in ("oom_end", "declared_vs_peak"):
        if j.get(said):
            out.append(("", str(j[said])))
    qos = f"{j.get('qos', 'burstable')}, priority {j.get('priority')}"
    if j.get("preemptions"):
        qos += f", preempted {j['preemptions']}x"
    if j.get("retries"):
        qos += f", OOM retries {j.get('oom_retries')}/{j['retries']}"
    out.append(("qos", qos))
    svc = j.get("service")
    if isinstance(svc, Mapping):
        out.append(("service", _service_text(j, svc)))
    fair = j.get("fair_share")
    if isinstance(fair, Mapping):
        out.append(
            (
                "fair share",
                fair_text(j.get("user"), fair)
                + ": at equal priority and QoS, jobs of users who used less go first",
            )
        )
    arr = j.get("array")
    if isinstance(arr, Mapping):
        out.append(
            (
                "array",
                f"task {arr.get('task')} (index {arr.get('index')} of array "
                f"{arr.get('id')}"
                + ("" if arr.get("limit") is None else f", at most {arr['limit']} tasks at once")
                + ")",
            )
        )
    if j.get("notify"):
        out.append(("notify", f"{j['notify']} (run as its user once it ends)"))
    out += option_lines(j, options)
    oom = j.get("oom")
    if isinstance(oom, Mapping):
        asked = ([f"its message asked for {_b(oom['tried'])}"] if oom.get("tried") else []) + (
            [f"it needs {_b(oom['need'])}"] if oom.get("need") else []
        )
        out.append(
            (
                "last OOM",
                ", ".join(asked or ["its message said no size"])
                + f"; the retry got {_b(oom.get('retry_budget'))}",
            )
        )
    est = j.get("estimate")
    if isinstance(est, Mapping) and est.get("how"):
        out.append(("expected run", str(est["how"])))  # what backfill plans with
    for label, when in (
        ("submitted", j.get("submitted_at")),
        ("started", j.get("started_at")),
        ("ended", j.get("ended_at")),
    ):
        if when:
            out.append((label, str(when)))
    enf = j.get("enforcement")
    if isinstance(enf, Mapping) and enf.get("limit"):
        layers = [
            str(x)
            for x in (
                enf.get("cooperative"),
                enf.get("hard"),
                enf.get("watchdog") and f"watchdog: {enf['watchdog']}",
            )
            if x
        ]
        out.append(("limit", f"{_b(enf['limit'])} per GPU: " + "; ".join(layers)))
    if j.get("exit_code") is not None:
        out.append(("exit code", str(j["exit_code"])))
    if j.get("reason"):
        out.append(("reason", str(j["reason"])))
    rel = j.get("memory_release")
    if isinstance(rel, Mapping) and rel.get("said"):
        out.append(("release", str(rel["said"])))
    out.append(("events", ""))
    for e in j.get("events") or ():
        out.append(
            (
                "",
                f"{e.get('at')}  {e.get('kind')}" + (f"  {e['detail']}" if e.get("detail") else ""),
            )
        )
    return [(label, visible(text)) for label, text in out]
