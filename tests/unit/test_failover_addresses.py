"""Several daemon addresses: a worker's endpoints (--connect, repeated or comma-separated)
and the SDK's base URLs (AGENTD_URL, comma-separated), and which answers the SDK's
failover resends."""

from __future__ import annotations

import httpx
import pytest

from agentd import failover
from daemon.engines.worker import EndpointError, endpoints


def test_worker_endpoints_repeated_or_comma_separated() -> None:
    assert endpoints("tcp://a:1") == ["tcp://a:1"]
    assert endpoints(["tcp://a:1, tcp://b:2", "tcp://c:3"]) == [
        "tcp://a:1", "tcp://b:2", "tcp://c:3"]
    with pytest.raises(EndpointError, match="no daemon endpoint"):
        endpoints([" , "])
    with pytest.raises(EndpointError, match="all tcp:// or all ipc://"):
        endpoints("tcp://a:1,ipc:///tmp/w.sock")


def test_sdk_base_urls() -> None:
    assert failover.v1_bases("http://a:1") == "http://a:1/v1"
    assert failover.v1_bases("http://a:1/, http://b:2/v1") == "http://a:1/v1,http://b:2/v1"
    assert failover.daemons("http://a:1/v1,http://b:2/v1").bases == [
        "http://a:1/v1", "http://b:2/v1"]


def _answer(status: int, body: dict[str, object]) -> httpx.Response:
    return httpx.Response(status, json=body)


def test_what_the_failover_resends() -> None:
    standby = _answer(503, {"error": {"code": "standby", "message": "m"}})
    no_workers = _answer(503, {"error": {"code": "no_workers", "message": "m"}})
    draining = _answer(503, {"error": {"code": "draining", "message": "m"}})
    assert failover.refused_before_running(standby, failing_over=False)
    assert failover.refused_before_running(_answer(503, {"status": "standby"}), False)
    # a daemon without workers is resent elsewhere only when there is an elsewhere
    assert failover.refused_before_running(no_workers, failing_over=True)
    assert not failover.refused_before_running(no_workers, failing_over=False)
    assert not failover.refused_before_running(draining, failing_over=True)
    assert not failover.refused_before_running(_answer(200, {"status": "standby"}), True)


def test_send_goes_past_refusals_and_sticks_to_the_one_that_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTD_FAILOVER_WAIT_S", "5")
    d = failover.Daemons(["http://a", "http://b"])
    calls: list[str] = []

    def call(base: str) -> httpx.Response:
        calls.append(base)
        if base == "http://a":
            raise httpx.ConnectError("refused")
        return _answer(200, {})

    assert d.send(call).status_code == 200
    assert d.send(call).status_code == 200
    assert calls == ["http://a", "http://b", "http://b"]  # the second goes to b first


def test_one_address_that_refuses_fails_at_once() -> None:
    d = failover.Daemons(["http://a"])

    def call(base: str) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(failover.NoDaemon, match="no agentd answered at http://a"):
        d.send(call)


def test_a_bad_wait_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTD_FAILOVER_WAIT_S", "soon")
    with pytest.raises(ValueError, match="AGENTD_FAILOVER_WAIT_S"):
        failover.wait_s()
