"""The daemon-served ``status`` path's own small pieces agree with what they stand in
for (cli/fast.py): the socket path, the query's quoting, the options it serves."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.cli.fast import _parse, _quote, socket_path
from gpuwarden.client.paths import resolve_paths

STATUS = ("--format", "--gpu", "--user", "--pid")


@pytest.mark.parametrize("home", ["/tmp/gw-x/home", "rel/home", "./a//b/"])
def test_socket_path_as_resolve_paths_in_home_mode(
    home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWARDEN_HOME", home)
    assert Path(socket_path()) == resolve_paths().socket


@pytest.mark.skipif(os.geteuid() != 0, reason="the system socket is root's mode")
def test_socket_path_as_resolve_paths_for_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUWARDEN_HOME", raising=False)
    assert socket_path() == str(resolve_paths().socket) == "/run/gpuwarden.sock"


@given(st.text())
def test_quote_as_urllib(value: str) -> None:
    assert _quote(value) == quote(value, safe="")


def test_the_options_served_and_the_rest_left_to_click() -> None:
    assert _parse(["--json", "--gpu", "1", "--gpu=2", "--user", "bob"], STATUS) == {
        "json": True,
        "gpus": [1, 2],
        "user": "bob",
        "pid": None,
    }
    assert _parse(["--format", "json", "--pid=7"], STATUS) == {
        "json": True,
        "gpus": [],
        "user": None,
        "pid": 7,
    }
    for args in (
        ["--fresh"],
        ["--watch"],
        ["--format", "csv"],
        ["--gpu", "-1"],
        ["-h"],
        ["--gpu"],
        ["--json=1"],
        ["--processes"],
    ):
        assert _parse(args, STATUS) is None, args
    assert _parse(["--user", "bob"], ("--gpu",)) is None  # leaks has no --user
    assert _parse(["--samples", "3"], ("--gpu",)) is None
