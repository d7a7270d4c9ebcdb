"""status's and leaks' screens: every line fits the terminal, wide characters line up,
colour adds codes and nothing else, and the choice of colour and width follows rich's."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest

from gpuwarden.observe.jsonview import snapshot_json
from gpuwarden.observe.leaks import find_leaks
from gpuwarden.printable import width as width_of
from gpuwarden.render import ink as inkmod
from gpuwarden.render.ink import Ink
from gpuwarden.render.statusview import leak_lines, render_doc
from tests.helpers.builders import gpu, proc, snapshot

SGR = re.compile("\x1b\\[[0-9;]*m")


def _doc(command: str, user: str = "alice") -> dict[str, object]:
    procs = [proc(10 + i, command=f"{command} {i}" * (i + 1), user=user) for i in range(6)]
    procs.append(proc(40, command="[python] <defunct>", status="zombie"))
    snap = snapshot([(replace(gpu(0), name="NVIDIA H200"), procs), (gpu(1), [])])
    return snapshot_json(snap, find_leaks([snap]))


@pytest.mark.parametrize("command", ["python train.py", "python 训练.py", "x"])
@pytest.mark.parametrize("width", [80, 100, 149, 150, 220])
def test_every_line_fits_the_terminal(command: str, width: int) -> None:
    lines = render_doc(_doc(command), width=width)
    assert any("H200" in line for line in lines)
    assert any("<defunct>" in line for line in lines)  # the zombie, and its leak below
    too_wide = [line for line in lines if width_of(line) > width]
    assert not too_wide


def test_wide_characters_keep_the_columns_in_line() -> None:
    lines = render_doc(_doc("python 训练.py", user="李雷"), width=120)
    rows = [line for line in lines if "训练" in line]
    assert len(rows) == 6
    at = {width_of(line[: line.index("1.0G")]) for line in rows}  # the Mem column
    assert len(at) == 1


@pytest.mark.parametrize("width", [80, 160])
def test_colour_adds_codes_and_nothing_else(width: int) -> None:
    doc = _doc("python train.py")
    plain = render_doc(doc, width=width)
    coloured = render_doc(doc, width=width, ink=Ink(True))
    assert [SGR.sub("", line) for line in coloured] == plain
    zombie = next(line for line in coloured if "<defunct>" in line and "zombie" in line)
    assert "\x1b[31mzombie" in zombie  # a state other than running is red
    running = next(line for line in coloured if "train.py 0" in line)
    assert "\x1b[31m" not in running


def test_a_command_cannot_reach_the_terminal() -> None:
    lines = render_doc(_doc("evil \x1b]52;c;aGk=\x07 \x1b[2J"), width=200, ink=Ink(True))
    text = "".join(SGR.sub("", line) for line in lines)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]52" in text


def test_leaks_report_says_no_leak_when_only_monitors_hold() -> None:
    monitor = {
        "gpu": None,
        "kind": "monitor",
        "pid": 7,
        "memory": None,
        "evidence": "pid 7 (nvtop) holds only /dev/nvidiactl: a monitoring tool",
    }
    lines = leak_lines([monitor])
    assert lines[0].startswith("No leaks") and "GPU - monitor pid 7" in lines
    leak = {
        **monitor,
        "gpu": 0,
        "kind": "dead_pid",
        "memory": 1 << 30,
        "evidence": "the driver charges 1GiB to pid 9 " * 8,
    }
    lines = leak_lines([monitor, leak], 60)
    assert not lines[0].startswith("No leaks") and "GPU 0 dead_pid pid 7 1024MiB" in lines
    assert all(width_of(line) <= 60 for line in lines)
    assert " ".join(lines).count("`gpuwarden reap") == 2


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("env", "tty", "colour"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"NO_COLOR": "1"}, True, False),
        ({"FORCE_COLOR": "1"}, False, True),
        ({"TERM": "dumb"}, True, False),
    ],
)
def test_colour_as_rich_decides(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], tty: bool, colour: bool
) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert inkmod.wants_colour(_Tty() if tty else io.StringIO()) is colour


def test_width_from_columns_else_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "133")
    assert inkmod.columns(io.StringIO()) == 133
    for bad in ("", "0", "wide", "１２"):
        monkeypatch.setenv("COLUMNS", bad)
        assert inkmod.columns(io.StringIO()) == 80
