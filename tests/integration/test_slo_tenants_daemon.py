"""Tenants in a real daemon: tokens carry them, the SLO stack schedules by them (stride
weights, per-tenant SLO overrides), sessions record them, the rate limiter keys on them,
and only operator tokens may name one explicitly."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import openai

from daemon.access import auth
from db.engine import make_engine, make_sessionmaker
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
QUESTION = "What is the capital of France?"  # tagged qa
ANSWER_TOKENS = 300
PER_TENANT = 8
# Stride (WFQ with unit cost) isolates the weights from the cost estimates, which the
# daemon learns while the burst runs. A 512-token sim KV with its 10% fragmentation
# reserve holds one request of ~310 tokens (prompt plus max_tokens) and not two, so
# the rest wait in the daemon's queue, in the ordering policy's order.
CONFIG = """\
kv_policy = "vllm-default"
ordering_policy = "stride"
meta_policy = "off"
sim_kv_tokens = 512
sim_time_scale = 0.1

[slo.tenants.gold]
weight = 3
[slo.tenants.gold.slo]
qa = { ttft_ms = 1500, tpot_ms = 60 }
[slo.tenants.free]
weight = 1
"""


def configured(daemon_factory: Any, tmp_path: Path, config: str, **kw: Any) -> DaemonProcess:
    path = tmp_path / "agentd.toml"
    path.write_text(config)
    return daemon_factory(extra_args=["--config", str(path)], **kw).start()  # type: ignore[no-any-return]


def token(d: DaemonProcess, scope: str, name: str, *extra: str) -> tuple[str, str]:
    """(id, secret) of a new token, made with the CLI while the daemon runs."""
    done = d.cli("token", "create", "--scope", scope, "--name", name, *extra)
    assert done.returncode == 0, done.stderr
    found = re.search(r"created token (tok-\w+)", done.stderr)
    assert found is not None, done.stderr
    return found.group(1), done.stdout.strip()


def issue(d: DaemonProcess, name: str, tenant: str | None = None) -> tuple[str, str]:
    """(id, secret) of a new submit token, written to the running daemon's store the way
    `agentd token create` writes it, without a CLI process per token."""
    async def run() -> tuple[str, str]:
        engine = make_engine(d.db_url)
        try:
            async with make_sessionmaker(engine)() as s, s.begin():
                return await auth.issue_token(s, name, {auth.SUBMIT}, tenant)
        finally:
            await engine.dispose()
    return asyncio.run(run())


def chat(d: DaemonProcess, secret: str, headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
               "max_tokens": 2, **body}
    return httpx.post(f"{d.url}/v1/chat/completions", json=payload, timeout=60,
                      headers={"Authorization": f"Bearer {secret}", **(headers or {})})


def session_events(d: DaemonProcess, session: str, kind: str) -> list[dict[str, Any]]:
    data = d.get(f"/v1/sessions/{session}/trace", params={"limit": 1000}).json()["data"]
    return [e for e in data if e["kind"] == kind]


async def backlog(d: DaemonProcess, free: str, gold: str) -> None:
    """All of free's requests queue first, then all of gold's."""
    def client(secret: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{d.url}/v1", api_key=secret, max_retries=0,
                                  timeout=120)

    def ask(c: openai.AsyncOpenAI, session: str) -> Any:
        return c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}],
            max_tokens=ANSWER_TOKENS, extra_body={"session_id": session})

    frees = [asyncio.create_task(ask(client(free), "s-free")) for _ in range(PER_TENANT)]
    await asyncio.to_thread(
        wait_for, lambda: d.get("/v1/scheduling").json()["queued"] == PER_TENANT - 1, 30,
        "free's requests to queue behind the first")
    golds = [ask(client(gold), "s-gold") for _ in range(PER_TENANT)]
    answers = await asyncio.gather(*frees, *golds)
    assert all(a.usage.completion_tokens == ANSWER_TOKENS for a in answers)


def test_tenants_are_scheduled_by_their_weights_and_slos(  # type: ignore[no-untyped-def]
        daemon_factory, tmp_path, daemon_db) -> None:
    d = configured(daemon_factory, tmp_path, CONFIG, db=daemon_db)
    gold_id, gold = token(d, "submit", "gold client", "--tenant", "gold")
    _, free = issue(d, "free client", "free")
    other_id, other = issue(d, "no tenant")
    bad = d.cli("token", "create", "--scope", "submit", "--name", "x", "--tenant", "a b")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("agentd: --tenant: 'a b' is not a tenant name")
    listed = d.cli("token", "list", "--json").stdout
    assert f'"id": "{gold_id}", "name": "gold client", "scopes": "submit", "tenant": "gold"' \
        in listed and f'"tenant": "{other_id}"' in listed

    asyncio.run(backlog(d, free, gold))

    # Sessions record the tenant that created them.
    assert d.get("/v1/sessions/s-gold").json()["tenant"] == "gold"
    assert [s["id"] for s in d.get("/v1/sessions", params={"tenant": "free"}).json()["data"]
            ] == ["s-free"]
    # Each tenant's SLO: gold's override for qa, Table 6's 4 s for free.
    queued = {s: session_events(d, s, "request.queued") for s in ("s-gold", "s-free")}
    assert {(e["data"]["tenant"], e["data"]["task"], e["data"]["slo_ttft_s"],
             e["data"]["slo_tpot_s"]) for e in queued["s-gold"]} == {("gold", "qa", 1.5, 0.06)}
    assert {(e["data"]["tenant"], e["data"]["slo_ttft_s"]) for e in queued["s-free"]} == {
        ("free", 4.0)}
    # Dispatch order, from the trace: once gold's requests are queued, stride serves
    # about three of gold's per one of free's, though free's had all been waiting longer.
    # (In arrival order, as FCFS serves, free's six or seven would come first.)
    gold_queued = max(e["id"] for e in queued["s-gold"])
    dispatched = sorted((e for s in ("s-gold", "s-free")
                         for e in session_events(d, s, "request.dispatched")),
                        key=lambda e: e["id"])
    assert {e["data"]["ordering"] for e in dispatched} == {"stride"}
    order = [e["data"]["tenant"] for e in dispatched if e["id"] > gold_queued]
    assert len(order) > PER_TENANT and order[:PER_TENANT].count("gold") >= 6, order
    status = d.get("/v1/scheduling").json()
    assert status["tenants"]["weights"] == {"gold": 3.0, "free": 1.0}
    assert status["tenants"]["slo_overrides"] == ["gold"]
    assert set(status["tenants"]["attainment"]) == {"gold", "free"}

    # A token without a tenant runs as its own id; only operators may name a tenant.
    assert chat(d, other, session_id="s-other").status_code == 200
    assert session_events(d, "s-other", "request.queued")[0]["data"]["tenant"] == other_id
    refused = chat(d, gold, headers={"X-Tenant": "free"})
    assert refused.status_code == 403, refused.text
    err = refused.json()["error"]
    assert (err["code"], err["param"]) == ("tenant_not_allowed", "X-Tenant")
    assert "runs as tenant 'gold'" in err["message"]
    bad_name = chat(d, d.token, tenant="no spaces please")
    assert bad_name.status_code == 400 and bad_name.json()["error"]["param"] == "tenant"
    assert chat(d, d.token, session_id="s-proxy", tenant="gold").status_code == 200
    assert session_events(d, "s-proxy", "request.queued")[0]["data"]["tenant"] == "gold"
    assert d.get("/v1/sessions/s-proxy").json()["tenant"] == "gold"


def test_tokens_of_one_tenant_share_its_rate_bucket(  # type: ignore[no-untyped-def]
        daemon_factory, tmp_path, daemon_db) -> None:
    d = daemon_factory(db=daemon_db, env={"AGENTD_RATE_LIMIT_RPS": "0.01",
                                          "AGENTD_RATE_LIMIT_BURST": "2"}).start()
    _, first = issue(d, "acme one", "acme")
    _, second = issue(d, "acme two", "acme")
    _, loner = issue(d, "loner")
    assert chat(d, first).status_code == 200
    assert chat(d, second).status_code == 200
    limited = chat(d, first)
    assert limited.status_code == 429 and "tenant 'acme'" in limited.json()["error"]["message"]
    assert chat(d, second).status_code == 429
    assert chat(d, loner).status_code == 200  # a token without a tenant has its own bucket
