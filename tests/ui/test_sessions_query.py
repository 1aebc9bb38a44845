"""Sessions and programs filtered, sorted and paged by the daemon over all of them
(GET /v1/sessions?q=&tenant=&sort=&order=, GET /v1/programs?sort=&order=), and the web
UI's sessions and programs pages on top of them.

The store holds more rows than any one page can ask for (limit ≤ 1000): one real
session with a program, made through the gateway first, then 1,050 newer sessions (the oldest
of them holding 1,050 stopped programs), written into the daemon's store while it is stopped
(making each through the gateway would take minutes). A filter or a sort must still find
the oldest one. Every test runs on both stores: SQLite, and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import create_engine, insert
from sqlalchemy.pool import NullPool

from db import models
from db.engine import sync_url
from tests.daemon_process import DaemonProcess
from tests.store_fixtures import DATABASES, module_db
from tests.ui.webui_support import login, require_ui, run_program, text_of

NEWER = 1050
NEEDLE = "Needle-Session"


def add_sessions(url: str, n: int, after: float) -> None:
    """`n` sessions created after `after`, one a second; every seventh of tenant 'acme'."""
    Row = dict[str, object]
    rows: list[Row] = [
        {"id": f"bulk-{i:04d}", "tenant": "acme" if i % 7 == 0 else "default",
             "priority": i % 3, "slo_class": "default", "pinned_worker": None, "state": {},
             "created_at": after + 1 + i, "updated_at": after + 1 + i} for i in range(n)]
    # Each session's program has a context shorter than the real program's (which saw a
    # whole chat turn), so sorting by context must reach past the newest thousand to it.
    programs: list[Row] = [
        {"id": f"bulk-p{i:04d}", "session_id": "bulk-0000", "status": "STOPPED",
                 "worker_id": None, "context_tokens": i % 5, "steps": 1, "pinned": False,
                 "status_reason": "", "created_at": after + 1 + i, "status_since": after + 1 + i,
                 "stopped_at": after + 1 + i} for i in range(n)]
    engine = create_engine(sync_url(url), poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(insert(models.Session), rows)
        conn.execute(insert(models.Program), programs)
    engine.dispose()


@pytest.fixture(scope="module", params=DATABASES)
def daemon(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon on each store: its SQLite file, or a PostgreSQL database of its own."""
    with module_db(request) as db:
        d = DaemonProcess(data_dir=tmp_path_factory.mktemp("sessions") / "data", workers=1,
                          db=db)
        d.start()
        try:
            require_ui(d)
            run_program(d, "needle-p", NEEDLE)
            created = d.get(f"/v1/sessions/{NEEDLE}").json()["created_at"]
            d.stop()
            add_sessions(d.db_url, NEWER, created)
            d.start()
            yield d
        finally:
            d.stop()


def sessions(d: DaemonProcess, **params: object) -> dict[str, object]:
    r = d.get("/v1/sessions", params=params)
    assert r.status_code == 200, r.text
    return dict(r.json())


def ids(answer: dict[str, object]) -> list[str]:
    data = answer["data"]
    assert isinstance(data, list)
    return [str(s["id"]) for s in data]


def test_filter_and_sort_reach_past_the_newest_thousand(daemon: DaemonProcess) -> None:
    assert sessions(daemon, limit=1)["total"] == NEWER + 1
    newest = ids(sessions(daemon, limit=1000))
    assert NEEDLE not in newest and newest[0] == f"bulk-{NEWER - 1:04d}"

    found = sessions(daemon, q="needle-SESS")  # any case
    assert ids(found) == [NEEDLE] and found["total"] == 1
    assert ids(sessions(daemon, limit=1, order="asc")) == [NEEDLE]
    by_programs = sessions(daemon, sort="programs", limit=2)["data"]
    assert isinstance(by_programs, list)
    assert [(s["id"], s["programs"]) for s in by_programs] == [("bulk-0000", NEWER), (NEEDLE, 1)]
    by_programs = sessions(daemon, sort="programs", order="asc", limit=2)["data"]
    assert isinstance(by_programs, list)
    assert [(s["id"], s["programs"]) for s in by_programs] == [
        ("bulk-0001", 0), ("bulk-0002", 0)]  # ties broken by id, ascending


def test_tenant_filter_pages_without_repeats(daemon: DaemonProcess) -> None:
    acme = [f"bulk-{i:04d}" for i in range(NEWER) if i % 7 == 0]
    pages = [sessions(daemon, tenant="acme", sort="id", order="asc", limit=40, offset=o)
             for o in range(0, len(acme), 40)]
    assert all(p["total"] == len(acme) for p in pages)
    assert [sid for p in pages for sid in ids(p)] == acme
    # a sort with many equal keys (priority 0..2) still pages through each row once
    seen = [sid for o in range(0, NEWER + 1, 300)
            for sid in ids(sessions(daemon, sort="priority", limit=300, offset=o))]
    assert len(seen) == len(set(seen)) == NEWER + 1


def test_programs_sort_over_all_of_them(daemon: DaemonProcess) -> None:
    r = daemon.get("/v1/programs", params={"limit": 1000})
    assert r.status_code == 200 and r.json()["total"] == NEWER + 1
    assert "needle-p" not in [p["id"] for p in r.json()["data"]]
    top = daemon.get("/v1/programs", params={"sort": "context_tokens", "limit": 2}).json()
    assert top["data"][0]["id"] == "needle-p", top
    oldest = daemon.get("/v1/programs", params={"order": "asc", "limit": 1}).json()["data"]
    assert [p["id"] for p in oldest] == ["needle-p"]
    # many equal keys (context 0..4): every row exactly once across pages, ties by id
    seen = [p["id"] for o in range(0, NEWER + 1, 400)
            for p in daemon.get("/v1/programs", params={"sort": "context_tokens", "order": "asc",
                                                        "limit": 400, "offset": o}).json()["data"]]
    assert len(seen) == len(set(seen)) == NEWER + 1


def test_bad_parameters_name_the_field(daemon: DaemonProcess) -> None:
    for params, field in (({"sort": "state"}, "sort"), ({"order": "up"}, "order"),
                          ({"q": "x" * 200}, "q")):
        r = daemon.get("/v1/sessions", params=params)
        assert r.status_code == 400, r.text
        assert field in r.text, r.text
    for params, field in (({"sort": "tenant"}, "sort"), ({"order": "up"}, "order")):
        r = daemon.get("/v1/programs", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


@pytest.fixture
def ui(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    c = login(daemon)
    yield c
    c.close()


def test_the_sessions_page_filters_sorts_and_pages_over_all(daemon: DaemonProcess,
                                                            ui: httpx.Client) -> None:
    found = ui.get("/ui/sessions", params={"q": "needle"}).text
    assert NEEDLE in found and "(1 in all)" in text_of(found)
    assert "newest 1000" not in found
    oldest_first = ui.get("/ui/sessions", params={"sort": "created_at", "dir": "asc"}).text
    assert NEEDLE in oldest_first
    last = ui.get("/ui/sessions", params={"tenant": "acme", "sort": "id", "dir": "asc",
                                          "page": 6}).text
    assert "Page 6 of 6 (150 in all)" in text_of(last)
    assert "bulk-1043" in last and "bulk-1036" in last and "bulk-0868" not in last


def test_the_programs_page_sorts_over_all(ui: httpx.Client) -> None:
    page = ui.get("/ui/programs", params={"sort": "context_tokens", "dir": "desc"}).text
    pages = -(-(NEWER + 1) // 25)
    assert "needle-p" in page and f"of {pages} ({NEWER + 1} in all)" in text_of(page)
    assert "newest 1000" not in page
