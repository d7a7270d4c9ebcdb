"""status's process table skips rich's word wrap only where it would change nothing."""

from __future__ import annotations

import io

import pytest
from rich.console import Console, Group
from rich.text import Text

from gpuwarden.cli.statusview import render_doc
from gpuwarden.observe.jsonview import snapshot_json
from tests.unit.builders import gpu, proc, snapshot


def _doc(command: str) -> dict[str, object]:
    procs = [proc(10 + i, command=f"{command} {i}" * (i + 1)) for i in range(6)]
    return snapshot_json(snapshot([(gpu(0), procs)]), [])


def _print(group: Group, width: int) -> str:
    f = io.StringIO()
    Console(file=f, width=width, force_terminal=True, color_system="standard").print(group)
    return f.getvalue()


@pytest.mark.parametrize("command", ["python train.py", "python 训练.py", "x"])
@pytest.mark.parametrize("width", [30, 60, 80, 120])
def test_the_table_is_what_word_wrap_makes_of_it(command: str, width: int) -> None:
    group = render_doc(_doc(command), width=width)
    assert isinstance(group, Group)
    table = group.renderables[1]
    assert isinstance(table, Text)
    shown = _print(group, width)
    skipped = table.no_wrap
    table.no_wrap = False
    assert _print(group, width) == shown
    if width >= 80 and command.isascii():
        assert skipped  # every line fits: no wrap
