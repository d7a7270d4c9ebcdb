"""The environment a job gets: the submitter's, snapshotted at submit time, minus what
looks like a credential (unless the user keeps it by name). A queue should not copy
tokens into a database other people's jobs share a machine with."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Words (between underscores, or at either end of the name) that mark a credential:
# HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, OPENAI_API_KEY, SSH_AUTH_SOCK. Whole
# words, not substrings: TIKTOKEN_CACHE_DIR, KEYBOARD_LAYOUT and PASSTHROUGH are kept.
_SECRET_WORDS = frozenset(
    {
        "TOKEN",
        "TOKENS",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWORDS",
        "PASSWD",
        "PASS",
        "PASSPHRASE",
        "KEY",
        "KEYS",
        "APIKEY",
        "ACCESSKEY",
        "PRIVATEKEY",
        "CREDENTIAL",
        "CREDENTIALS",
        "CREDS",
        "AUTH",
        "SESSION",
        "COOKIE",
        "COOKIES",
    }
)
# Whole names, or name prefixes, of well-known credential carriers.
_SECRET_PREFIX = re.compile(
    r"^(GITHUB_|GH_|KRB5|WANDB_API|GOOGLE_APPLICATION_CREDENTIALS$)", re.IGNORECASE
)


# Never carried over: they describe the submitting shell or are set for the job by gpuwarden.
_SESSION_ONLY = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "GPUWARDEN_MEM_LIMIT",
        "GPUWARDEN_JOB",
        "GPUWARDEN_ARRAY_ID",
        "GPUWARDEN_ARRAY_INDEX",
        "TERM_SESSION_ID",
        "WINDOWID",
        "DISPLAY",
        "XAUTHORITY",
        "SHLVL",
        "OLDPWD",
        "_",
    }
)


def looks_secret(name: str) -> bool:
    """Whether ``name`` has a credential word (``_SECRET_WORDS``) or prefix."""
    return bool(_SECRET_PREFIX.match(name)) or any(
        w in _SECRET_WORDS for w in name.upper().split("_")
    )


def snapshot_env(
    env: Mapping[str, str], keep: Iterable[str] = ()
) -> tuple[dict[str, str], list[str]]:
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
