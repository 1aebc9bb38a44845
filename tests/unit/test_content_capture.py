"""Content capture (daemon/content/): settings parsed from the config with errors naming
the key, redaction before anything is kept, the cap with its marker, and a tenant's own
choice over the default."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from daemon.config import ConfigError, load
from daemon.content.capture import ContentCapture, Redactor, content_row
from daemon.content.settings import DEFAULT_REDACT, REDACTED, ContentSettings, parse
from daemon.state import RequestState
from daemon.workers import protocol

KEY = "sk-" + "A1b2C3d4" * 4


def settings(max_chars: int = 100, tracing: bool = True,
             tenants: dict[str, Any] | None = None) -> ContentSettings:
    return parse(tracing, max_chars, list(DEFAULT_REDACT), tenants or {}, {})


def request(**kw: Any) -> RequestState:
    return RequestState(id="req-1", program_id="p1", session_id="s1", kind="chat",
                        model="m", sampling=protocol.SamplingParams(max_tokens=4),
                        queued_at=0.0, **kw)


def test_secrets_and_emails_are_redacted_before_storing() -> None:
    r = Redactor(settings())
    out = r.text(f"key {KEY} mail ann@example.org")
    assert KEY not in out and "ann@example.org" not in out
    assert out == f"key {REDACTED} mail {REDACTED}" and r.redactions == 2
    assert not r.truncated


def test_a_long_field_is_cut_at_the_cap_with_a_marker_and_no_secret_straddles_it() -> None:
    r = Redactor(settings(max_chars=64))
    text = "x" * 60 + KEY + "y" * 1000
    out = r.text(text)
    assert out.startswith("x" * 60 + REDACTED[:4]) and "A1b2" not in out
    assert r.truncated and re.search(r"…\[truncated \d+ chars\]$", out)
    assert len(out) < 64 + 40


def test_messages_share_the_cap_newest_first_and_tool_arguments_are_kept() -> None:
    call = protocol.ToolCall(id="c1", name="search", arguments='{"q": "ann@example.org"}')
    req = request(messages=[
        protocol.ChatMessage(role="system", content="s" * 200),
        protocol.ChatMessage(role="assistant", content="", tool_calls=[call]),
        protocol.ChatMessage(role="user", content="newest " + "u" * 50)])
    req.generated.append("the answer")
    row = content_row(req, None, settings(max_chars=64), now=5.0)
    system, assistant, user = row["prompt"]["messages"]
    assert user["content"] == "newest " + "u" * 50  # kept whole
    assert "truncated" in system["content"] and len(system["content"]) < 64
    assert assistant["tool_calls"][0]["arguments"] == '{"q": "[REDACTED]"}'
    assert row["completion"] == "the answer" and row["truncated"] and row["redactions"] == 1


def test_a_tool_reply_stores_its_calls_arguments() -> None:
    reply = protocol.Reply(content="", tool_calls=[
        protocol.ToolCall(id="c9", name="bash", arguments='{"cmd": "ls"}')])
    finish = protocol.Finish(request_id="req-1", reason="stop", prompt_tokens=3,
                             cached_tokens=0, output_tokens=5, reply=reply)
    row = content_row(request(prompt="hello"), finish, settings(), now=1.0)
    assert row["prompt"] == {"prompt": "hello"}
    assert row["tool_calls"] == [{"id": "c9", "name": "bash", "arguments": '{"cmd": "ls"}'}]


def test_only_tenants_that_trace_are_stored() -> None:
    rows: list[tuple[str, dict[str, Any]]] = []
    tenants = {"p-on": "loud", "p-off": "quiet"}
    capture = ContentCapture(
        settings(tracing=False, tenants={"loud": {"content_tracing": True}}),
        tenants.get, lambda table, row: rows.append((table, row)), lambda: 1.0)
    for program in ("p-on", "p-off", "p-unknown"):
        req = request(prompt="hi")
        req.program_id = program
        capture.request_ended(req, None)
    assert [(t, r["program_id"]) for t, r in rows] == [("request_contents", "p-on")]


@pytest.mark.parametrize(("toml", "key"), [
    ("content_max_chars = 3", "content_max_chars"),
    ('content_redact = ["(unclosed"]', "content_redact[0]"),
    ("content_redact = 5", "content_redact"),
    ("[slo.tenants.a]\ncontent_tracing = 1", "slo.tenants.a.content_tracing"),
    ("[prices.m]\nprompt_per_mtok = 1", "prices.m"),
    ("[prices.m]\nprompt_per_mtok = -1\ncompletion_per_mtok = 1", "prices.m.prompt_per_mtok"),
])
def test_bad_settings_name_their_key(tmp_path: Any, toml: str, key: str) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        load(config_file=str(path), env={})


def test_the_config_reads_the_keys_and_prices(tmp_path: Any) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text('content_tracing = true\ncontent_redact = ["secret"]\n'
                    "[prices.m]\nprompt_per_mtok = 1.5\ncompletion_per_mtok = 6\n")
    cfg = load(config_file=str(path), env={"AGENTD_CONTENT_MAX_CHARS": "500"})
    assert cfg.content_tracing and cfg.content_max_chars == 500
    assert cfg.content_redact == ["secret"] and cfg.prices["m"]["completion_per_mtok"] == 6
    assert not load(env={}).content_tracing  # off by default


@pytest.mark.parametrize("toml", ['otlp_endpoint = "collector:4318"',
                                  "[otlp_headers]\nkey = 5"])
def test_bad_otlp_settings_name_their_key(tmp_path: Any, toml: str) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError, match="otlp_"):
        load(config_file=str(path), env={})


def test_the_default_patterns_scan_a_long_run_in_linear_time() -> None:
    # An unanchored e-mail pattern retried from every character of a run with no @:
    # 0.56 s for this field; anchored, about a millisecond. The bound leaves a wide margin
    # for a busy machine and still fails the quadratic scan.
    r = Redactor(settings(max_chars=16384))
    start = time.perf_counter()
    out = r.text("y" * 1_000_000 + " ann@example.org")
    assert time.perf_counter() - start < 0.2
    assert r.truncated and out.startswith("y" * 16384)
