"""The operator's event log, derived from the facts the daemon already traces.

Every trace row passes `observe` (db/writer.py's trace_observers), so the places that know
a fact (worker health, failover, the meta loop, the policy registry, admission, expiry)
record it once, as they did. Most kinds become one event each; the kinds that come in
storms (refusals, failures, failovers, expiries, 5xx answers) are folded into one event
per kind, tenant and worker until the next `flush`, with a count.

Tenancy: an event a tenant's request or program caused carries that tenant (or
UNKNOWN_TENANT, seen by operators only, when it is no longer known); the others
(workers, policies, the daemon itself, 5xx answers, failovers, which a worker's loss
causes for whoever ran there) carry none and name no tenant's object: their data holds
no session, program or request id (daemon/api/history_api.py shows them to every reader).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("agentd.history")

INFO, WARNING, ERROR = "info", "warning", "error"
MESSAGE_CHARS = 500
# The tenant of a request's event when its tenant is no longer known: not a valid tenant
# name (daemon/access/names.py), so no tenant's token sees it, only operators.
UNKNOWN_TENANT = "(unknown)"
TENANTS_REMEMBERED = 100_000  # running requests whose tenant a later refusal may need

# trace kind -> (event kind, severity, message); one event per trace row
SINGLE: dict[str, tuple[str, str, str]] = {
    "worker.registered": ("worker.registered", INFO,
                          "worker {worker_id} registered ({engine}, {model})"),
    # Ray placement (daemon/workers/ray_placement.py): where a worker actor runs, and where
    # Ray restarted it after its process or node died.
    "worker.placed": ("worker.placed", INFO,
                      "worker {worker_id} (rank {dp_rank}) placed on node {node}"),
    "worker.moved": ("worker.moved", WARNING,
                     "worker {worker_id} (rank {dp_rank}) restarted by Ray on node {node}"),
    "worker.process.exited": ("worker.exited", ERROR,
                              "worker {worker_id} process exited with {exit_code}; "
                              "restarting in {restart_in_s} s"),
    "worker.unhealthy": ("worker.crash", ERROR, "worker {worker_id} stopped answering: {reason}"),
    "worker.gone": ("worker.gone", ERROR, "worker {worker_id} is gone: {reason}"),
    "worker.suspect": ("worker.suspect", WARNING, "worker {worker_id} is suspect: {reason}"),
    "worker.healthy": ("worker.healthy", INFO, "worker {worker_id} is healthy again: {reason}"),
    "ordering.switch": ("policy.switch", INFO,
                        "meta loop switched ordering {previous} -> {policy}: {reason}"),
    "ordering.rollback": ("policy.rollback", WARNING,
                          "ordering {rolled_back} rolled back to {policy}: {reason}"),
    "meta.bypass": ("policy.bypass", WARNING, "emergency bypass active={active}: {reason}"),
    "policy.rolled_back": ("policy.rollback", WARNING,
                           "{layer} policy {name} v{version} rolled back to {restored} "
                           "v{restored_version}: {reason}"),
    "policy.activated": ("policy.activated", INFO,
                         "{layer} policy {name} v{version} activated"),
    "daemon.started": ("daemon.started", INFO, "daemon started"),
    "daemon.stopped": ("daemon.stopped", INFO, "daemon stopped"),
    "daemon.draining": ("daemon.draining", WARNING, "daemon draining: admission stopped"),
}
# trace kind -> (event kind, severity, message with {count}); folded per flush
FOLDED: dict[str, tuple[str, str, str]] = {
    "admission.refused": ("request.refused", WARNING,
                          "{count} request(s) of tenant {tenant} refused by admission: "
                          "{reason}"),
    "request.failed": ("request.failed", ERROR,
                       "{count} request(s) of tenant {tenant} failed: {error}"),
    "request.failover": ("request.failover", WARNING,
                         "{count} request(s) failed over from worker {worker_id}: {reason}"),
    "program.expired": ("program.expired", INFO,
                        "{count} program(s) of tenant {tenant} expired after "
                        "{timeout_s} s idle"),
}
HTTP_5XX = ("http.5xx", ERROR, "{count} API answer(s) with a 5xx status ({statuses})")
CLUSTER_KINDS = {"request.failover", "http.5xx"}  # folded kinds that carry no tenant
KINDS = sorted({k for k, _, _ in SINGLE.values()} | {k for k, _, _ in FOLDED.values()}
               | {HTTP_5XX[0]})
# the only fields of a trace row an event keeps (never a session, program or request id)
KEPT_FIELDS = ("reason", "error", "exit_code", "restart_in_s", "engine", "model", "policy",
               "previous", "rolled_back", "active", "layer", "name", "version", "restored",
               "restored_version", "timeout_s", "setting", "idle_s", "demand_tokens",
               "budget_tokens", "node", "dp_rank")


@dataclass
class _Fold:
    first: float
    last: float
    fields: dict[str, Any]
    count: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class EventLog:
    """Turns trace rows into event rows for `emit` (the batched writer's insert)."""

    def __init__(self, emit: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float]) -> None:
        self._emit = emit
        self._clock = clock
        self._folds: dict[tuple[str, str | None, str | None], _Fold] = {}
        self._tenants: OrderedDict[str, str] = OrderedDict()  # request id -> tenant

    def observe(self, row: dict[str, Any]) -> None:
        """One trace row (db/writer.py calls this as it enqueues it)."""
        try:
            self._observe(row)
        except Exception:  # a fault here must never fail the trace call that fed it
            log.exception("event log: could not derive an event from %s", row.get("kind"))

    def http_answer(self, status: int) -> None:
        """An API answer with a 5xx status (daemon/history/http_tally.py)."""
        fold = self._fold(HTTP_5XX[0], None, None, {}, self._clock())
        fold.statuses[str(status)] = fold.statuses.get(str(status), 0) + 1

    def flush(self) -> int:
        """Emit every folded event; returns how many."""
        folds, self._folds = self._folds, {}
        for (kind, tenant, worker), f in folds.items():
            _, severity, template = HTTP_5XX if kind == HTTP_5XX[0] else next(
                v for v in FOLDED.values() if v[0] == kind)
            data = dict(f.fields)
            if f.statuses:
                data["statuses"] = f.statuses
            text = _format(template, {**data, "count": f.count, "tenant": tenant,
                                      "worker_id": worker,
                                      "statuses": ", ".join(f"{n} x {s}" for s, n in
                                                            sorted(f.statuses.items()))})
            self._emit(_row(kind, severity, f.first, f.last, tenant, worker, f.count, text,
                            data))
        return len(folds)

    def _observe(self, row: dict[str, Any]) -> None:
        kind, data = row["kind"], row.get("data") or {}
        request_id = row.get("request_id")
        if kind == "request.queued" and request_id and data.get("tenant"):
            self._remember(request_id, str(data["tenant"]))
            return
        if kind == "policy.activated" and data.get("by") == "startup":
            return  # every start activates the configured policies: not news
        if kind in SINGLE:
            event, severity, template = SINGLE[kind]
            kept = _kept(data)
            text = _format(template, {**kept, "worker_id": row.get("worker_id")})
            self._emit(_row(event, severity, row["ts"], row["ts"], None, row.get("worker_id"),
                            1, text, kept))
            return
        tenant = data.get("tenant") or self._tenants.get(request_id or "")
        if kind in ("request.finished", "request.failed", "request.aborted") and request_id:
            self._tenants.pop(request_id, None)
        if kind not in FOLDED:
            return
        event = FOLDED[kind][0]
        if event in CLUSTER_KINDS:
            tenant = None
        elif tenant is None:  # a tenant's kind whose tenant is not known: operators only
            tenant = UNKNOWN_TENANT
        worker = row.get("worker_id") if event == "request.failover" else None
        self._fold(event, None if tenant is None else str(tenant), worker, _kept(data),
                   row["ts"])

    def _fold(self, kind: str, tenant: str | None, worker: str | None,
              fields: dict[str, Any], ts: float) -> _Fold:
        key = (kind, tenant, worker)
        fold = self._folds.get(key)
        if fold is None:
            fold = self._folds[key] = _Fold(ts, ts, fields)
        fold.count += 1
        fold.last = ts
        return fold

    def _remember(self, request_id: str, tenant: str) -> None:
        self._tenants[request_id] = tenant
        if len(self._tenants) > TENANTS_REMEMBERED:
            self._tenants.popitem(last=False)


def _kept(data: dict[str, Any]) -> dict[str, Any]:
    return {k: data[k] for k in KEPT_FIELDS if data.get(k) is not None}


def _format(template: str, fields: dict[str, Any]) -> str:
    values: defaultdict[str, Any] = defaultdict(lambda: "?")
    values.update({k: v for k, v in fields.items() if v is not None})
    return template.format_map(values)[:MESSAGE_CHARS]


def _row(kind: str, severity: str, first: float, last: float, tenant: str | None,
         worker: str | None, count: int, message: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"ts": first, "last_ts": last, "kind": kind, "severity": severity,
            "tenant": tenant, "worker_id": worker, "count": count, "message": message,
            "data": data}
