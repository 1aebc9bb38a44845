"""/metrics families of the SLO scheduling stack (H-MAS metrics, definitions in
scheduling/slo/metrics.py): cumulative outcome counters, the long window's goodput,
attainment, TTFT/TPOT compliance and ESG ratio, the active policy of each layer, the
meta loop's switches, the LLM meta selector's decisions by what they rested on, and the
stability agent's controls per worker."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from daemon.metrics import Exposition

if TYPE_CHECKING:
    from daemon.slo.stack import SloControl


def slo_families(out: Exposition, slo: SloControl) -> None:
    st = slo.stats
    out.family("agentd_slo_requests_total", "counter",
               "Finished requests by whether they met both their TTFT and TPOT SLOs")
    out.sample("agentd_slo_requests_total", st.met, outcome="met")
    out.sample("agentd_slo_requests_total", st.completed - st.met, outcome="missed")
    _counter(out, "agentd_slo_ttft_met", "Finished requests within their TTFT SLO", st.ttft_ok)
    _counter(out, "agentd_slo_tpot_met", "Finished requests within their TPOT SLO", st.tpot_ok)
    _counter(out, "agentd_slo_esg", "Expected Service Gain of finished requests", st.esg)
    _counter(out, "agentd_slo_esg_max", "ESG had every finished request been on time",
             st.esg_max)
    _window(out, slo)
    out.family("agentd_scheduling_policy", "gauge", "Active policy of each scheduling layer")
    for layer, guard in slo.guards().items():
        out.sample("agentd_scheduling_policy", 1, layer=layer, policy=guard.current.name,
                   version=str(guard.current.version))
    _counter(out, "agentd_ordering_switches", "Ordering policy switches by the meta loop",
             st.switches)
    _counter(out, "agentd_ordering_rollbacks", "Ordering policy rollbacks (guard or failure)",
             st.rollbacks)
    _counter(out, "agentd_meta_bypasses", "Emergency bypasses entered", st.bypasses)
    out.family("agentd_meta_bypass_active", "gauge", "1 while the emergency bypass runs")
    out.sample("agentd_meta_bypass_active", int(slo.bypass))
    _counter(out, "agentd_admission_refusals", "Requests the admission policy held back",
             st.refusals)
    out.family("agentd_meta_llm_decisions_total", "counter",
               "Decisions of the LLM meta selector by outcome (accepted: the model's answer; "
               "any other: the rule map's, and why)")
    for outcome, n in sorted(slo.llm.outcomes.items()):
        out.sample("agentd_meta_llm_decisions_total", n, outcome=outcome)
    _controls(out, slo)


def _counter(out: Exposition, name: str, help_text: str, value: float) -> None:
    out.family(f"{name}_total", "counter", help_text)
    out.sample(f"{name}_total", value)


def _window(out: Exposition, slo: SloControl) -> None:
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
        out.family(name, "gauge", f"{help_text}, {window}")
        out.sample(name, round(value, 6))


def _controls(out: Exposition, slo: SloControl) -> None:
    rows = (
        ("agentd_admission_n_run", "Running-request cap N_run per worker", "n_run"),
        ("agentd_admission_token_budget",
         "Per-cycle token budget (advisory: no engine behind the daemon takes it)",
         "token_budget"),
    )
    for name, help_text, attr in rows:
        out.family(name, "gauge", help_text)
        for worker, c in slo.controls.items():
            out.sample(name, getattr(c, attr), worker=worker)
    out.family("agentd_admission_reserved_tokens", "gauge",
               "KV tokens the fence reserves for running requests per worker")
    for worker in slo.controls:
        out.sample("agentd_admission_reserved_tokens", slo.fence.reserved(worker), worker=worker)
