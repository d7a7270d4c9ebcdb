"""Running ``gpuwarden`` for a test: in the test's process where that is the same, and
reading a ``--json`` answer."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any


def json_answer(r: subprocess.CompletedProcess[str], args: tuple[str, ...]) -> Any:
    """A ``--json`` command's answer; ``leaks`` and ``doctor`` exit 1 when they find
    something, and their JSON is the answer then too."""
    ok = (0, 1) if args[:1] in (("leaks",), ("doctor",)) else (0,)
    if r.returncode not in ok:
        raise AssertionError(
            f"gpuwarden {' '.join(args)} --json -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        )
    return json.loads(r.stdout)


def run_in_process(
    env: dict[str, str], *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``gpuwarden ARGS`` run by this process with ``env`` (alone, as a fresh process
    would have it) and its output captured: the same words and exit status as a
    ``gpuwarden`` started for it, without the interpreter (over a thousand of them were
    a third of the suite's CPU). Only for commands that start nothing and need no
    terminal."""
    import contextlib
    import io

    from gpuwarden.cli.main import main

    # Text over bytes, as a process's own streams are (the JSON fast path writes the
    # daemon's bytes to sys.stdout.buffer).
    raw = (io.BytesIO(), io.BytesIO())
    out, err = (io.TextIOWrapper(b, encoding="utf-8", errors="replace") for b in raw)
    saved, code = dict(os.environ), 0
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out.flush()
    err.flush()
    texts = [b.getvalue().decode("utf-8", "replace") for b in raw]
    r = subprocess.CompletedProcess(["gpuwarden", *args], code, *texts)
    if check and r.returncode != 0:
        raise AssertionError(
            f"gpuwarden {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        )
    return r
