"""Edit a policy's source, store it as a new version (validated there), activate it."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static, TextArea
from textual.widgets.text_area import Selection

from console.client import ClientError, api
from console.tui.screens.base import DaemonView
from console.tui.widgets.policy_pane import first_error_line, report


class VersionStored(Message):
    def __init__(self, version: dict[str, Any] | None, error: str | None = None) -> None:
        super().__init__()
        self.version = version
        self.error = error


class PolicyEditorScreen(DaemonView):
    BINDINGS = [
        Binding("ctrl+s,f2", "store", "store + validate"),
        Binding("f5", "activate", "activate stored"),
        # priority: the editor would take escape for itself (to leave the text area)
        Binding("escape", "back", "back", priority=True),
    ]

    def __init__(self, name: str, layer: str, base_version: int, source: str) -> None:
        super().__init__()
        self.policy = name
        self.policy_layer = layer
        self.base_version = base_version
        self.source = source
        self.stored: dict[str, Any] | None = None
        self._stored_text = source

    def nav_extra(self) -> str:
        return f"editing policy {self.policy}"

    def compose_body(self) -> ComposeResult:
        yield Static(f"editing {self.policy} ({self.policy_layer}) from v{self.base_version}: "
                     "ctrl+s stores a new version and validates it, f5 activates it",
                     id="editor-title", classes="title")
        yield TextArea.code_editor(self.source, language="python", id="editor")
        yield Static("not stored yet", id="editor-report")

    def on_mount(self) -> None:
        self.editor.focus()

    @property
    def editor(self) -> TextArea:
        return self.query_one("#editor", TextArea)

    def action_store(self) -> None:
        if self.agentd.writable():
            self.store(self.editor.text)

    @work(exclusive=True, group="policy-store")
    async def store(self, text: str) -> None:
        try:
            call = api.policy_put(self.policy, self.policy_layer, text)
            answer = await self.agentd.client.call(call)
        except ClientError as exc:
            self.post_message(VersionStored(None, exc.message))
            return
        self._stored_text = text
        self.post_message(VersionStored(answer))

    def on_version_stored(self, message: VersionStored) -> None:
        out = self.query_one("#editor-report", Static)
        if message.version is None:
            out.update(f"not stored: {message.error}")
            return
        self.stored = message.version
        out.update(report(message.version))
        line = first_error_line(message.version)
        if line is not None:  # select the offending line so the operator lands on it
            row = min(line - 1, self.editor.document.line_count - 1)
            self.editor.selection = Selection((row, 0), (row, len(self.editor.document[row])))
        self.agentd.refresh_slow()

    def action_activate(self) -> None:
        v = self.stored
        if v is None or self.editor.text != self._stored_text:
            self.notify("store the edited source first (ctrl+s)", severity="warning")
            return
        if not (v.get("validation") or {}).get("ok"):
            self.notify(f"{self.policy} v{v['version']} failed validation; fix and store again",
                        severity="error")
            return
        self.agentd.confirm_call(f"activate policy {self.policy} v{v['version']}",
                                 api.policy_activate(self.policy, int(v["version"])))

    def action_back(self) -> None:
        if self.editor.text == self._stored_text:
            self.dismiss()
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.dismiss()

        self.agentd.ask("discard the unsaved changes?", answered)
