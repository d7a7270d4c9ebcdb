"""The environment a job gets: the submitter's, snapshotted at submit time, minus what
looks like a credential (unless the user keeps it by name). A queue should not copy
tokens into a database other people's jobs share a machine with."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SECRET = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASS$|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|"
    r"AUTH|SESSION|COOKIE|^GOOGLE_APPLICATION_CREDENTIALS$|^WANDB_API|"
    r"^GITHUB_|^GH_|^SSH_AUTH_SOCK$|^KRB5)",
    re.IGNORECASE,
)
# Never carried over: they describe the submitting shell or are set for the job by gpuwarden.
_SESSION_ONLY = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUWARDEN_MEM_LIMIT", "GPUWARDEN_JOB",
    "TERM_SESSION_ID", "WINDOWID", "DISPLAY", "XAUTHORITY", "SHLVL", "OLDPWD", "_",
})


def looks_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def snapshot_env(env: Mapping[str, str], keep: Iterable[str] = ()) -> tuple[dict[str, str],
                                                                             list[str]]:
    """(the environment for the job, the names dropped as credentials)."""
    kept = set(keep)
    out: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        if name in _SESSION_ONLY and name not in kept:
            continue
        if looks_secret(name) and name not in kept:
            dropped.append(name)
            continue
        out[name] = value
    return out, sorted(dropped)
