"""/metrics families of the SLO scheduling stack (H-MAS metrics, definitions in
scheduling/slo/metrics.py): cumulative outcome counters, the long window's goodput,
attainment, TTFT/TPOT compliance and ESG ratio, the active policy of each layer, the
meta loop's switches, the LLM meta selector's decisions by what they rested on, and the
stability agent's controls per worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from daemon.metrics import counter, gauge, labelled_counter, labelled_gauge

if TYPE_CHECKING:
    from daemon.slo.stack import SloControl


def slo_families(slo: SloControl) -> Iterator[Metric]:
    st = slo.stats
    yield labelled_counter(
        "agentd_slo_requests_total",
        "Finished requests by whether they met both their TTFT and TPOT SLOs",
        ["outcome"], [(["met"], st.met), (["missed"], st.completed - st.met)])
    yield counter("agentd_slo_ttft_met_total", "Finished requests within their TTFT SLO",
                  st.ttft_ok)
    yield counter("agentd_slo_tpot_met_total", "Finished requests within their TPOT SLO",
                  st.tpot_ok)
    yield counter("agentd_slo_esg_total", "Expected Service Gain of finished requests", st.esg)
    yield counter("agentd_slo_esg_max_total", "ESG had every finished request been on time",
                  st.esg_max)
    yield from _window(slo)
    yield labelled_gauge(
        "agentd_scheduling_policy", "Active policy of each scheduling layer",
        ["layer", "policy", "version"],
        [([layer, guard.current.name, str(guard.current.version)], 1)
         for layer, guard in slo.guards().items()])
    yield counter("agentd_ordering_switches_total", "Ordering policy switches by the meta loop",
                  st.switches)
    yield counter("agentd_ordering_rollbacks_total",
                  "Ordering policy rollbacks (guard or failure)", st.rollbacks)
    yield counter("agentd_meta_bypasses_total", "Emergency bypasses entered", st.bypasses)
    yield gauge("agentd_meta_bypass_active", "1 while the emergency bypass runs",
                int(slo.bypass))
    yield counter("agentd_admission_refusals_total", "Requests the admission policy held back",
                  st.refusals)
    yield labelled_counter(
        "agentd_meta_llm_decisions_total",
        "Decisions of the LLM meta selector by outcome (accepted: the model's answer; "
        "any other: the rule map's, and why)",
        ["outcome"], [([outcome], n) for outcome, n in sorted(slo.llm.outcomes.items())])
    yield from _controls(slo)


def _window(slo: SloControl) -> Iterator[Metric]:
    v = slo.window(time.time())  # built off the loop by the meta tick
    window = f"over the last {v.window_s:.0f}s"
    for name, help_text, value in (
        ("agentd_slo_goodput_rps", "Requests meeting both SLOs per second", v.goodput),
        ("agentd_slo_attainment", "Fraction of requests meeting both SLOs",
         1 - v.violation_rate),
        ("agentd_slo_ttft_compliance", "Fraction within the TTFT SLO",
         1 - v.ttft_violation_rate),
        ("agentd_slo_tpot_compliance", "Fraction within the TPOT SLO",
         1 - v.tpot_violation_rate),
        ("agentd_slo_esg_ratio", "ESG over its maximum", v.esg_ratio),
    ):
        yield gauge(name, f"{help_text}, {window}", round(value, 6))


def _controls(slo: SloControl) -> Iterator[Metric]:
    rows = (
        ("agentd_admission_n_run", "Running-request cap N_run per worker", "n_run"),
        ("agentd_admission_token_budget",
         "Per-cycle token budget (advisory: no engine behind the daemon takes it)",
         "token_budget"),
    )
    for name, help_text, attr in rows:
        yield labelled_gauge(name, help_text, ["worker"],
                             [([worker], getattr(c, attr)) for worker, c in slo.controls.items()])
    yield labelled_gauge(
        "agentd_admission_reserved_tokens",
        "KV tokens the fence reserves for running requests per worker", ["worker"],
        [([worker], slo.fence.reserved(worker)) for worker in slo.controls])
