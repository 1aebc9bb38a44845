"""The SLO scheduling layers as stored-policy layers: ordering, meta and admission.

Each has its interface (scheduling/slo/ordering.py, scheduling/layers.py), its
built-ins, dry-run calls that check a policy keeps its contract on a snapshot, a fixed
sample snapshot, and the daemon's live snapshot (daemon/slo/stack.py hosts all three);
the meta layer's is built off the event loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import scheduling.slo.ordering
from daemon.policies.layer_spec import DryCall, Layer
from daemon.policies.loop_hold import stepped
from scheduling.layers import ADMISSION_POLICIES, META_POLICIES, AdmissionPolicy
from scheduling.slo.admission import AdmissionDecision, AdmissionFence, ExecutionControls
from scheduling.slo.meta import Decision, MetaPolicy
from scheduling.slo.meta_llm import LlmMeta
from scheduling.slo.ordering import OrderingPolicy, default_registry
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import TABLE_6, TaskType
from scheduling.slo.views import LongView, ViewBuilder

ORDERING_POOL = default_registry().names()
META_OFF = "off"
META_ALIASES = {"llm": LlmMeta.name}


def startup_policy(config: Any, layer: str) -> str:
    """The built-in a layer starts with when the store has none active."""
    meta: str = META_ALIASES.get(config.meta_policy, config.meta_policy)
    if layer == "ordering":
        return meta if meta in ORDERING_POOL else config.ordering_policy
    if layer == "meta":
        return "meta-off" if meta == META_OFF or meta in ORDERING_POOL else meta
    return str(config.admission_policy)


_POOL = default_registry()
ORDERING_BUILTINS: dict[str, Callable[[], OrderingPolicy]] = {
    name: functools.partial(_POOL.create, name) for name in _POOL.names()}
LIVE_LIMIT = 32  # queued requests a dry run replays from the live queue


# --- ordering ---------------------------------------------------------------------------


def ordering_dry_calls(requests: Sequence[QueuedRequest], now: float) -> list[DryCall]:
    items = list(requests)

    def push_pop(p: Any) -> str | None:
        p.drain()
        for r in items:
            p.push(r, now)
        return _pops_each_once(p, items, now, "after pushes")

    def rebuild(p: Any) -> str | None:
        p.rebuild(list(reversed(items)), now)
        return _pops_each_once(p, items, now, "after rebuild")

    return [("push/peek/pop", push_pop), ("rebuild/pop", rebuild)]


def _pops_each_once(p: Any, items: list[QueuedRequest], now: float, when: str) -> str | None:
    if len(p) != len(items):
        return f"len() is {len(p)} {when} of {len(items)} requests"
    seen: list[str] = []
    for _ in items:
        head, got = p.peek(now), p.pop(now)
        if not isinstance(got, QueuedRequest):
            return f"pop must return a QueuedRequest, got {type(got).__name__}"
        if not isinstance(head, QueuedRequest) or head.request_id != got.request_id:
            return "peek must return the request the next pop returns"
        seen.append(got.request_id)
    if sorted(seen) != sorted(r.request_id for r in items):
        return f"pop must return every queued request exactly once {when}"
    if p.peek(now) is not None or len(p) != 0:
        return "peek must return None and len() 0 once every request was popped"
    return None


def sample_requests(now: float) -> list[QueuedRequest]:
    """A fixed mix: long and short, two tenants, a priority, a re-queued request, a tie."""

    def q(rid: str, tenant: str, age: float, prompt: int, task: TaskType, l_pred: int,
          priority: int = 0, generated: int = 0) -> QueuedRequest:
        return QueuedRequest(rid, tenant, now - age, prompt, task, 0.75, TABLE_6[task], l_pred,
                             2 * l_pred, 0.02 + 0.0002 * prompt, 0.03, priority, generated)

    return [
        q("r-long", "a", 9.0, 2000, TaskType.LONG_FORM_GENERATION, 1500),
        q("r-short", "a", 8.0, 50, TaskType.QA, 20),
        q("r-code", "b", 5.0, 800, TaskType.CODE_GENERATION, 300, priority=1),
        q("r-resumed", "b", 4.0, 400, TaskType.SUMMARIZATION, 200, generated=120),
        q("r-new", "c", 0.5, 100, TaskType.DIALOGUE, 60),
        q("r-tie-1", "c", 0.2, 100, TaskType.QA, 20),
        q("r-tie-2", "a", 0.2, 100, TaskType.QA, 20),
    ]


# --- meta -------------------------------------------------------------------------------


def meta_dry_calls(views: Sequence[LongView], now: float) -> list[DryCall]:
    def choose(view: LongView) -> Callable[[Any], str | None]:
        def call(p: Any) -> str | None:
            d = p.choose(view, now)
            if not isinstance(d, Decision) or not isinstance(d.policy_name, str):
                return f"choose must return a scheduling.slo.meta.Decision, got {d!r}"
            if not isinstance(d.reason, str):
                return "choose must give its reason as a string"
            return None
        return call

    calls: list[DryCall] = [(f"choose(view {i})", choose(v)) for i, v in enumerate(views)]
    calls.append(("on_applied", lambda p: p.on_applied("fcfs")))
    return calls


def sample_long_views(now: float) -> tuple[LongView, ...]:
    """Calm, head-of-line blocking, and unfair tenants."""
    calm = LongView(60.0, 2.0, 2.0, 120, 300.0, 150.0, 0.4, 0.02, 0.01, 0.01, 0.0, 1.2, 1.9,
                    0.97, {"a": 0.98, "b": 0.97}, 1.0)
    hol = LongView(60.0, 6.0, 2.0, 300, 500.0, 400.0, 1.8, 0.3, 0.28, 0.05, 0.1, 9.0, 3.5,
                   0.7, {"a": 0.7, "b": 0.72}, 0.99)
    unfair = LongView(60.0, 4.0, 4.0, 200, 300.0, 150.0, 0.5, 0.2, 0.15, 0.05, 0.0, 5.0, 2.6,
                      0.8, {"a": 0.95, "b": 0.3}, 0.8)
    return (calm, hol, unfair)


def live_long_views(core: Any) -> LongView | tuple[ViewBuilder, float]:
    """The live snapshot a meta policy validates on: the meta loop's latest long view
    when it is at most one meta interval old (what the next choice would see), else a
    copy of the SLO views' windows and when it was taken, for `build_long_views`.
    Building walks every completion of the long window: under load that was 70-80 ms of
    the loop's CPU for each store and each activation, in steps, but steps that crowd
    the dispatches all the same."""
    long = core.slo.long
    if long.latest is not None and time.time() - long.latest.taken_at <= long.max_age_s:
        return long.latest.view  # type: ignore[no-any-return]
    return core.slo.views.frozen(), time.time()


async def build_long_views(taken: LongView | tuple[ViewBuilder, float]
                           ) -> tuple[LongView, ...]:
    """On the loop in steps, as the meta loop's own builds (daemon/slo/long_view.py): a
    worker thread would take the GIL from the dispatches in 5 ms bites."""
    if isinstance(taken, LongView):
        return (taken,)
    views, now = taken
    return (await stepped(views.long_view_steps(now)),)


# --- admission --------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionSnapshot:
    """A fence (a copy: dry runs must not touch the daemon's), workers as (id, KV
    utilisation, batch limit), and requests to admit."""

    fence: AdmissionFence
    workers: tuple[tuple[str, float, int], ...]
    requests: tuple[QueuedRequest, ...]


def admission_dry_calls(snap: AdmissionSnapshot, now: float) -> list[DryCall]:
    def step(worker: str, utilisation: float, n_max: int) -> Callable[[Any], str | None]:
        def call(p: Any) -> str | None:
            controls = p.controls(worker, utilisation, n_max, False)
            if not isinstance(controls, ExecutionControls):
                return f"controls must return ExecutionControls, got {type(controls).__name__}"
            for request in snap.requests[:8]:
                d = p.admit(request, worker, snap.fence, controls)
                if not isinstance(d, AdmissionDecision) or not isinstance(d.admit, bool):
                    return f"admit must return an AdmissionDecision, got {type(d).__name__}"
            return None
        return call

    return [(f"controls+admit({w})", step(w, u, n)) for w, u, n in snap.workers]


def sample_admission(now: float) -> AdmissionSnapshot:
    fence = AdmissionFence()
    fence.set_capacity("w-a", 8192)
    fence.set_capacity("w-b", 8192)
    fence.on_admitted("w-a", "r-running-1", 3000)
    fence.on_admitted("w-a", "r-running-2", 2500)
    return AdmissionSnapshot(fence, (("w-a", 0.7, 64), ("w-b", 0.1, 64)),
                             tuple(sample_requests(now)))


# --- the layers ---------------------------------------------------------------------------


def _hosted(layer: str) -> Callable[[Any, Any, Callable[[Any], None]], Any]:
    def install(core: Any, active: Any, on_failure: Callable[[Any], None]) -> Any:
        return core.slo.install(layer, active, on_failure)
    return install


def _default(layer: str) -> Callable[[Any], str]:
    return lambda config: startup_policy(config, layer)


SLO_LAYERS: dict[str, Layer] = {
    "ordering": Layer(
        "ordering", OrderingPolicy, ("push", "pop", "peek", "drain"), ORDERING_BUILTINS,
        ordering_dry_calls, sample=sample_requests,
        live=lambda core: core.slo.ordered.snapshot(LIVE_LIMIT), install=_hosted("ordering"),
        default=_default("ordering"), source_module=scheduling.slo.ordering),
    "meta": Layer(
        "meta", MetaPolicy, ("choose", "on_applied"), META_POLICIES, meta_dry_calls,
        sample=sample_long_views, live=live_long_views, build=build_long_views,
        install=_hosted("meta"), default=_default("meta"),
        tuning=lambda name, core: core.slo.meta_tuning(name)),
    "admission": Layer(
        "admission", AdmissionPolicy, ("controls", "admit"), ADMISSION_POLICIES,
        admission_dry_calls, sample=sample_admission,
        live=lambda core: core.slo.admission_snapshot(), install=_hosted("admission"),
        default=_default("admission")),
}
