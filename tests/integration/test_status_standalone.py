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
