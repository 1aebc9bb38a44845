"""/healthz needs no token, so a store error it reports names its kind, never its text
(which can quote SQL parameters: users' prompts and state)."""

from __future__ import annotations

from daemon.api.rest import _error_kind


def test_a_store_error_shows_its_kind_only() -> None:
    error = ("IntegrityError: (sqlite3.IntegrityError) UNIQUE constraint failed "
             "[SQL: INSERT INTO sessions ...] [parameters: ('my secret prompt',)]")
    assert _error_kind(error) == "IntegrityError (see the daemon's log)"
    assert _error_kind(None) == "error (see the daemon's log)"
