from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentd
from tests.daemon_process import DaemonProcess


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start real daemons in a temp dir; every one started is stopped afterwards."""
    started: list[DaemonProcess] = []

    def make(**kw: Any) -> DaemonProcess:
        kw.setdefault("data_dir", tmp_path / "data")
        d = DaemonProcess(**kw)
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


@pytest.fixture
def sim_daemon(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    return daemon_factory(workers=1).start()


from tests.docker_fixtures import (  # noqa: E402, F401
    busybox_image,
    docker_client,
    docker_host,
    second_docker_engine,
)
from tests.store_fixtures import (  # noqa: E402, F401
    daemon_db,
    postgres_server,
    postgres_url,
    store_url,
    store_with_writer,
)


@pytest.fixture()
def local(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The SDK in local mode against the module's `daemon` (which the module defines)."""
    monkeypatch.setenv("AGENTD_URL", daemon.url)
    monkeypatch.setenv("AGENTD_TOKEN", daemon.token)
    with agentd.local_runtime():
        yield
