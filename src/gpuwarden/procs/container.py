"""Which container a process runs in, from its cgroup path."""

from __future__ import annotations

import re

# Container ids are 64 hex digits in every runtime's cgroup naming:
#   /docker/<id>, /system.slice/docker-<id>.scope, cri-containerd-<id>.scope,
#   libpod-<id>.scope (podman), /kubepods/.../pod<uid>/<id>, crio-<id>.scope
_ID = r"([0-9a-f]{64})"
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("docker", re.compile(r"docker[-/]" + _ID)),
    ("containerd", re.compile(r"cri-containerd-" + _ID)),
    ("crio", re.compile(r"crio-(?:conmon-)?" + _ID)),
    ("podman", re.compile(r"libpod-(?:conmon-)?" + _ID)),
)
_UID = r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
_KUBEPOD = re.compile(r"kubepods[^\n]*?pod" + _UID)
_KUBE_CONTAINER = re.compile(r"kubepods[^\n]*/(?:[a-z-]*?-)?" + _ID)


def container_from_cgroup(text: str) -> str | None:
    """Return ``runtime:shortid`` (or ``k8s:pod-uid/shortid``) for a /proc/PID/cgroup text,
    or None for a process outside any container."""
    pod = _KUBEPOD.search(text)
    if pod:
        uid = pod.group(1).replace("_", "-")
        cid = _KUBE_CONTAINER.search(text)
        return f"k8s:{uid}" + (f"/{cid.group(1)[:12]}" if cid else "")
    for runtime, pattern in _PATTERNS:
        m = pattern.search(text)
        if m:
            return f"{runtime}:{m.group(1)[:12]}"
    return None


def read_container(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return container_from_cgroup(f.read())
    except OSError:
        return None
