"""The worker socket's Curve keys and the handshake failure tally."""

from __future__ import annotations

import logging

import pytest
import zmq

from daemon.metrics import DaemonMetrics
from daemon.workers.curve import HandshakeTally, failure_reason, server_keys


def test_the_server_keypair_is_derived_from_the_worker_key() -> None:
    """Deterministic (a worker computes the public key the daemon serves with), a valid
    Curve pair, and different for different keys."""
    one, two = server_keys("agw_one"), server_keys("agw_two")
    assert one == server_keys("agw_one")
    assert one[0] != two[0] and one[1] != two[1]
    assert len(one[0]) == len(one[1]) == 40 and zmq.curve_public(one[1]) == one[0]
    assert b"agw_one" not in one[1]


def test_failure_reasons_come_from_the_protocol_error() -> None:
    failed = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    assert failure_reason(failed, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) == "plaintext"
    assert failure_reason(failed, zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) == "wrong_key"
    assert failure_reason(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32) == "aborted"
    assert failure_reason(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400) == "other"
    assert failure_reason(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0) is None
    assert failure_reason(zmq.EVENT_DISCONNECTED, 0) is None


def test_every_failure_is_counted_and_logged_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    tally = HandshakeTally()
    with caplog.at_level(logging.WARNING, "agentd.worker_curve"):
        logged = [tally.record("wrong_key", "tcp://x:1", now=t) for t in (0, 0.1, 30, 59.9)]
        logged.append(tally.record("plaintext", "tcp://x:1", now=1))
        logged.append(tally.record("wrong_key", "tcp://x:1", now=60.5))
    assert logged == [True, False, False, False, True, True]
    assert len(caplog.records) == 3 and "(5 so far" in caplog.records[-1].getMessage()
    metrics = DaemonMetrics()
    metrics.add(tally.families)
    text = metrics.render().decode()
    assert 'agentd_worker_handshakes_failed_total{reason="wrong_key"} 5' in text
    assert 'agentd_worker_handshakes_failed_total{reason="plaintext"} 1' in text
