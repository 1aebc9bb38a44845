"""agentd.Context on the real engine: agentd → vLLM worker (CPU) → SmolLM2. Cached-token
counts are the engine's own (vLLM's num_cached_tokens). Skipped when vLLM or the model is
missing, unless AGENTD_REQUIRE_VLLM=1."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

import agentd
from tests.daemon_process import DaemonProcess
from tests.integration.test_vllm_daemon import BLOCK, vllm_daemon

pytestmark = pytest.mark.vllm
# Tool documentation a program shares with its forks: well over one 128-token block.
DOCS = "The tool `search(query)` returns the titles of matching pages. " * 24


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = vllm_daemon(tmp_path_factory.mktemp("ctx-vllm") / "data", 64 << 20, 1024)
    yield d
    d.stop()


def test_a_context_answers_and_continues(local: None) -> None:
    ctx = agentd.Context().system("Answer in one word.").user("What is the capital of France?")
    first = ctx.generate(max_tokens=8, temperature=0)
    assert "Paris" in first.text and first.finish_reason == "stop"
    held = len(ctx.token_ids)
    second = ctx.user("And of Italy?").generate(max_tokens=8, temperature=0)
    assert "Rome" in second.text
    assert second.cached_tokens >= held // BLOCK * BLOCK


def test_fork_children_hit_the_shared_prefix(local: None) -> None:
    parent = agentd.Context().system(DOCS)
    children = parent.fork(2)  # prefills the documentation once
    shared = len(parent.token_ids)
    assert shared > BLOCK
    for child, question in zip(children, ("Search for cats.", "Search for dogs."), strict=True):
        out = child.user(question).generate(max_tokens=4, temperature=0)
        assert out.cached_tokens >= shared // BLOCK * BLOCK, (out, shared)


def test_a_snapshot_opened_later_is_a_cache_hit(local: None) -> None:
    agentd.Context().system(DOCS + " Snapshot.").snapshot("docs")
    opened = agentd.Context.open("docs")
    out = opened.user("Search for birds.").generate(max_tokens=4, temperature=0)
    assert out.cached_tokens >= len(opened.token_ids) // BLOCK * BLOCK - BLOCK
    assert out.cached_tokens >= BLOCK
    agentd.Context.delete_snapshot("docs")


def test_step_loop_equals_greedy_generate(local: None) -> None:
    root = agentd.Context().user("Write one sentence about the sea.")
    greedy, stepped = root.fork(2)
    out = greedy.generate(max_tokens=12, temperature=0)
    for _ in range(len(out.token_ids)):
        best = stepped.step(top=5)[0]
        stepped.append([best.token_id])
    assert stepped.token_ids == greedy.token_ids


def test_regex_and_json_schema_outputs_parse(local: None) -> None:
    year = agentd.Context().user("In which year did World War II end?").generate(
        max_tokens=8, temperature=0, regex=r"[12][0-9]{3}")
    assert re.fullmatch(r"[12][0-9]{3}", year.text), year.text
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    out = agentd.Context().user("Paris is in France. Give the city and its country as "
                                "JSON.").generate(max_tokens=48, temperature=0,
                                                  json_schema=schema)
    value = json.loads(out.text)
    assert set(value) == {"city", "country"}


def test_logit_bias_steers_the_next_token(local: None) -> None:
    ctx = agentd.Context().user("Say a word.")
    top = ctx.step(top=5)
    banned = top[0].token_id
    out = ctx.generate(max_tokens=1, temperature=0, logit_bias={banned: -100.0})
    assert out.token_ids[0] != banned
