"""`agentd start` traps: a port in use is one line and exit 1 before anything says "serving
on"; the log carries no per-request httpx lines unless the level is debug."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.commands.cli import setup_logging


def test_a_port_in_use_is_one_line_and_exit_1_before_any_serving_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "AGENTD_CONFIG_DIR": str(tmp_path / "config")}
        done = subprocess.run(
            [sys.executable, "-m", "daemon.commands.cli", "start", "--port", str(port),
             "--data-dir", str(tmp_path / "data"), "--workers", "0"],
            env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"agentd: cannot listen on 127.0.0.1:{port}: Address already in use"], done.stderr
    assert not (tmp_path / "data" / "agentd.db").exists()  # nothing started


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.mark.usefixtures("restore_logging")
def test_httpx_request_lines_are_quiet_unless_debug(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "plain")
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/v1/workers 200")
    logging.getLogger("httpcore.http11").debug("send_request_headers.started")
    logging.getLogger("httpx").warning("a warning still shows")
    logging.getLogger("agentd").info("agentd's own lines still show")
    err = capsys.readouterr().err
    assert "HTTP Request" not in err and "send_request_headers" not in err
    assert "a warning still shows" in err and "agentd's own lines" in err

    setup_logging("debug", "plain")
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/v1/workers 200")
    assert "HTTP Request" in capsys.readouterr().err
