"""The store is its owner's alone from the first start, before any run: the data dir 0700,
the SQLite file and its side files 0600, whether `agentd start` or `agentd token create`
makes them, and a dir an older version left open is closed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess


@pytest.fixture(autouse=True)
def default_umask() -> Iterator[None]:
    """The usual umask (022), under which SQLite and mkdir leave files open to all."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _store_files(data_dir: Path) -> list[Path]:
    return [p for p in data_dir.iterdir() if p.name.startswith("agentd.db")]


def test_a_fresh_start_makes_the_store_private(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory()
    d.data_dir.mkdir(parents=True)
    assert _mode(d.data_dir) == 0o755  # as `mkdir` left it: what `--data-dir X` may be
    d.start()
    assert _mode(d.data_dir) == 0o700
    files = _store_files(d.data_dir)
    assert {p.name for p in files} >= {"agentd.db", "agentd.db-wal", "agentd.db-shm"}
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert d.get("/v1/runs").json()["data"] == []  # before any run


def test_token_create_before_the_first_start_makes_the_store_private(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "new" / "data")
    done = d.cli("token", "create", "--scope", "read", "--name", "first")
    assert done.returncode == 0, done.stderr
    assert _mode(d.data_dir) == 0o700
    assert _mode(d.data_dir / "agentd.db") == 0o600


def test_a_store_left_open_is_closed_at_start(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory()
    d.data_dir.mkdir(parents=True)
    d.start()
    d.stop()
    d.data_dir.chmod(0o755)
    for p in _store_files(d.data_dir):
        p.chmod(0o644)
    d.start()
    assert _mode(d.data_dir) == 0o700
    assert {_mode(p) for p in _store_files(d.data_dir)} == {0o600}
