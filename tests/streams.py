"""A streamed tool exec read as a client reads it, each event stamped as it arrived."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.daemon_process import DaemonProcess


def streamed_exec(d: DaemonProcess, program: str, tool: str, body: dict[str, Any],
                  timeout: float = 60) -> list[tuple[float, str, dict[str, Any]]]:
    """(arrival time, event, data) of each server-sent event of `POST .../exec` with
    `stream: true`."""
    out, kind = [], "message"
    with httpx.stream("POST", f"{d.url}/v1/programs/{program}/tools/{tool}/exec",
                      json={**body, "stream": True}, headers=d.auth_headers(),
                      timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event:"):
                kind = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                out.append((time.monotonic(), kind, json.loads(line.partition(":")[2])))
    return out
