"""/metrics as Prometheus, vLLM dashboards and docs/grafana-dashboard.json expect it, from a
real daemon on the sim engine after a few requests: counters end in `_total`, vLLM-named
families carry `model_name` and `worker`, and every series the shipped dashboard queries
is on the page, so the dashboard cannot drift from the code."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon_process import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
MODEL = "sim-llama3-8b"
# The vLLM families agentd reports with vLLM's meaning (vllm/v1/metrics/loggers.py).
VLLM_FAMILIES = (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_cached_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
)
# PromQL names a metric as an identifier; agentd's all start with one of these.
METRIC_IN_PROMQL = re.compile(r"(?<![\w:])(vllm:[a-z0-9_]+|agentd_[a-z0-9_]+)")


@pytest.fixture(scope="module")
def served(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, httpx.Response]]:
    """A daemon with two workers that has finished a few requests, and its /metrics."""
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("metrics"), workers=2).start()
    try:
        for i in range(4):
            r = d.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 8,
                "messages": [{"role": "user", "content": f"metrics request {i}"}]},
                headers={"X-Program-Id": f"metrics-p{i}"})
            assert r.status_code == 200, r.text
        yield d, d.get("/metrics")
    finally:
        d.stop()


def sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_exposition_is_prometheus_text(served: tuple[DaemonProcess, httpx.Response]) -> None:
    _, r = served
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families["vllm:request_success"].type == "counter"
    assert families["vllm:request_time_per_output_token_seconds"].type == "histogram"


def test_every_counter_ends_in_total(served: tuple[DaemonProcess, httpx.Response]) -> None:
    _, r = served
    counters = re.findall(r"^# TYPE (\S+) counter$", r.text, re.M)
    assert len(counters) > 20
    assert [name for name in counters if not name.endswith("_total")] == []


def test_vllm_families_carry_model_and_worker(
        served: tuple[DaemonProcess, httpx.Response]) -> None:
    d, r = served
    names = sample_names(r.text)
    assert [f for f in VLLM_FAMILIES if f not in names] == []
    workers = {w["id"] for w in d.get("/v1/workers").json()["data"]}
    seen_workers: set[str] = set()
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                assert s.labels.get("model_name") == MODEL, s
                assert s.labels.get("worker") in workers, s
                seen_workers.add(s.labels["worker"])
    assert seen_workers == workers
    requests = sum(s.value for f in text_string_to_metric_families(r.text)
                   for s in f.samples if s.name == "vllm:request_success_total")
    tpot = sum(s.value for f in text_string_to_metric_families(r.text)
               for s in f.samples if s.name == "vllm:request_time_per_output_token_seconds_count")
    assert requests == tpot == 4


def test_the_dashboard_queries_only_what_the_daemon_exposes(
        served: tuple[DaemonProcess, httpx.Response]) -> None:
    _, r = served
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    named = {m for e in exprs for m in METRIC_IN_PROMQL.findall(e)}
    assert {"vllm:time_to_first_token_seconds_bucket",
            "vllm:request_time_per_output_token_seconds_bucket", "vllm:kv_cache_usage_perc",
            "agentd_failovers_total", "agentd_requests_failed_total"} <= named
    assert sorted(named - sample_names(r.text)) == []
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("throughput", "first token", "per output token", "kv cache", "queue",
                  "errors", "failovers"):
        assert topic in titles, topic


def test_a_read_token_scrapes_and_no_token_does_not(
        served: tuple[DaemonProcess, httpx.Response], tmp_path: Path) -> None:
    d, _ = served
    made = d.cli("token", "create", "--scope", "read", "--name", "prometheus")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    assert httpx.get(f"{d.url}/metrics", timeout=10).status_code == 401
    scraped = httpx.get(f"{d.url}/metrics", headers={"Authorization": f"Bearer {secret}"},
                        timeout=10)
    assert scraped.status_code == 200 and "vllm:generation_tokens_total" in scraped.text
