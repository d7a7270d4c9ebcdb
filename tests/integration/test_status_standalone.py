"""``status`` with no daemon answering: the snapshot is taken here, without click
(``cli/statusonce.py``), and prints what the click command prints (``--fresh`` goes
that way), errors included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.sim import SimMachine
from tests.integration.test_status_daemon import without_times


def _env(m: SimMachine, home: Path) -> dict[str, str]:
    return {**m.env, "GPUWARDEN_HOME": str(home)}  # a home where no daemon runs


def _same_screen(m: SimMachine, env: dict[str, str], *args: str) -> list[str]:
    for _ in range(3):  # a process's Time may tick over between the two
        plain = m.cli("status", *args, env=env, check=True).stdout.splitlines()
        fresh = m.cli("status", "--fresh", *args, env=env, check=True).stdout.splitlines()
        if plain == fresh:
            break
    assert plain == fresh
    return plain


def test_the_table_and_json_are_the_click_commands(make_sim: Any, tmp_path: Path) -> None:
    m = make_sim("leaky-4gpu.json")
    env = _env(m, tmp_path)
    screen = _same_screen(m, env)
    assert "Leaks (see" in "\n".join(screen)
    assert _same_screen(m, env, "--gpu", "2", "--user", "bob")
    assert _same_screen(m, {**env, "COLUMNS": "200", "FORCE_COLOR": "1"})[0].startswith("\x1b[")
    plain = json.loads(m.cli("status", "--json", "--gpu", "1", env=env, check=True).stdout)
    fresh = json.loads(
        m.cli("status", "--json", "--gpu", "1", "--fresh", env=env, check=True).stdout
    )
    assert [g["index"] for g in plain["gpus"]] == [1]
    assert without_times(plain) == without_times(fresh)


def test_without_click_and_the_same_errors(make_sim: Any, tmp_path: Path) -> None:
    m = make_sim("leaky-4gpu.json")
    env = _env(m, tmp_path)
    for args in (("--json",), ()):
        r = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "gpuwarden", "status", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        imported = {
            line.split("|")[-1].strip()
            for line in r.stderr.splitlines()
            if line.startswith("import time:")
        }
        assert "GPU" in r.stdout
        heavy = {"click", "rich", "aiohttp"}
        assert not {name for name in imported if name.split(".")[0] in heavy}
    for shape in ((), ("--json",)):
        plain, fresh = (
            m.cli("status", *shape, *extra, "--gpu", "9", env=env) for extra in ((), ("--fresh",))
        )
        assert (
            (plain.returncode, plain.stderr)
            == (fresh.returncode, fresh.stderr)
            == (2, "gpuwarden: error: no GPU with index 9 (GPUs here: 0, 1, 2, 3)\n")
        )
        assert plain.stdout == ""
    bad = m.cli("status", "--pid", "x", env=env)  # refused by click, as before
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_each_run_leaves_its_fd_tables_to_the_next(make_sim: Any, tmp_path: Path) -> None:
    """``watch -n 1 gpuwarden status``: each run reads only the fd tables that changed
    since the last one's (procs/holders.py), and says the same as a run without them."""
    m = make_sim("leaky-4gpu.json")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**_env(m, tmp_path / "home"), "XDG_RUNTIME_DIR": str(runtime)}
    m.cli("gpu", "mode", "0", "exclusive", env=env, check=True)  # a dry run: it never scans
    assert not (runtime / "gpuwarden").exists()  # so it leaves nothing, not even a folder
    first = json.loads(m.cli("status", "--json", env=env, check=True).stdout)
    saved = runtime / "gpuwarden" / "fd-tables.json"
    assert saved.is_file() and saved.stat().st_mode & 0o777 == 0o600
    again = json.loads(m.cli("status", "--json", env=env, check=True).stdout)
    alone = {k: v for k, v in env.items() if k != "XDG_RUNTIME_DIR"}
    alone["XDG_CACHE_HOME"] = str(tmp_path / "no-such-dir")  # nowhere to keep them
    without = json.loads(m.cli("status", "--json", env=alone, check=True).stdout)
    assert first["holders"]  # the scenario's device-file holders, found each time
    assert without_times(first) == without_times(again) == without_times(without)
