"""agentd.Context against a real daemon with a sim worker: token ids in and out, fill,
fork, snapshots per tenant, step/append, and bad input named."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import agentd
from agentd.runtime import LLMError
from daemon.engines.sim import tokenizer
from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("contexts") / "data").start()
    yield d
    d.stop()


def _generate(d: DaemonProcess, **body: Any) -> httpx.Response:
    return d.post("/v1/contexts/generate", json={"model": MODEL, **body})


def test_turns_tokenize_as_the_chat_template_does(daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(MODEL).system("be terse").user("name a prime")
    assert ctx.pending == 2 and ctx.token_ids == ()
    out = ctx.generate(max_tokens=4, temperature=0)
    chat = tokenizer.encode("<|bos|>\n<|system|> be terse <|end|>\n<|user|> name a prime "
                            "<|end|>\n<|assistant|>")
    assert ctx.token_ids == (*chat, *out.token_ids)
    assert out.token_ids == tuple(tokenizer.filler_token_id(i) for i in range(4))
    assert out.text == "sim0 sim1 sim2 sim3" and out.finish_reason == "length"
    assert out.prompt_tokens == len(chat)


def test_every_call_sends_the_ids_the_last_one_produced(daemon: DaemonProcess,
                                                        local: None) -> None:
    ctx = agentd.Context(MODEL).user("first question " * 20)
    first = ctx.generate(max_tokens=8)
    held = ctx.token_ids
    second = ctx.user("and then?").generate(max_tokens=3)
    assert ctx.token_ids[:len(held)] == held
    assert second.prompt_tokens == len(held) + len(tokenizer.encode("<|user|> and then? "
                                                                    "<|end|><|assistant|>"))
    # The sim's blocks are 16 tokens: all full blocks of the first call's tokens are reused.
    assert second.cached_tokens >= (len(held) - 1) // 16 * 16 > 0
    assert len(first.token_ids) == 8


def test_fill_prefills_without_generating(daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(MODEL).user("a long document " * 30)
    ctx.fill()
    filled = ctx.token_ids
    assert ctx.pending == 0 and filled[-1] == tokenizer.piece_id("<|end|>")
    ctx.fill(" raw text, no template")
    assert ctx.token_ids == (*filled, *tokenizer.encode("raw text, no template"))
    out = ctx.generate(max_tokens=2)
    assert out.cached_tokens >= len(ctx.token_ids) // 16 * 16 - 16 > 0


def test_fork_children_share_the_parent_and_diverge(daemon: DaemonProcess,
                                                    local: None) -> None:
    parent = agentd.Context(MODEL).user("shared prefix " * 40)
    a, b = parent.fork(2)
    assert parent.pending == 0 and a.token_ids == b.token_ids == parent.token_ids
    shared = len(parent.token_ids)
    out_a = a.user("left").generate(max_tokens=2)
    out_b = b.user("right").generate(max_tokens=2)
    assert out_a.cached_tokens >= shared // 16 * 16 and out_b.cached_tokens >= shared // 16 * 16
    assert a.token_ids[:shared] == b.token_ids[:shared] == parent.token_ids
    assert a.token_ids != b.token_ids and parent.token_ids == a.token_ids[:shared]
    with pytest.raises(ValueError, match="at least 1"):
        parent.fork(0)


def test_snapshot_is_opened_by_another_context_and_is_per_tenant(
        daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(MODEL).system("tool documentation " * 30)
    ctx.snapshot("docs")
    opened = agentd.Context.open("docs")
    assert opened.token_ids == ctx.token_ids and opened.model == MODEL
    out = opened.user("use the tool").generate(max_tokens=2)
    assert out.cached_tokens >= len(ctx.token_ids) // 16 * 16 > 0
    other = daemon.cli("token", "create", "--scope", "read,submit", "--tenant", "other",
                       "--name", "other").stdout.strip()
    r = daemon.get("/v1/contexts/snapshots/docs", token=other)
    assert r.status_code == 404 and r.json()["error"]["param"] == "name"
    agentd.Context.delete_snapshot("docs")
    with pytest.raises(agentd.SnapshotNotFound, match="docs"):
        agentd.Context.open("docs")


def test_step_and_append_run_a_decoding_loop(daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(MODEL).user("count")
    candidates = ctx.step(top=3)
    assert len(candidates) == 3
    assert [c.logprob for c in candidates] == sorted((c.logprob for c in candidates),
                                                     reverse=True)
    before = ctx.token_ids
    assert before[-1] == tokenizer.piece_id("<|assistant|>")  # the reply was opened
    ctx.append([candidates[1].token_id])
    assert ctx.token_ids == (*before, candidates[1].token_id)
    assert ctx.step(top=1)[0].token_id == tokenizer.filler_token_id(0)


def test_logprobs_carry_token_ids(daemon: DaemonProcess, local: None) -> None:
    out = agentd.Context(MODEL).user("hi").generate(max_tokens=3, logprobs=2)
    assert out.logprobs is not None and len(out.logprobs) == 3
    assert [t.token_id for t in out.logprobs] == list(out.token_ids)
    assert all(len(t.top) == 2 and t.top[0].token_id == t.token_id for t in out.logprobs)


def test_json_schema_output_parses_on_the_sim(daemon: DaemonProcess, local: None) -> None:
    import json
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"]}
    out = agentd.Context(MODEL).user("extract").generate(max_tokens=64, json_schema=schema)
    assert isinstance(json.loads(out.text)["name"], str)


def test_a_dropped_context_refuses_use(daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(MODEL).user("x")
    ctx.drop()
    with pytest.raises(agentd.ContextDropped):
        ctx.generate()


@pytest.mark.parametrize(("body", "param"), [
    ({}, "token_ids"),
    ({"token_ids": [-1]}, "token_ids[0]"),
    ({"segments": [{"kind": "poem", "text": "x"}]}, "segments[0].kind"),
    ({"segments": [{"kind": "turn", "text": "x"}]}, "segments[0].role"),
    ({"segments": [{"kind": "reply", "text": "x"}]}, "segments[0].text"),
    ({"token_ids": [1], "regex": "a+"}, "regex"),
    ({"token_ids": [1], "grammar": "root ::= 'a'"}, "grammar"),
    ({"token_ids": [1], "logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"token_ids": [1], "logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"token_ids": [1], "regex": "a", "json_schema": {}}, "json_schema"),
    ({"token_ids": [1], "fill_only": True, "max_tokens": 3}, "fill_only"),
    ({"token_ids": [1], "top_p": 0}, "top_p"),
    ({"token_ids": [1], "echo": True}, "echo"),
    ({"token_ids": [1], "program_id": "bad id"}, "program_id"),
])
def test_bad_input_is_a_400_naming_the_field(daemon: DaemonProcess, body: dict[str, Any],
                                             param: str) -> None:
    r = _generate(daemon, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_bad_snapshot_input(daemon: DaemonProcess) -> None:
    r = httpx.put(f"{daemon.url}/v1/contexts/snapshots/x", headers=daemon.auth_headers(),
                  json={"model": MODEL, "token_ids": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "token_ids"
    r = httpx.put(f"{daemon.url}/v1/contexts/snapshots/a%20b", headers=daemon.auth_headers(),
                  json={"model": MODEL, "token_ids": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"
    r = daemon.get("/v1/contexts/snapshots/never")
    assert r.status_code == 404 and r.json()["error"]["param"] == "name"


def test_idle_is_a_tool_span_the_kv_layer_sees(daemon: DaemonProcess, local: None) -> None:
    ctx = agentd.Context(MODEL, program_id="p-idle", session_id="s-idle").user("plan")
    ctx.generate(max_tokens=2)

    def kv() -> dict[str, Any]:
        return dict(daemon.get("/v1/programs/p-idle/tools").json()["kv"])

    with ctx.idle():
        inside = kv()
        assert inside["tool_running"] is True and inside["status"] == "acting"
    after = kv()
    assert after["tool_running"] is False and after["tool_last_s"] > 0
    kinds = [e["kind"] for e in daemon.get("/v1/sessions/s-idle/trace").json()["data"]]
    assert kinds.index("context.idle.start") < kinds.index("context.idle.end")
    with pytest.raises(ValueError, match="needs a program"), agentd.Context(MODEL).idle():
        pass
    r = daemon.post("/v1/contexts/idle", json={"program_id": "p-idle", "state": "later"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "state"


def test_pin_keeps_the_program_resident_and_is_bounded(daemon: DaemonProcess,
                                                       local: None) -> None:
    def pinned(program: str) -> bool:
        return bool(daemon.get(f"/v1/programs/{program}").json()["pinned"])

    ctxs = [agentd.Context(MODEL, program_id=f"p-pin-{i}", session_id="s-pin").user("x")
            for i in range(9)]
    for ctx in ctxs[:8]:
        ctx.generate(max_tokens=1)
        ctx.pin()
    assert all(pinned(f"p-pin-{i}") for i in range(8))
    ctxs[8].generate(max_tokens=1)
    with pytest.raises(LLMError, match="409"):
        ctxs[8].pin()
    ctxs[0].unpin()
    assert not pinned("p-pin-0")
    ctxs[8].pin()  # room again
    assert pinned("p-pin-8")
    kinds = [e["kind"] for e in daemon.get("/v1/sessions/s-pin/trace").json()["data"]]
    assert kinds.count("context.pinned") == 9 and kinds.count("context.unpinned") == 1
    with pytest.raises(ValueError, match="needs a program"):
        agentd.Context(MODEL).pin()


def test_the_trace_shows_fills_forks_snapshots_and_drops(daemon: DaemonProcess,
                                                         local: None) -> None:
    ctx = agentd.Context(MODEL, program_id="p-life", session_id="s-life").user("doc " * 50)
    ctx.fill()
    filled = len(ctx.token_ids)
    ctx.snapshot("life-docs")
    a, _ = ctx.fork(2)
    a.user("left").generate(max_tokens=2)
    held = len(a.token_ids)
    a.drop()
    a.drop()  # once dropped, nothing more to record
    events = [e for e in daemon.get("/v1/sessions/s-life/trace").json()["data"]
              if e["kind"].startswith("context.")]
    assert [e["kind"] for e in events] == ["context.fill", "context.snapshot", "context.fork",
                                           "context.drop"]
    fill, snapshot, fork, drop = (e["data"] for e in events)
    assert all(e["program_id"] == "p-life" for e in events)
    assert fill["tokens"] == filled and fill["cached_tokens"] >= 0
    assert events[0]["request_id"]
    assert snapshot == {"name": "life-docs", "tokens": filled}
    assert fork == {"tokens": filled, "children": 2}
    assert drop == {"tokens": held}
    agentd.Context.delete_snapshot("life-docs")


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/contexts/fork", {"program_id": "p-x", "tokens": 3, "n": 0}, "n"),
    ("/v1/contexts/fork", {"program_id": "p-x", "tokens": -1}, "tokens"),
    ("/v1/contexts/drop", {"program_id": "p-x", "tokens": 3, "n": 2}, "n"),
    ("/v1/contexts/drop", {"program_id": "bad id", "tokens": 3}, "program_id"),
])
def test_bad_fork_and_drop_notes(daemon: DaemonProcess, path: str, body: dict[str, Any],
                                 param: str) -> None:
    r = daemon.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_a_fork_note_names_its_program(daemon: DaemonProcess) -> None:
    r = daemon.post("/v1/contexts/fork", json={"tokens": 3})
    assert r.status_code == 400 and "`program_id`" in r.json()["error"]["message"]


def test_contexts_opened_from_a_snapshot_share_its_prefix(daemon: DaemonProcess,
                                                          local: None) -> None:
    """The answer says how many leading tokens the program shares through the snapshot
    (the KV view's prefix group): all of it while its ids lead, none once it changed."""
    maker = agentd.Context(MODEL, program_id="p-share-0").system("repository summary " * 40)
    maker.snapshot("shared-summary")
    size = len(maker.token_ids)
    assert maker.user("q0").generate(max_tokens=2).shared_prefix_tokens == size
    opened = [agentd.Context.open("shared-summary", program_id=f"p-share-{i}")
              for i in (1, 2)]
    outs = [ctx.user(f"question {i}").generate(max_tokens=2) for i, ctx in enumerate(opened)]
    assert [o.shared_prefix_tokens for o in outs] == [size, size]
    child, = opened[0].fork(1)
    assert child.user("more").generate(max_tokens=1).shared_prefix_tokens == size
    assert agentd.Context(MODEL).user("x").generate(max_tokens=1).shared_prefix_tokens == 0
    # Replaced under the same name: the old ids no longer lead, nothing is shared.
    agentd.Context(MODEL).system("another summary").snapshot("shared-summary")
    assert opened[1].user("again").generate(max_tokens=1).shared_prefix_tokens == 0
    agentd.Context.delete_snapshot("shared-summary")
    assert opened[1].user("gone").generate(max_tokens=1).shared_prefix_tokens == 0
    r = _generate(daemon, token_ids=[1], snapshot="a b")
    assert r.status_code == 400 and r.json()["error"]["param"] == "snapshot"
