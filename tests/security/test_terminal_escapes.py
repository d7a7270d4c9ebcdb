"""A job's name, group and command are printed to other users' terminals: ``ps``,
``show`` and ``top``. A raw ESC there clears B's screen (``ESC[2J``), writes B's
clipboard (``ESC]52;c;...BEL``) or overwrites the line (CR). Every such string is printed
with its control characters made visible; ``--json`` stays exact."""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden.observe.snapshot import Snapshot
from gpuwarden.tui import model, table
from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import start_daemon
from tests.security import pidns
from tests.security.pidns import User

CLEAR, CLIP = "\x1b[2J", "\x1b]52;c;cm0gLXJmIH4=\x07"
NAME, GROUP = f"n{CLEAR}", f"g\r{CLIP}"
ARG = f"x{CLIP}\x9b31m\u202e"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e")


def _clean(text: str) -> None:
    for c in RAW:
        assert c not in text, f"{c!r} reached the terminal: {text!r}"


def test_user_strings_reach_no_terminal_raw(users: tuple[User, User], tmp_path: Path) -> None:
    a, b = users
    for d in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json"):
        env_a, env_b = pidns.env_of(d.env, a), pidns.env_of(d.env, b)
        r = d.cli(
            "submit",
            "--cwd",
            a.home,
            "--name",
            NAME,
            "--group",
            GROUP,
            "--",
            "sh",
            "-c",
            "sleep 60",
            ARG,
            env=env_a,
            prefix=a.prefix,
        )
        assert r.returncode == 0, r.stderr
        job = int(r.stdout)

        ps = d.cli("ps", env=env_b, prefix=b.prefix)
        assert ps.returncode == 0, ps.stderr
        _clean(ps.stdout)
        assert "n\\x1b[2J" in ps.stdout and "\\x1b]52;c;" in ps.stdout
        show = d.cli("show", str(job), env=env_b, prefix=b.prefix)
        assert show.returncode == 0, show.stderr
        _clean(show.stdout)
        assert "g\\r\\x1b]52;c;cm0gLXJmIH4=\\x07" in show.stdout and "\\u202e" in show.stdout

        raw = json.loads(d.cli("show", str(job), "--json", env=env_b, prefix=b.prefix).stdout)
        assert raw["name"] == NAME and raw["group"] == GROUP and raw["command"][-1] == ARG
        jobs = json.loads(d.cli("ps", "--json", env=env_b, prefix=b.prefix).stdout)["jobs"]
        assert jobs[0]["name"] == NAME

        # top: its table rows and its details page, from the same answers
        rows = model.build_rows(
            Snapshot(
                taken_at=0.0,
                backend="sim",
                driver_version=None,
                gpus=(),
                holders=(),
                in_child_namespace=False,
                observer_pid=0,
            ),
            jobs,
        )
        layout = table.table_layout(rows, 200)
        for row in rows:
            _clean("".join(table.row_cells(row, layout)))
        _clean("\n".join(f"{k} {v}" for k, v in model.job_details(raw)))
        d.cli("cancel", str(job), env=env_a, prefix=a.prefix)
