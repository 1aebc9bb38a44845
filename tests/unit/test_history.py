"""The daemon's history, its pure parts with an injected clock: one sample per interval
(rates, percentiles, counters), the tiers' folding and choice, the event log's folding
of storms and its tenancy; then rollup and retention in a real SQLite store."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from daemon.history import tiers
from daemon.history.events import EventLog
from daemon.history.sampler import FOLD, Ended, Gauges, IntervalStats, percentile
from daemon.history.store import HistoryStore
from daemon.history.tiers import MAX, Point, Tier
from db import models
from tests.store_fixtures import Store

HOUR, DAY, WEEK = 3600.0, 86400.0, 7 * 86400.0
TIERS = tiers.tiers_of(HOUR, DAY, WEEK)


def _gauges(good: int = 0, refused: int = 0, http: int = 0, **kw: Any) -> Gauges:
    base: dict[str, Any] = {"kv_used_pct": {"w0": 50.0}, "queue_length": 3,
                            "paused_programs": 1, "healthy_workers": 1}
    return Gauges(**{**base, **kw}, good_total=good, refused_total=refused,
                  http_5xx_total=http)


def _values(points: list[Point]) -> dict[str, float]:
    return {p.series if not p.label else f"{p.series}:{p.label}": p.value for p in points}


# --- sampling ----------------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0


def test_one_interval_gives_rates_percentiles_and_gauges() -> None:
    stats = IntervalStats(started=100.0)
    for ttft in (0.1, 0.2, 0.3, 0.4):
        stats.on_end(Ended(True, 10, ttft, 0.05))
    stats.on_end(Ended(False, 0, None, None))
    first = _values(stats.take(110.0, _gauges(good=3, refused=2)))
    assert first["requests_per_s"] == pytest.approx(0.4)
    assert first["tokens_per_s"] == pytest.approx(4.0)
    assert first["failed_per_s"] == pytest.approx(0.1)
    assert first["ttft_p50_s"] == 0.2 and first["ttft_p99_s"] == 0.4
    assert first["tpot_p95_s"] == 0.05
    assert first["kv_used_pct:w0"] == 50.0 and first["queue_length"] == 3
    # counters need a previous sample for a rate: none in the first interval
    assert "goodput_per_s" not in first and "refused_per_s" not in first
    second = _values(stats.take(115.0, _gauges(good=8, refused=2, http=5, pauses_total=10)))
    assert second["goodput_per_s"] == pytest.approx(1.0)  # 5 more over 5 s
    assert second["refused_per_s"] == 0.0 and second["http_5xx_per_s"] == pytest.approx(1.0)
    assert second["requests_per_s"] == 0.0 and second["pauses_per_s"] == pytest.approx(2.0)
    assert "ttft_p50_s" not in second  # nothing ended: no made-up latency


def test_a_counter_that_went_down_gives_no_negative_rate() -> None:
    stats = IntervalStats(started=0.0)
    stats.take(10.0, _gauges(good=50))
    assert _values(stats.take(20.0, _gauges(good=2)))["goodput_per_s"] == 0.0


# --- tiers -------------------------------------------------------------------------------


def test_fold_means_by_samples_and_keeps_the_worst_percentile() -> None:
    points = [Point("requests_per_s", "", 60.0, 1.0), Point("requests_per_s", "", 70.0, 3.0),
              Point("requests_per_s", "", 130.0, 5.0, samples=2),
              Point("ttft_p99_s", "", 61.0, 0.2), Point("ttft_p99_s", "", 62.0, 0.9)]
    folded = tiers.fold(points, 60, FOLD)
    got = {(p.series, p.ts): (p.value, p.samples) for p in folded}
    assert got[("requests_per_s", 60.0)] == (2.0, 2)
    assert got[("requests_per_s", 120.0)] == (5.0, 2)
    assert got[("ttft_p99_s", 60.0)] == (0.9, 2)
    assert FOLD["ttft_p99_s"] == MAX


def test_due_buckets_are_complete_ones_after_the_watermark() -> None:
    assert tiers.due_buckets(60, None, None, 1000.0) is None
    assert tiers.due_buckets(60, None, 125.0, 1000.0) == (120.0, 960.0)
    assert tiers.due_buckets(60, 960.0, 125.0, 1010.0) is None  # 960-1020 is not over
    assert tiers.due_buckets(60, 960.0, 125.0, 1020.0) == (960.0, 1020.0)


@pytest.mark.parametrize(("span", "step", "tier_step"), [
    (HOUR, 12.0, 0), (DAY, 288.0, 60), (WEEK, 2016.0, 600), (HOUR, 600.0, 600),
    (2 * HOUR, 12.0, 60), (30 * DAY, 60.0, 600)])
def test_a_read_picks_the_tier_that_holds_its_span(span: float, step: float,
                                                   tier_step: int) -> None:
    now = 1e6
    assert tiers.pick_tier(TIERS, now - span, step, now).step_s == tier_step


# --- events ------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _trace(kind: str, ts: float = 1000.0, **fields: Any) -> dict[str, Any]:
    ids = {k: fields.pop(k, None) for k in ("session_id", "program_id", "request_id",
                                            "worker_id")}
    return {"ts": ts, "kind": kind, **ids, "data": fields}


def test_a_refusal_storm_is_one_event_per_tenant_with_its_count() -> None:
    rows: list[dict[str, Any]] = []
    log = EventLog(rows.append, _Clock())
    for n in range(500):
        tenant = "a" if n % 5 else "b"
        log.observe(_trace("request.queued", request_id=f"r{n}", tenant=tenant))
        log.observe(_trace("admission.refused", ts=1000.0 + n, request_id=f"r{n}",
                           session_id="s", program_id="p", reason="kv fence full"))
    assert rows == []  # folded until the flush
    assert log.flush() == 2
    by_tenant = {r["tenant"]: r for r in rows}
    assert by_tenant["a"]["count"] == 400 and by_tenant["b"]["count"] == 100
    assert by_tenant["a"]["kind"] == "request.refused"
    assert by_tenant["a"]["ts"] == 1001.0 and by_tenant["a"]["last_ts"] == 1499.0
    assert "400 request(s) of tenant a refused" in by_tenant["a"]["message"]
    assert log.flush() == 0


def test_cluster_events_name_no_tenant_object() -> None:
    rows: list[dict[str, Any]] = []
    log = EventLog(rows.append, _Clock())
    log.observe(_trace("request.queued", request_id="r1", tenant="b"))
    log.observe(_trace("worker.unhealthy", worker_id="w0", reason="no heartbeat for 3.1s"))
    log.observe(_trace("request.failover", request_id="r1", session_id="b-secret-session",
                       program_id="b-prog", worker_id="w0", reason="worker w0 lost",
                       generated_tokens=4))
    log.http_answer(503)
    log.http_answer(503)
    log.flush()
    crash, failover, http = (next(r for r in rows if r["kind"] == k)
                             for k in ("worker.crash", "request.failover", "http.5xx"))
    assert crash["severity"] == "error" and crash["tenant"] is None
    assert "w0 stopped answering" in crash["message"]
    assert failover["tenant"] is None and failover["worker_id"] == "w0"
    assert "b-secret-session" not in str(failover) and "b-prog" not in str(failover)
    assert http["count"] == 2 and "2 x 503" in http["message"]


def test_expiries_and_failures_carry_their_tenant_and_startup_is_quiet() -> None:
    rows: list[dict[str, Any]] = []
    log = EventLog(rows.append, _Clock())
    log.observe(_trace("policy.activated", layer="ordering", name="fcfs", version=1,
                       by="startup"))
    log.observe(_trace("program.expired", program_id="p1", tenant="a", timeout_s=1.0,
                       idle_s=1.2))
    log.observe(_trace("request.queued", request_id="r2", tenant="b"))
    log.observe(_trace("request.failed", request_id="r2", error="engine error"))
    log.observe(_trace("request.failed", request_id="r2"))  # its tenant is forgotten now
    log.observe({"kind": "program.expired"})  # a malformed row never raises
    log.flush()
    kinds = {(r["kind"], r["tenant"]) for r in rows}
    # one whose tenant is not known is not shown as the cluster's: operators only
    assert kinds == {("program.expired", "a"), ("request.failed", "b"),
                     ("request.failed", "(unknown)")}


# --- rollup and retention in the store ---------------------------------------------------


async def _count(store: Store, step_s: int) -> int:
    async with store[1]() as s:
        return int(await s.scalar(select(func.count()).select_from(models.HistoryPoint)
                                  .where(models.HistoryPoint.step_s == step_s)) or 0)


async def test_rollup_folds_complete_minutes_and_prunes_what_is_too_old(
        store_with_writer: Store) -> None:
    writer, sessions = store_with_writer
    clock = _Clock()
    clock.now = 0.0
    small = (Tier(0, 300.0), Tier(60, 1200.0), Tier(600, 3600.0))
    hs = HistoryStore(sessions, writer, small, 10.0, 600.0, clock)
    for t in range(0, 3600, 10):  # an hour of raw samples, 10 s apart
        hs.add([Point("requests_per_s", "", float(t), float(t // 60)),
                Point("ttft_p99_s", "", float(t), 1.0 if t % 60 else 2.0)])
    writer.insert("events", {"ts": 10.0, "last_ts": 10.0, "kind": "worker.crash",
                             "severity": "error", "tenant": None, "worker_id": "w0",
                             "count": 1, "message": "x", "data": {}})
    clock.now = 3600.0
    await hs.maintain()
    # raw: only the last 300 s stay (30 samples of 2 series)
    assert await _count(store_with_writer, 0) == 60
    # minutes: every minute that ended 5 s (the fold lag) before now, the last 1200 s kept
    assert await _count(store_with_writer, 60) == 2 * 19
    minute = await hs.read(["requests_per_s", "ttft_p99_s"], 3600.0 - 1200.0, 3600.0, 60.0)
    assert minute["tier_step_s"] == 60
    series = {s["name"]: s["points"] for s in minute["series"]}
    assert series["requests_per_s"][0] == [2400.0, 40.0]  # mean of the minute's samples
    assert {v for _, v in series["ttft_p99_s"]} == {2.0}  # the minute's worst
    async with sessions() as s:
        assert await s.scalar(select(func.count()).select_from(models.OperatorEvent)) == 0
    # 10 minutes: 0-3000 folded from the minutes before they were pruned
    assert await _count(store_with_writer, 600) == 2 * 5
    # a later round folds the minute that has ended since, and none twice
    clock.now = 3630.0
    await hs.maintain()
    assert await _count(store_with_writer, 60) == 2 * 19 + 2 - 2  # +3540, -2400 (pruned)
    assert await _count(store_with_writer, 600) == 2 * 5


# --- configuration -----------------------------------------------------------------------


def test_history_config_keys_have_defaults_and_refuse_bad_values() -> None:
    from daemon.config import ConfigError, load

    cfg = load(env={})
    assert (cfg.history_interval_s, cfg.history_raw_keep_s, cfg.history_minute_keep_s,
            cfg.history_ten_minute_keep_s) == (10.0, HOUR, DAY, WEEK)
    assert load(env={"AGENTD_HISTORY_INTERVAL_S": "0"}).history_interval_s == 0.0
    for key, value in (("HISTORY_INTERVAL_S", "-1"), ("HISTORY_RAW_KEEP_S", "60"),
                       ("HISTORY_MINUTE_KEEP_S", "600"), ("HISTORY_EVENTS_KEEP_S", "1")):
        with pytest.raises(ConfigError, match=key.lower()):
            load(env={f"AGENTD_{key}": value})


async def test_a_coarse_read_folds_in_the_store_by_mean_and_worst(
        store_with_writer: Store) -> None:
    writer, sessions = store_with_writer
    clock = _Clock()
    clock.now = 600.0
    hs = HistoryStore(sessions, writer, TIERS, 10.0, DAY, clock)
    for t in range(0, 600, 10):  # ten minutes of raw samples
        hs.add([Point("requests_per_s", "", float(t), float(t % 60)),
                Point("ttft_p99_s", "", float(t), float(t))])
    # two minutes a point: the minute tier, empty before a rollup, so all of it from the
    # raw samples, folded in the store
    body = await hs.read(None, 0.0, 599.0, 120.0)
    assert body["tier_step_s"] == 60 and body["step_s"] == 120
    series = {s["name"]: s["points"] for s in body["series"]}
    assert series["requests_per_s"] == [[float(b), 25.0] for b in range(0, 600, 120)]
    assert series["ttft_p99_s"] == [[float(b), float(b + 110)] for b in range(0, 600, 120)]
    native = await hs.read(["ttft_p99_s"], 0.0, 599.0, 10.0)  # the raw tier, as stored
    assert native["tier_step_s"] == 0 and native["step_s"] == 10.0
    assert len(native["series"][0]["points"]) == 60


async def test_the_api_s_5xx_answers_are_counted() -> None:
    from litestar import Litestar, get
    from litestar.testing import AsyncTestClient

    from daemon.api.errors import EXCEPTION_HANDLERS
    from daemon.errors import ApiError
    from daemon.history.http_tally import HttpTally

    @get("/ok")
    async def ok() -> str:
        return "ok"

    @get("/busy")
    async def busy() -> str:
        raise ApiError(503, "no engine worker is registered yet", "no_workers")

    tally, seen = HttpTally(), list[int]()
    tally.on_error = seen.append
    app = Litestar([ok, busy], middleware=[tally.middleware],
                   exception_handlers=EXCEPTION_HANDLERS)
    async with AsyncTestClient(app) as client:
        assert (await client.get("/ok")).status_code == 200
        assert (await client.get("/busy")).status_code == 503
        assert (await client.get("/missing")).status_code == 404
    assert tally.errors_5xx == 1 and seen == [503]
