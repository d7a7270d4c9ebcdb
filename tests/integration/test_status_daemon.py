"""``status`` with a daemon running: answered from the daemon's snapshot (GET
/v1/snapshot) without importing a backend or click, the same tables and JSON as a
snapshot taken here plus its age; ``--fresh``, or no daemon answering, takes one here."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import EXAMPLES
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon, start_daemon


@pytest.fixture
def leaky(tmp_path: Path) -> Iterator[Daemon]:
    yield from start_daemon(tmp_path, EXAMPLES / "leaky-4gpu.json")


def _served(d: Daemon, *args: str) -> dict[str, Any]:
    """``status --json`` once the daemon serves it: its first answer after a quiet spell
    is a snapshot taken by the client, and starts the daemon's."""
    return dict(
        wait_for(
            lambda: json.loads(d.cli("status", "--json", *args, check=True).stdout),
            20,
            0.2,
            until=lambda doc: "daemon" in doc,
            what=lambda doc: f"status --json was never served by the daemon: {doc}",
        )
    )


def without_times(doc: dict[str, Any]) -> dict[str, Any]:
    """The document less what differs between two snapshots of the simulated machine:
    when it was taken and the processes' start times (which the simulator counts back
    from when the backend was opened, by the daemon long before this client)."""
    doc = {k: v for k, v in doc.items() if k not in ("taken_at", "daemon")}
    for g in doc["gpus"]:
        for p in g["processes"]:
            del p["elapsed"], p["start_time"]
    for leak in doc["leaks"]:
        del leak["start_time"]
    return doc


def test_status_json_is_the_daemons_snapshot_with_its_age(leaky: Daemon) -> None:
    served = _served(leaky)
    assert "daemon" in served, "the daemon never served status"
    assert 0 <= served["daemon"]["age"] < 5
    assert abs(time.time() - served["daemon"]["age"] - served["taken_at"]) < 5
    fresh = json.loads(leaky.cli("status", "--json", "--fresh", check=True).stdout)
    assert "daemon" not in fresh
    assert without_times(served) == without_times(fresh)
    assert served["leaks"] and served["holders"]  # the scenario's leaks, its holders


def test_filters_and_an_unknown_gpu_as_without_a_daemon(leaky: Daemon) -> None:
    _served(leaky)
    one = _served(leaky, "--gpu", "2", "--user", "bob")
    assert "daemon" in one
    assert [g["index"] for g in one["gpus"]] == [2]
    assert {p["user"] for g in one["gpus"] for p in g["processes"]} == {"bob"}
    assert without_times(one) == without_times(
        json.loads(
            leaky.cli(
                "status", "--json", "--fresh", "--gpu", "2", "--user", "bob", check=True
            ).stdout
        )
    )
    r = leaky.cli("status", "--gpu", "9")
    assert r.returncode == 2 and "no GPU with index 9" in r.stderr


@pytest.mark.parametrize("screen", [{}, {"COLUMNS": "200", "FORCE_COLOR": "1"}, {"COLUMNS": "20"}])
def test_the_table_is_the_same_with_the_snapshots_age_below(
    leaky: Daemon, screen: dict[str, str]
) -> None:
    """The daemon draws the screen for the width and colour the client asks for (a
    width too narrow for it to draw: the client draws the document itself)."""
    _served(leaky)
    env = {**leaky.env, **screen}
    for _ in range(3):  # a process's Time may tick over between the two
        served = leaky.cli("status", env=env, check=True).stdout.splitlines()
        fresh = leaky.cli("status", "--fresh", env=env, check=True).stdout.splitlines()
        if served[:-1] == fresh:
            break
    assert served[:-1] == fresh
    assert re.fullmatch(
        r"(\x1b\[2m)?from the daemon's snapshot, \d+\.\d s old \(--fresh: "
        r"take one now\)(\x1b\[0m)?",
        served[-1],
    )
    assert "Leaks (see" in "\n".join(fresh)
    assert ("\x1b[" in served[0]) == ("FORCE_COLOR" in screen)


def test_the_served_path_imports_no_backend_and_no_click(leaky: Daemon) -> None:
    _served(leaky)
    for args in (("--json",), ()):
        r = subprocess.run(
            [PY, "-X", "importtime", "-m", "gpuwarden", "status", *args],
            env=leaky.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "daemon" in r.stdout  # served: the age in the JSON or the footer
        imported = {
            line.split("|")[-1].strip()
            for line in r.stderr.splitlines()
            if line.startswith("import time:")
        }
        heavy = {
            m
            for m in imported
            if m.split(".")[0] in ("pynvml", "psutil", "click", "aiohttp", "http", "rich")
            or m.startswith(("gpuwarden.gpus", "gpuwarden.procs.live", "gpuwarden.observe"))
        }
        assert not heavy, heavy


def test_no_daemon_answering_means_a_snapshot_taken_here(leaky: Daemon) -> None:
    served = _served(leaky)
    assert "daemon" in served
    leaky.stop()
    alone = json.loads(leaky.cli("status", "--json", check=True).stdout)
    assert "daemon" not in alone and without_times(alone) == without_times(served)
    # A socket that accepts but never answers (a daemon stuck): the client does not wait.
    with tempfile.TemporaryDirectory(prefix="gw-") as tmp:
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.bind(str(Path(tmp) / "gpuwarden.sock"))
        stuck.listen(8)
        try:
            env = {**leaky.env, "GPUWARDEN_HOME": tmp}
            r = leaky.cli("status", "--json", env=env, check=True)
            assert "daemon" not in json.loads(r.stdout)
        finally:
            stuck.close()


def _leak_keys(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (lk["gpu"], lk["kind"], lk["pid"], lk["memory"], lk["user"], lk["command"])
        for lk in doc["leaks"]
    ]


def test_leaks_from_the_daemons_samples_at_once(leaky: Daemon) -> None:
    _served(leaky)

    def ask() -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        r = leaky.cli("leaks", "--json")
        return r, json.loads(r.stdout)

    r, served = wait_for(  # the daemon needs three snapshots, a second apart
        ask,
        20,
        0.3,
        until=lambda answer: "daemon" in answer[1],
        what=lambda answer: f"leaks --json was never served by the daemon: {answer[1]}",
    )
    assert r.returncode == 1, r.stderr  # leaks found: exit 1, as without a daemon
    assert served["daemon"]["samples"] == 3 and served["daemon"]["span"] >= 1.5
    alone = leaky.cli("leaks", "--json", "--samples", "3")  # sampled here: not served
    sampled = json.loads(alone.stdout)
    assert alone.returncode == 1 and "daemon" not in sampled
    assert _leak_keys(served) == _leak_keys(sampled) and served["leaks"]
    one = json.loads(leaky.cli("leaks", "--json", "--gpu", "2").stdout)
    assert "daemon" in one
    assert _leak_keys(one) == [k for k in _leak_keys(sampled) if k[0] in (2, None)]
    table = leaky.cli("leaks").stdout
    assert "Reclaim with `gpuwarden reap`" in table
    assert re.search(r"from the daemon's last 3 snapshots over \d+\.\d s", table), table
    for args, served_mark in ((["--json"], '"daemon"'), ([], "from the daemon's last")):
        r = subprocess.run(
            [PY, "-X", "importtime", "-m", "gpuwarden", "leaks", *args],
            env=leaky.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert served_mark in r.stdout
        assert not [
            line
            for line in r.stderr.splitlines()
            if re.search(r"\| +(pynvml|psutil|click|rich|gpuwarden\.gpus)\b", line)
        ]
