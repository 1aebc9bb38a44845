"""The pieces that bound what a run hands back and the store's file modes, one by one:
the sandbox's result line and failure texts, the daemon's bounded read of a real child
process, event and log-tail bounds, records from before the cap, the limits rule, and
private files and dirs."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from daemon.core.data_dir import private_dir
from daemon.runtime import run_records
from daemon.runtime.bundles import BundleError
from daemon.runtime.runs import (
    DEFAULT_LIMITS,
    EVENT_TEXT_CHARS,
    LOG_TAIL,
    _log_tail,
    bounded_event,
    check_limits,
    exchange,
)
from daemon.runtime.sandbox.entry import REPORT_TEXT_CHARS, TRACEBACK_CHARS, failure, result_line
from db.engine import make_private, sqlite_url


def test_result_line_within_and_over_the_cap() -> None:
    assert json.loads(result_line({"a": 1}, 1024)) == {"ok": True, "result": {"a": 1}}
    over = json.loads(result_line("x" * 2000, 1024))
    assert over == {"ok": False, "kind": "system",
                    "reason": "result too large: 2026 bytes of JSON, over the daemon's "
                              "max_result_bytes (1024)"}
    assert json.loads(result_line("x" * 2000, None))["ok"]  # the probe has no cap


def test_failure_texts_are_cut() -> None:
    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise ValueError("y" * 1_000_000)

    try:
        deep(200)
    except ValueError as exc:
        report = failure(exc, "/nowhere/", {})
    error = report["error"]
    assert report["kind"] == "user" and error["type"] == "ValueError"
    assert len(error["message"]) < REPORT_TEXT_CHARS + 40
    assert error["message"].endswith("[998000 more characters]")
    assert len(report["reason"]) < REPORT_TEXT_CHARS + 40
    assert len(error["traceback"]) < TRACEBACK_CHARS + 40
    assert error["traceback"].startswith("[") and "characters cut]" in error["traceback"]


def _child(output: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.stdin.read(); sys.stdout.write({output})"]


async def _exchange(output: str, limit: int) -> bytes | None:
    proc = await asyncio.create_subprocess_exec(
        *_child(output), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        return await exchange(proc, b"spec", limit)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_exchange_reads_at_most_the_limit() -> None:
    assert asyncio.run(_exchange("'ok'", 1024)) == b"ok"
    # 64 MB written: refused once the limit is passed, without reading the rest
    assert asyncio.run(_exchange("'x' * 64_000_000", 1024 * 1024)) is None


def test_bounded_event_cuts_texts_and_refuses_what_is_still_large() -> None:
    event = bounded_event({"id": "f1", "error": "e" * 100_000})
    assert event is not None and event["id"] == "f1"
    assert len(event["error"]) == EVENT_TEXT_CHARS + 3
    assert bounded_event({"consumers": [f"future-{i}" for i in range(10_000)]}) is None


def test_log_tail_reads_only_the_end(tmp_path: Path) -> None:
    log = tmp_path / "sandbox.log"
    log.write_text("a" * 5_000_000 + "é" * LOG_TAIL)
    assert _log_tail(log) == "é" * LOG_TAIL


def test_records_from_before_the_cap_lose_their_large_results(tmp_path: Path) -> None:
    records = tmp_path / "runs"
    records.mkdir()
    big, small = records / "run-0000000000000001.json", records / "run-0000000000000002.json"
    big.write_text(json.dumps({"id": big.stem, "status": "finished", "result": "x" * 3_000_000,
                               "timings": {"created_at": 1.0}}))
    small.write_text(json.dumps({"id": small.stem, "status": "finished", "result": "ok",
                                 "timings": {"created_at": 2.0}}))
    os.utime(big, (1000, 1000))
    assert asyncio.run(run_records.trim_results(records, 1024 * 1024)) == 1
    assert big.stat().st_mtime == 1000  # the listing's order stays
    view = json.loads(big.read_text())
    assert view["status"] == "finished" and view["result"] is None
    assert view["error"]["reason"] == ("result too large: its 3000002 bytes of JSON were "
                                       "dropped from this record (max_result_bytes 1048576)")
    assert json.loads(small.read_text())["result"] == "ok"
    assert asyncio.run(run_records.trim_results(records, 1024 * 1024)) == 0


def test_only_an_operator_raises_limits() -> None:
    for key, default in DEFAULT_LIMITS.items():
        with pytest.raises(BundleError) as refused:
            check_limits({key: default + 1}, operator=False)
        assert refused.value.param == f"limits.{key}"
        assert refused.value.code == "insufficient_scope"
        assert check_limits({key: default + 1}, operator=True)[key] == default + 1
        assert check_limits({key: default}, operator=False)[key] == default
    assert check_limits({"memory_mb": 512}, operator=False)["memory_mb"] == 512
    with pytest.raises(BundleError) as bad:  # out of range is a 400 for anyone
        check_limits({"memory_mb": 10**9}, operator=True)
    assert bad.value.code == "bad_limit"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_dir_creates_and_closes_only_its_own(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "a" / "data"
        private_dir(fresh)
        assert _mode(fresh) == 0o700
        fresh.chmod(0o755)
        private_dir(fresh)
        assert _mode(fresh) == 0o700
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o1777)  # like /tmp: not the daemon's to close
        private_dir(shared)
        assert _mode(shared) == 0o1777
    finally:
        os.umask(old)


def test_make_private_creates_the_sqlite_file_and_closes_its_side_files(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        db = tmp_path / "agentd.db"
        (tmp_path / "agentd.db-wal").write_bytes(b"")
        (tmp_path / "agentd.db-wal").chmod(0o644)
        make_private(sqlite_url(db))
        assert _mode(db) == 0o600 and _mode(tmp_path / "agentd.db-wal") == 0o600
        db.chmod(0o644)
        make_private(sqlite_url(db))
        assert _mode(db) == 0o600
        make_private("postgresql+asyncpg://u@h/db")  # other databases: nothing to do
        make_private("sqlite+aiosqlite:///:memory:")
    finally:
        os.umask(old)
