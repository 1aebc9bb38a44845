from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[type]:
    """Start real daemons in a temp dir; every one started is stopped afterwards."""
    started: list[DaemonProcess] = []

    def make(**kw: object) -> DaemonProcess:
        kw.setdefault("data_dir", tmp_path / "data")
        d = DaemonProcess(**kw)  # type: ignore[arg-type]
        started.append(d)
        return d

    yield make  # type: ignore[misc]
    for d in started:
        d.stop()


@pytest.fixture
def sim_daemon(daemon_factory) -> DaemonProcess:  # type: ignore[no-untyped-def]
    return daemon_factory(workers=1).start()


from tests.docker_fixtures import busybox_image, docker_client, docker_host  # noqa: E402, F401
from tests.store_fixtures import store_with_writer  # noqa: E402, F401
