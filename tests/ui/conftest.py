"""Fixtures the web UI test modules share; each module provides its own `daemon`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import login


@pytest.fixture
def ui(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    """A client logged in to the module's daemon."""
    c = login(daemon)
    yield c
    c.close()
