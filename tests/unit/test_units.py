from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.errors import UsageError
from gpuwarden.gpus.topology import format_cpulist, parse_cpulist
from gpuwarden.units import (
    GiB,
    MiB,
    bounded_duration,
    bounded_size,
    format_bytes,
    parse_duration,
    parse_listen,
    parse_size,
    parse_size_or_fraction,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("14G", 14 * GiB),
        ("14GiB", 14 * GiB),
        ("14gb", 14 * GiB),
        ("512MiB", 512 * MiB),
        ("9752MiB", 9752 * MiB),
        ("4096B", 4096),
        ("1.5G", int(1.5 * GiB)),
        (" 2 G ", 2 * GiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_fraction_needs_total_and_range() -> None:
    assert parse_size("0.5", total=80 * GiB) == 40 * GiB
    with pytest.raises(UsageError, match="fraction needs a known total"):
        parse_size("0.5")
    with pytest.raises(UsageError, match=r"\(0, 1\]"):
        parse_size("1.5", total=GiB)


@pytest.mark.parametrize("bad", ["12X", "-1G", "", "G", "1.2.3G", "nan", "1e9G", "inf"])
def test_bad_sizes_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError, match="invalid size"):
        parse_size(bad)


@pytest.mark.parametrize("bare", ["20", "1", "0", " 4096 "])
def test_a_number_without_a_unit_is_an_error_that_suggests_one(bare: str) -> None:
    n = bare.strip()
    with pytest.raises(UsageError, match=rf"invalid size '{n}': give a unit, e.g. {n}G "):
        parse_size(bare)
    with pytest.raises(UsageError, match=r"or 1\.0 for all of it"):
        parse_size(bare, total=GiB)
    assert parse_size(bare, bare_bytes=True) == int(n)  # what a program wrote: bytes
    assert parse_size(int(n)) == int(n)  # an int (a JSON number) is bytes


def test_size_or_fraction() -> None:
    assert parse_size_or_fraction("0.5") == (None, 0.5)
    assert parse_size_or_fraction(".25") == (None, 0.25)
    assert parse_size_or_fraction("1.0") == (None, 1.0)
    assert parse_size_or_fraction("20G") == (20 * GiB, None)
    for bad, message in (
        ("1.5", r"\(0, 1\]"),
        ("0.0", r"\(0, 1\]"),
        ("0G", "positive"),
        ("20", "give a unit"),
        ("x", "invalid size"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_size_or_fraction(bad)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["B", "K", "M", "G", "MiB"]))
def test_size_units_scale(n: int, unit: str) -> None:
    scale = {"B": 1, "K": 1024, "M": MiB, "G": GiB, "MiB": MiB}[unit]
    assert parse_size(f"{n}{unit}") == n * scale


@given(st.integers(min_value=0, max_value=2**48))
def test_format_bytes_never_fails(n: int) -> None:
    assert format_bytes(n)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("1.5s", 1.5),
        ("10m", 600),
        ("2h30m", 9000),
        ("500ms", 0.5),
        ("1d", 86400),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "abc", "10x", "-5", "5 minutes"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(bad)


def test_cpulist_examples() -> None:
    assert parse_cpulist("0-23,48-71") == frozenset(range(24)) | frozenset(range(48, 72))
    assert parse_cpulist("3") == {3}
    assert parse_cpulist("") == frozenset()
    assert format_cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    with pytest.raises(UsageError):
        parse_cpulist("3-1")
    with pytest.raises(UsageError):
        parse_cpulist("a-b")


@given(st.frozensets(st.integers(min_value=0, max_value=512), max_size=64))
def test_cpulist_round_trip(cpus: frozenset[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:9402", ("127.0.0.1", 9402)),
        (":9402", ("0.0.0.0", 9402)),
        ("[::1]:9402", ("::1", 9402)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9402", "host:", "host:port", ":0", ":65536"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="invalid listen address"):
        parse_listen(text)


@pytest.mark.parametrize(
    ("raw", "kw", "said"),
    [
        (True, {}, "grace must be a duration like 30s or a number of seconds"),
        ([5], {}, "grace must be a duration like 30s"),
        ("soon", {}, "grace: invalid duration 'soon'"),
        (-1, {}, "grace: invalid duration -1: must not be negative"),
        (0, {"positive": True}, "grace must be positive"),
        ("2h", {"most": 3600.0}, "grace must be at most 1h00m"),
    ],
)
def test_bounded_duration_refuses_in_one_line_naming_the_field(
    raw: object, kw: dict[str, Any], said: str
) -> None:
    with pytest.raises(UsageError) as e:
        bounded_duration(raw, "grace", **kw)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_bounded_duration_and_size_accept_what_they_bound() -> None:
    assert bounded_duration("1h", "x", most=3600.0) == 3600.0
    assert bounded_duration(0, "x") == 0.0
    assert bounded_size("14G", "mem", positive=True) == 14 << 30
    assert bounded_size(0, "reserve") == 0


@pytest.mark.parametrize(
    ("raw", "kw", "said"),
    [
        (None, {}, "mem must be a size like 512MiB or a number of bytes"),
        ("12X", {}, "mem: "),
        (0, {"positive": True}, "mem must be positive"),
        ("2G", {"most": 1 << 30}, "mem must be at most 1024MiB"),
    ],
)
def test_bounded_size_refuses_in_one_line_naming_the_field(
    raw: object, kw: dict[str, Any], said: str
) -> None:
    with pytest.raises(UsageError) as e:
        bounded_size(raw, "mem", **kw)
    assert said in str(e.value) and "\n" not in str(e.value)
