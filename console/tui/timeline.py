"""How the TUI shows a session's spans (console/trace_spans.py): glyphs, styles, row
labels, the drill-down text and the columns a bar covers at a given width."""

from __future__ import annotations

from typing import Any

from console.render import seconds, short_id
from console.trace_spans import SLO_TAGS, SloOutcome, Span, slo_outcome

STYLES = {
    "queue": "yellow", "prefill": "cyan", "decode": "green",
    "queued": "yellow", "reasoning": "blue", "acting": "dark_orange", "paused": "magenta",
    "prepare": "grey62", "exec": "dark_orange", "call": "bright_blue",
    "migrate": "bold cyan", "decision": "bold white", "release": "red",
}
GLYPHS = {
    "queue": "░", "prefill": "▓", "decode": "█",
    "queued": "░", "reasoning": "━", "acting": "─", "paused": "▒",
    "prepare": "▒", "exec": "█", "call": "▬",
    "migrate": "◆", "decision": "●", "release": "✕",
}
LEGEND = ("queue", "prefill", "decode", "reasoning", "acting", "paused", "exec", "call",
          "migrate", "decision")


def row_label(span: Span) -> str:
    if span.kind == "program":
        return f"program  {short_id(span.program_id)}"
    if span.kind == "request":
        return f"  llm    {short_id(span.request_id)}"
    return f"  {span.kind:<6} {span.name}"


def describe(span: Span, now: float, ttft_slo_s: float | None = None) -> str:
    """The drill-down text of one row."""
    head = {"program": f"program {span.program_id}",
            "request": f"request {span.request_id} of program {span.program_id}",
            "migrate": f"migrate of program {span.program_id}"}.get(
        span.kind, f"{span.kind} {span.name} of program {span.program_id}")
    parts = [head]
    if span.worker_id:
        parts.append(f"worker {span.worker_id}")
    if not span.instant:
        parts.append(f"lasted {seconds(span.duration(now))}"
                     + ("" if span.end is not None else " (still open)"))
    if span.kind == "request":
        parts += _request_parts(span, now, ttft_slo_s)
    elif span.kind == "program":
        parts += [f"{kind} {seconds(t)}" for kind in ("queued", "reasoning", "acting", "paused")
                  if (t := span.phase(kind, now))]
    shown = {"queued_at", "first_token_at", "prompt_tokens", "cached_tokens", "output_tokens",
             "tool", *SLO_TAGS}
    parts += [f"{k}={_value(v)}" for k, v in span.details.items()
              if k not in shown and v is not None and v is not False and v != ""]
    return "  ".join(parts)


def _value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _request_parts(span: Span, now: float, ttft_slo_s: float | None) -> list[str]:
    d = span.details
    parts = [f"{kind} {seconds(t)}" for kind in ("queue", "prefill", "decode")
             if (t := span.phase(kind, now)) is not None]
    if "prompt_tokens" in d:
        parts.append(f"tokens: prompt {d['prompt_tokens']} (cached {d.get('cached_tokens', 0)})"
                     f" output {d.get('output_tokens', 0)}")
    parts.append(f"ttft {seconds(span.ttft())}")
    outcome = slo_outcome(span, ttft_slo_s)
    if outcome is not None:
        if outcome.slo_tpot_s is not None and outcome.tpot_s is not None:
            parts.append(f"tpot {seconds(outcome.tpot_s)}")
        parts.append(slo_text(outcome))
    return parts


def slo_text(o: SloOutcome) -> str:
    """'SLO met (ttft ≤ 1.0s)'; with the task's own SLO also its TPOT target and task."""
    if o.why == "no first token":
        return "SLO missed (no first token)"
    per_task = o.slo_tpot_s is not None
    if o.state == "pending" and not per_task:
        return "SLO pending"
    targets = f"ttft ≤ {seconds(o.slo_ttft_s)}"
    if per_task:
        targets += f", tpot ≤ {seconds(o.slo_tpot_s)}" + (f", task {o.task}" if o.task else "")
    word = {"met": "met", "missed": "MISSED", "pending": "pending"}[o.state]
    on = f" on {o.why}" if per_task and o.state == "missed" else ""
    return f"SLO {word}{on} ({targets})"


def cells(start: float, end: float, t0: float, t1: float, width: int) -> tuple[int, int]:
    """The [first, last] columns of [start, end] in a bar `width` cells wide (at least one)."""
    scale = (width - 1) / (t1 - t0)
    first = min(max(int((start - t0) * scale), 0), width - 1)
    last = min(max(int((end - t0) * scale), first), width - 1)
    return first, last


def bar_cells(span: Span, t0: float, t1: float, width: int, now: float) -> tuple[int, int]:
    return cells(span.start, span.end if span.end is not None else now, t0, t1, width)
