"""Tenants in the SLO stack: the [slo.tenants] table, per-tenant SLOs at tagging, tenant
weights for the built-in WFQ/stride, session tenants in a real store, and the token
tenant column (including a store made before it existed)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.ext.asyncio import AsyncEngine

from daemon.access import auth
from daemon.access.names import DEFAULT_TENANT, tenant_problem
from daemon.access.session_tenants import SessionTenants
from daemon.commands.cli import main
from daemon.policies.swap import Active
from daemon.slo.queue import OrderedQueue, weigh_tenants
from daemon.slo.settings import parse_settings
from daemon.slo.tagging import Tagging
from daemon.state import ProgramState, ProgramStatus, RequestState
from daemon.workers.protocol import ChatMessage, SamplingParams
from db import models, tokens
from db.engine import alembic_config, make_engine, make_sessionmaker, sqlite_url, upgrade
from db.writer import BatchWriter
from scheduling.slo.ordering import Wfq
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import TABLE_6, Slo, SloTable, TaskType

NOW = 1000.0
GOLD_QA = Slo(1.5, 0.06)


def test_the_tenants_table_gives_weights_and_slo_overrides() -> None:
    s = parse_settings({"tenants": {
        "gold": {"weight": 3, "slo": {"qa": {"ttft_ms": 1500, "tpot_ms": 60}}},
        "free": {"weight": 0.5}}})
    assert s.tenant_weights == {"gold": 3.0, "free": 0.5}
    assert s.tenant_slos == {"gold": {TaskType.QA: GOLD_QA}}
    assert parse_settings({}).tenant_weights == {}


@pytest.mark.parametrize(("raw", "key"), [
    ({"tenants": 3}, "slo.tenants"),
    ({"tenants": {"no spaces": {}}}, "slo.tenants.no spaces"),
    ({"tenants": {"gold": {"weight": 0}}}, "slo.tenants.gold.weight"),
    ({"tenants": {"gold": {"weight": "heavy"}}}, "slo.tenants.gold.weight"),
    ({"tenants": {"gold": {"share": 2}}}, "slo.tenants.gold.share"),
    ({"tenants": {"gold": {"slo": {"poetry": {}}}}}, "slo.tenants.gold.slo.poetry"),
    ({"tenants": {"gold": {"slo": {"qa": {"ttft_ms": 100}}}}}, "slo.tenants.gold.slo.qa"),
    ({"tenants": {"gold": {"slo": {"qa": {"ttft_ms": 100, "tpot_ms": -1}}}}},
     "slo.tenants.gold.slo.qa"),
])
def test_bad_tenant_tables_name_their_key(raw: dict, key: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=f"'{key}"):
        parse_settings(raw)


@pytest.mark.parametrize(("name", "ok"), [
    ("gold", True), ("tok-0123abcd", True), ("acme.eu_1", True), ("x" * 64, True),
    ("", False), ("-lead", False), ("a b", False), ("x" * 65, False), ("é", False),
    ("a/b", False),
])
def test_tenant_names(name: str, ok: bool) -> None:
    assert (tenant_problem(name) is None) is ok


def _request(n: int, program: str) -> RequestState:
    return RequestState(id=f"req-{n}", program_id=program, session_id=program, kind="chat",
                        model="m", sampling=SamplingParams(max_tokens=64), queued_at=NOW,
                        messages=[ChatMessage(role="user", content="What is the capital of "
                                              "France?")])


def _program(pid: str) -> ProgramState:
    return ProgramState(id=pid, session_id=pid, status=ProgramStatus.QUEUED, created_at=NOW,
                        status_since=NOW)


def test_a_tenant_slo_override_applies_to_that_tenants_requests_only() -> None:
    tagging = Tagging(4096, SloTable(tenant_overrides={"gold": {TaskType.QA: GOLD_QA}}))
    tagging.tenants.update({"p-gold": "gold", "p-free": "free"})
    tagged = {pid: tagging.tag(_request(n, pid), _program(pid))
              for n, pid in enumerate(("p-gold", "p-free", "p-nobody"))}
    assert {pid: (q.tenant, q.task, q.slo) for pid, q in tagged.items()} == {
        "p-gold": ("gold", TaskType.QA, GOLD_QA),
        "p-free": ("free", TaskType.QA, TABLE_6[TaskType.QA]),
        "p-nobody": (DEFAULT_TENANT, TaskType.QA, TABLE_6[TaskType.QA])}
    tagging.forget("p-gold")
    assert tagging.tag(_request(9, "p-gold"), _program("p-gold")).tenant == DEFAULT_TENANT


def _queued(n: int, tenant: str) -> QueuedRequest:
    return QueuedRequest(f"{tenant}-{n}", tenant, NOW + n * 1e-3, 100, TaskType.QA, 0.75,
                         TABLE_6[TaskType.QA], 50, 100, 0.05, 0.03)


def _first_eight(q: OrderedQueue) -> list[str]:
    out = []
    for _ in range(8):
        head = q.peek(NOW)
        assert head is not None and q.take(head, NOW)
        out.append(head.tenant)
    return out


def _backlog(weights: dict[str, float] | None) -> OrderedQueue:
    tune = None if weights is None else weigh_tenants(weights)
    q = OrderedQueue(Active("fcfs", 1, Wfq()), clock=lambda: NOW, tune=tune)
    for n in range(8):  # free's requests are all older
        q.push(_queued(n, "free"), NOW)
    for n in range(8, 16):
        q.push(_queued(n, "gold"), NOW)
    return q


@pytest.mark.parametrize("name", ["wfq", "stride"])
def test_builtin_wfq_and_stride_take_the_tenant_weights_on_a_switch(name: str) -> None:
    def policy() -> Wfq:
        return Wfq(unit_cost=name == "stride")

    q = _backlog({"gold": 3.0, "free": 1.0})
    q.switch(Active(name, 1, policy()))
    assert _first_eight(q).count("gold") == 6  # three of gold's to each one of free's
    unweighted = _backlog(None)
    unweighted.switch(Active(name, 1, policy()))
    assert _first_eight(unweighted).count("gold") == 4
    # An operator's own version keeps the weights it was written with (none here).
    q.switch(Active(name, 2, policy()))
    assert q.guard.current.policy.weights == {}


@pytest.fixture
async def engine(store_url: str) -> AsyncIterator[AsyncEngine]:
    url = store_url
    await upgrade(url)
    eng = make_engine(url)
    yield eng
    await eng.dispose()


def _session_row(sid: str) -> dict[str, object]:
    return {"id": sid, "tenant": DEFAULT_TENANT, "priority": 0, "slo_class": "default",
            "pinned_worker": None, "state": {}, "created_at": NOW, "updated_at": NOW}


async def test_session_tenants_are_written_through_the_batched_writer(
    engine: AsyncEngine,
) -> None:
    writer = BatchWriter(engine)
    writer.start()
    sessions = make_sessionmaker(engine)
    tenants = SessionTenants(sessions, writer)
    try:
        assert await tenants.of("s-new") is None
        writer.insert("sessions", _session_row("s-new"))  # as the core creates a session
        tenants.created("s-new", "gold")
        tenants.created("s-new", "free")  # lost a race: the first one recorded stands
        writer.insert("sessions", _session_row("s-once"))
        tenants.created("s-once", "acme", remember=False)
        await writer.flush()
        writer.insert("sessions", _session_row("s-late"))
        await writer.flush()
        tenants.created("s-late", "late")  # its insert already went out: an update
        await writer.flush()
        async with sessions() as s:
            stored = {sid: (await s.get(models.Session, sid)).tenant
                      for sid in ("s-new", "s-once", "s-late")}
        assert stored == {"s-new": "gold", "s-once": "acme", "s-late": "late"}
        assert await tenants.of("s-new") == "gold"
        assert await tenants.of("s-once") == "acme"  # read from the store
    finally:
        await writer.stop()


async def test_tokens_carry_a_tenant_and_default_to_their_id(engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(engine)
    async with sessions() as s, s.begin():
        plain_id, plain = await auth.issue_token(s, "plain", {auth.SUBMIT})
        gold_id, gold = await auth.issue_token(s, "gold", {auth.SUBMIT}, "gold")
    checker = auth.TokenAuth(enabled=True)
    checker.bind(sessions)
    assert (await checker.principal(plain)).tenant == plain_id  # type: ignore[union-attr]
    assert (await checker.principal(gold)).tenant == "gold"  # type: ignore[union-attr]
    async with sessions() as s:
        assert {r.id: r.tenant for r in await tokens.list_all(s)} == {
            plain_id: plain_id, gold_id: "gold"}


def test_a_store_from_before_tenants_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = sqlite_url(path)
    command.upgrade(alembic_config(url), "0001")  # the schema as the first release had it
    with sqlite3.connect(path) as conn:
        assert "tenant" not in {c[1] for c in conn.execute("PRAGMA table_info(api_tokens)")}
        conn.execute("INSERT INTO api_tokens VALUES ('tok-old', 'old', ?, 'submit', 1.0, NULL)",
                     (tokens.hash_secret("agd_old"),))
    data = ["--db", url, "--data-dir", str(tmp_path)]
    assert main(["token", "list", "--json", *data]) == 0  # the CLI upgrades the store
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT tenant FROM api_tokens").fetchall() == [(None,)]


def test_token_cli_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTD_CONFIG", raising=False)
    monkeypatch.delenv("AGENTD_DB", raising=False)
    data = ["--data-dir", str(tmp_path)]
    assert main(["token", "create", "--scope", "submit", "--name", "a", "--tenant", "acme",
                 *data]) == 0
    assert "tenant: acme" in capsys.readouterr().err
    assert main(["token", "create", "--scope", "submit", "--name", "b", *data]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--json", *data]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["name"]: r["tenant"] for r in rows} == {"a": "acme", "b": rows[1]["id"]}
    assert main(["token", "list", *data]) == 0
    assert "TENANT" in capsys.readouterr().out
    assert main(["token", "create", "--scope", "submit", "--name", "c", "--tenant", "a b",
                 *data]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("agentd: --tenant: 'a b' is not a tenant")
