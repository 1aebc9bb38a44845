"""What the overview flags: unhealthy workers, KV imbalance, recent policy rollbacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from console.render import ago
from console.tui.data import Snapshot

DEFAULT_KV_IMBALANCE = 0.3  # max - min KV usage fraction across healthy workers
ROLLBACK_WINDOW_S = 600.0


@dataclass(frozen=True)
class Alert:
    severity: str  # "error" | "warning"
    text: str


def kv_fraction(w: dict[str, Any]) -> float:
    st = w.get("stats") or {}
    cap = st.get("kv_capacity_tokens") or w.get("kv_capacity_tokens") or 0
    return float(st.get("kv_used_tokens", 0)) / cap if cap else 0.0


def worker_alerts(workers: list[dict[str, Any]]) -> list[Alert]:
    out = [Alert("error", f"worker {w['id']} is {w['status']}")
           for w in workers if w["status"] != "healthy"]
    if workers and len(out) == len(workers):
        out.append(Alert("error", "no healthy worker: requests wait in the queue"))
    return out


def imbalance_alert(workers: list[dict[str, Any]], threshold: float) -> Alert | None:
    healthy = [(kv_fraction(w), w["id"]) for w in workers if w["status"] == "healthy"]
    if len(healthy) < 2:
        return None
    (low, low_id), (high, high_id) = min(healthy), max(healthy)
    if high - low <= threshold:
        return None
    return Alert("warning", f"KV imbalance {100 * (high - low):.0f} points: {high_id} "
                            f"{100 * high:.0f}% vs {low_id} {100 * low:.0f}% "
                            f"(threshold {100 * threshold:.0f})")


def rollback_alerts(events: list[dict[str, Any]], now: float) -> list[Alert]:
    out = []
    for e in events:
        if e["kind"] != "policy.rolled_back" or now - float(e["ts"]) > ROLLBACK_WINDOW_S:
            continue
        d = e.get("data") or {}
        how = "rolled back automatically" if d.get("automatic") else "rolled back"
        out.append(Alert("warning", f"policy {d.get('name')} v{d.get('version')} {how} "
                                    f"{ago(float(e['ts']), now)} to {d.get('restored')} "
                                    f"v{d.get('restored_version')}: {d.get('reason')}"))
    return out


def alerts(snap: Snapshot, now: float, kv_threshold: float = DEFAULT_KV_IMBALANCE) -> list[Alert]:
    out = worker_alerts(snap.workers)
    if snap.health.get("status") not in (None, "ok"):
        out.append(Alert("error", f"daemon is {snap.health.get('status')}: "
                                  f"{snap.health.get('store_error') or 'see its log'}"))
    imbalance = imbalance_alert(snap.workers, kv_threshold)
    if imbalance is not None:
        out.append(imbalance)
    return out + rollback_alerts(snap.policy_events, now)
