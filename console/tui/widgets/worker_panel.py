"""Workers as a table with a KV usage gauge, engine kind spelled out."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from console.render import engine_label, percent

GAUGE_WIDTH = 16


def gauge(used: float, capacity: float, width: int = GAUGE_WIDTH) -> Text:
    frac = 0.0 if not capacity else min(max(used / capacity, 0.0), 1.0)
    filled = round(frac * width)
    style = "green" if frac < 0.7 else "yellow" if frac < 0.9 else "red"
    text = Text("█" * filled, style=style)
    text.append("░" * (width - filled), style="grey37")
    text.append(f" {frac * 100:3.0f}%")
    return text


def worker_row(w: dict[str, Any]) -> list[Text | str]:
    st = w.get("stats") or {}
    cap = st.get("kv_capacity_tokens") or w["kv_capacity_tokens"]
    used = st.get("kv_used_tokens", 0)
    engine = Text(engine_label(w["engine"]), style="bold magenta" if w["engine"] == "sim"
                  else "bold green")
    health = Text(w["status"], style="green" if w["status"] == "healthy" else "bold red")
    return [w["id"], engine, w["model"], health, gauge(used, cap),
            f"{st.get('running', '-')}/{st.get('waiting', '-')}",
            percent(st.get("prefix_cache_hits", 0), st.get("prefix_cache_queries", 0)),
            str(st.get("preemptions", "-"))]


class WorkerPanel(Static):
    def show_workers(self, workers: list[dict[str, Any]]) -> None:
        if not workers:
            self.update("no workers registered (start one with `agentd worker`)")
            return
        table = Table(expand=True, box=None, header_style="bold")
        for name in ("WORKER", "ENGINE", "MODEL", "HEALTH", "KV USAGE", "RUN/WAIT",
                     "PREFIX HIT", "PREEMPT"):
            table.add_column(name, no_wrap=True)
        for w in workers:
            table.add_row(*worker_row(w))
        self.update(table)
