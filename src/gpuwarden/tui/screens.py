"""The pages ``gpuwarden top`` opens over its table: a scrollable page of text (a row's
details, doctor findings, the keys), a yes or no before a cancel, and a one-line prompt
for the user filter. Each is a textual modal screen that knows nothing of the app."""

from __future__ import annotations

from typing import ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class TextScreen(ModalScreen[None]):
    """A scrollable page over the table: details of a row, or doctor findings."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "close", "Close"),
    ]
    DEFAULT_CSS = """
    TextScreen { align: center middle; }
    TextScreen > Vertical { width: 100%; height: 100%; border: round $accent;
                            background: $surface; }
    TextScreen #title { height: 1; text-style: bold; }
    TextScreen #hint { height: 1; color: $text-muted; }
    """

    def __init__(self, title: str, body: RenderableType) -> None:
        super().__init__()
        self._title = title
        self._body = body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self._title), id="title")
            with VerticalScroll():
                yield Static(self._body, id="body")
            yield Static(Text("esc / q: close   ↑↓ PgUp PgDn: scroll"), id="hint")

    def set_body(self, body: RenderableType) -> None:
        self._body = body
        self.query_one("#body", Static).update(body)

    @property
    def body(self) -> RenderableType:
        return self._body

    def action_close(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """Yes or no, before a request that cannot be taken back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Static { width: 60; height: auto; border: thick $error;
                             background: $surface; padding: 1 2; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(Text(f"{self.question}\n\ny: yes   n / esc: no"))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PromptScreen(ModalScreen["str | None"]):
    """One line of input; Enter submits (empty clears the filter), Escape keeps it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Keep")]
    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical { width: 60; height: auto; border: round $accent;
                              background: $surface; padding: 0 1; }
    """

    def __init__(self, label: str, value: str = "") -> None:
        super().__init__()
        self.label = label
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.label))
            yield Input(value=self.value, placeholder="empty: everyone")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
