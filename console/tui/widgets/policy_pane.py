"""What the policies view shows of one version: its source, a diff, or a validation report."""

from __future__ import annotations

from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import ContentSwitcher, Static, TextArea

from console.policy_cmd import _report as report_text


def report(v: dict[str, Any]) -> Text:
    """The stored validation report of a version, errors with their line numbers."""
    ok = bool((v.get("validation") or {}).get("ok"))
    return Text(report_text(v), style="green" if ok else "bold red")


def first_error_line(v: dict[str, Any]) -> int | None:
    lines = [e["line"] for e in (v.get("validation") or {}).get("errors", []) if e.get("line")]
    return min(lines) if lines else None


class PolicyPane(Vertical):
    diff_text = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="pane-title", classes="title")
        with ContentSwitcher(initial="policy-source", id="pane-switcher"):
            yield TextArea.code_editor("", language="python", read_only=True,
                                       id="policy-source")
            with VerticalScroll(id="policy-diff-box"):
                yield Static("", id="policy-diff")
        yield Static("", id="policy-report")

    def show_source(self, name: str, version: int, source: str) -> None:
        self.query_one("#pane-title", Static).update(f"{name} v{version}: source")
        area = self.query_one("#policy-source", TextArea)
        if area.text != source:
            area.load_text(source)
        self.query_one(ContentSwitcher).current = "policy-source"

    def show_diff(self, name: str, old: int, new: int, diff: str) -> None:
        self.diff_text = diff
        self.query_one("#pane-title", Static).update(f"{name}: diff v{old} → v{new}")
        body = Syntax(diff, "diff", theme="ansi_dark") if diff else Text("(no differences)")
        self.query_one("#policy-diff", Static).update(body)
        self.query_one(ContentSwitcher).current = "policy-diff-box"

    def show_report(self, v: dict[str, Any]) -> None:
        self.query_one("#policy-report", Static).update(report(v))

    @property
    def showing_diff(self) -> bool:
        return self.query_one(ContentSwitcher).current == "policy-diff-box"
