"""A session's rows as horizontal bars scaled to the widget's width; one is selected."""

from __future__ import annotations

import time

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from console.render import seconds
from console.trace_spans import Span, bounds
from console.tui.data import Clock
from console.tui.timeline import GLYPHS, STYLES, cells, row_label

LABEL_WIDTH = 26


class TraceTimeline(Widget, can_focus=True):
    BINDINGS = [
        Binding("up,k", "move(-1)", "previous row"),
        Binding("down,j", "move(1)", "next row"),
        Binding("home", "jump(0)", "first row"),
        Binding("end", "jump(-1)", "last row"),
        Binding("enter", "choose", "details"),
    ]
    selected: reactive[int] = reactive(0)

    class SpanSelected(Message):
        def __init__(self, span: Span) -> None:
            super().__init__()
            self.span = span

    def __init__(self, *, id: str | None = None, clock: Clock = time.time) -> None:
        super().__init__(id=id)
        self.spans: list[Span] = []
        self.clock = clock

    def show_spans(self, spans: list[Span]) -> None:
        at_end = self.selected >= len(self.spans) - 1
        self.spans = spans
        # follow the newest row unless the operator moved away from it
        self.selected = len(spans) - 1 if at_end else min(self.selected, len(spans) - 1)
        self.selected = max(self.selected, 0)
        self.refresh()

    def action_move(self, delta: int) -> None:
        if self.spans:
            self.selected = min(max(self.selected + delta, 0), len(self.spans) - 1)

    def action_jump(self, index: int) -> None:
        if self.spans:
            self.selected = index % len(self.spans)

    def action_choose(self) -> None:
        if self.spans:
            self.post_message(self.SpanSelected(self.spans[self.selected]))

    def watch_selected(self) -> None:
        self.refresh()

    def render(self) -> Text:
        if not self.spans:
            return Text("no events in this session yet", style="italic")
        now = self.clock()
        t0, t1 = bounds(self.spans, now)
        width = max(self.size.width - LABEL_WIDTH - 1, 10)
        first = self._first_visible()
        out = Text(f"{'':<{LABEL_WIDTH}}0s{seconds(t1 - t0):>{width - 2}}\n", style="dim")
        for i, span in enumerate(self.spans[first:first + self._rows()], start=first):
            out.append_text(self._line(span, t0, t1, width, now, i == self.selected))
            out.append("\n")
        return out

    def _rows(self) -> int:
        return max(self.size.height - 1, 1)

    def _first_visible(self) -> int:
        rows = self._rows()
        return max(0, min(self.selected - rows // 2, len(self.spans) - rows))

    @staticmethod
    def _line(span: Span, t0: float, t1: float, width: int, now: float, chosen: bool) -> Text:
        label = f"{'▶' if chosen else ' '}{row_label(span)}"[:LABEL_WIDTH]
        line = Text()
        line.append(f"{label:<{LABEL_WIDTH}}", style="reverse" if chosen else "")
        bar = [(" ", "")] * width
        if span.instant:
            at, _ = cells(span.start, span.start, t0, t1, width)
            bar[at] = (GLYPHS[span.kind], STYLES[span.kind])
        for seg in span.segments:
            a, b = cells(seg.start, seg.end if seg.end is not None else now, t0, t1, width)
            bar[a:b + 1] = [(GLYPHS[seg.kind], STYLES[seg.kind])] * (b - a + 1)
        for text, style in _runs(bar):
            line.append(text, style=style)
        return line


def _runs(bar: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Neighbouring cells of one glyph and style as one string; trailing blanks dropped."""
    runs: list[tuple[str, str]] = []
    for glyph, style in bar:
        if runs and runs[-1][1] == style and runs[-1][0][-1] == glyph:
            runs[-1] = (runs[-1][0] + glyph, style)
        else:
            runs.append((glyph, style))
    return runs[:-1] if runs and not runs[-1][0].strip() else runs
