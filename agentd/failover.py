"""Several daemon addresses for one client: an active agentd and its standbys.

`AGENTD_URL` may list them, comma-separated (`http://a:8420,http://b:8420`). A call goes to
the daemon that answered last; if the connection is refused (or times out connecting),
or the daemon answers as a standby (503, code "standby"), or, with several addresses,
as a daemon that has no worker yet (503 "no_workers": it has just taken over), it goes to
the next, in turn, for up to `AGENTD_FAILOVER_WAIT_S` (default 30 s) in all, so that a
standby taking over is found. Only what never reached a serving daemon is retried: a
request that was sent and then failed (the daemon died under it) is the caller's to
retry, as it may have run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")
DEFAULT_WAIT_S = 30.0
PAUSE_S = 0.2  # between rounds over every address, when none answered


class Standby(Exception):
    """The daemon answered as a standby (another one serves), or as a daemon that took
    over and has no worker yet."""


class NoDaemon(httpx.ConnectError):
    """No address answered as a serving daemon within the wait."""


def _code(r: httpx.Response) -> str | None:
    """A 503's answer code ("standby" also from a standby's /healthz body)."""
    if r.status_code != 503:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if body.get("status") == "standby":
        return "standby"
    error = body.get("error")
    return str(error.get("code")) if isinstance(error, dict) else None


def refused_before_running(r: httpx.Response, failing_over: bool) -> bool:
    """A standby's answer; or, with several addresses, a daemon's that has no worker yet
    (it has just taken over: its workers are registering). Nothing ran: safe to resend."""
    code = _code(r)
    return code == "standby" or (failing_over and code == "no_workers")


def wait_s() -> float:
    raw = os.environ.get("AGENTD_FAILOVER_WAIT_S")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_WAIT_S
    except ValueError:
        raise ValueError(f"AGENTD_FAILOVER_WAIT_S must be a number >= 0, got {raw!r}") from None


class Daemons:
    def __init__(self, bases: list[str]) -> None:
        self.bases = bases
        self._current = 0
        self._lock = threading.Lock()

    def current(self) -> str:
        return self.bases[self._current]

    def send(self, call: Callable[[str], T]) -> T:
        """`call(base)` at the daemon that answered last, else at the others in turn."""
        deadline = time.monotonic() + wait_s()
        last: Exception | None = None
        while True:
            start = self._current
            for step in range(len(self.bases)):
                index = (start + step) % len(self.bases)
                try:
                    out = call(self.bases[index])
                    if isinstance(out, httpx.Response) and refused_before_running(
                            out, len(self.bases) > 1):
                        raise Standby(f"{self.bases[index]} does not serve yet: "
                                      f"{out.text[:200]}")
                except (httpx.ConnectError, httpx.ConnectTimeout, Standby) as exc:
                    last = exc
                    continue
                with self._lock:
                    self._current = index
                return out
            # one address that refuses: fail at once, as a client of one daemon always did
            alone = len(self.bases) == 1 and not isinstance(last, Standby)
            if alone or time.monotonic() >= deadline:
                raise NoDaemon(f"no agentd answered at {', '.join(self.bases)}: {last}")
            time.sleep(PAUSE_S)


_known: dict[str, Daemons] = {}
_known_lock = threading.Lock()


def daemons(bases: str) -> Daemons:
    """The shared `Daemons` of a comma-separated list of base URLs (one per list, so what
    one call learnt about which daemon serves, the next call uses)."""
    with _known_lock:
        found = _known.get(bases)
        if found is None:
            found = _known[bases] = Daemons(
                [b.strip().rstrip("/") for b in bases.split(",") if b.strip()])
        return found


def v1_bases(url: str) -> str:
    """`AGENTD_URL` (one address or several, comma-separated) as /v1 base URLs."""
    out = []
    for u in url.split(","):
        u = u.strip().rstrip("/")
        if u:
            out.append(u if u.endswith("/v1") else f"{u}/v1")
    return ",".join(out)
