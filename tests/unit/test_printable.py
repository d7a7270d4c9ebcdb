"""Text for people (gpuwarden/printable.py): control characters made visible, and
display widths, so tables of CJK names and emoji line up."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.printable import clip, clipped, pad, visible, width


def test_control_characters_are_shown_not_sent() -> None:
    assert visible("a\x1b[2Jb\nc\r") == "a\\x1b[2Jb\\nc\\r"
    assert visible("\udcff") == "\\xff"  # a byte that is not UTF-8


def test_width_counts_terminal_columns() -> None:
    assert width("abc") == 3
    assert width("訓練") == 4  # wide
    assert width("ＡＢ") == 4  # fullwidth
    assert width("e\u0301") == 1  # e and a combining acute accent
    assert width("a\u200bb") == 2  # zero-width space


def test_pad_and_clip_by_columns() -> None:
    assert pad("訓練", 6) == "訓練  " and width(pad("訓練", 6)) == 6
    assert pad("toolong", 3) == "toolong"
    assert clip("訓練ジョブ", 10) == "訓練ジョブ"
    assert clip("訓練ジョブ", 6) == "訓練…" and width(clip("訓練ジョブ", 6)) <= 6
    assert clip("abcdef", 4) == "abc…"


@given(st.text(), st.integers(1, 80))
def test_clip_never_passes_its_columns(text: str, columns: int) -> None:
    out = clip(text, columns)
    assert width(out) <= columns
    assert out == text or (out.endswith("…") and text.startswith(out[:-1]))
    assert clipped(text, columns) == (out, width(out))  # the columns it says it takes
