"""Tool calling inside the vLLM worker's engine (CPU build, SmolLM2-135M): the template
probe, forced calls without a parser (vLLM's JSON forms), a failover's continuation, and
logprobs. Skipped when vLLM or the model is missing, unless AGENTD_REQUIRE_VLLM=1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import jsonschema
import pytest
import pytest_asyncio

from daemon.workers.protocol import (
    ChatMessage,
    Finish,
    SamplingParams,
    Submit,
    TokenDelta,
    ToolCall,
    Tools,
)
from tests.vllm_support import MODEL_DIR, _require_vllm

if TYPE_CHECKING:
    from daemon.engines.vllm.engine import VllmEngine

pytestmark = pytest.mark.vllm
in_engine_loop = pytest.mark.asyncio(loop_scope="module")
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}
TOOLS = json.dumps([{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": PARAMETERS}}])
ASK = [ChatMessage("user", "What is the weather in Paris?")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[VllmEngine]:
    """No tool-call parser: only forced calls, in vLLM's JSON forms."""
    _require_vllm()
    from daemon.engines.vllm.engine import VllmEngine

    eng = VllmEngine(str(MODEL_DIR), kv_cache_bytes=32 << 20, block_size=128,
                     max_model_len=512, dtype="float32", chat_template="chatml-tools")
    await eng.start()
    yield eng
    await eng.shutdown()


async def collect(eng: VllmEngine, submit: Submit) -> tuple[list[TokenDelta], Finish]:
    deltas: list[TokenDelta] = []
    async for out in eng.generate(submit):
        if isinstance(out, Finish):
            return deltas, out
        deltas.append(out)
    raise AssertionError("the stream must end with a Finish")


def forced(rid: str, choice: str) -> Submit:
    # "required" is a JSON array of {"name", "parameters"}, which SmolLM2 indents at length;
    # without parallel calls it holds one (SmolLM2 writes two otherwise).
    return Submit(request_id=rid, program_id="p-tools", messages=ASK,
                  tools=Tools(functions=TOOLS, choice=choice, parallel=False,
                              function="get_weather" if choice == "function" else None),
                  sampling=SamplingParams(temperature=0.0, max_tokens=80))


def test_the_template_probe() -> None:
    _require_vllm()
    from transformers import AutoTokenizer

    from daemon.engines.vllm import tools

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    assert not tools.renders_tools(tok, None)  # SmolLM2's own template drops them
    chatml = tools.chat_template("chatml-tools")
    assert tools.renders_tools(tok, chatml)
    history = [*ASK, ChatMessage("assistant", "", tool_calls=[
        ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')]),
        ChatMessage("tool", "sunny", tool_call_id="c1")]
    prompt = tools.render(tok, history, Tools(functions=TOOLS), chatml)
    assert '"name": "get_weather", "arguments": {"city": "Paris"}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert '"description": "The current weather in a city"' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@in_engine_loop
async def test_engine_reports_what_it_does_with_tools(engine: VllmEngine) -> None:
    assert engine.tools.template and engine.tools.parser == ""


@in_engine_loop
@pytest.mark.parametrize("choice", ["required", "function"])
async def test_forced_calls_without_a_parser(engine: VllmEngine, choice: str) -> None:
    deltas, finish = await collect(engine, forced(f"forced-{choice}", choice))
    assert finish.reason == "stop" and finish.reply is not None, "".join(d.text for d in deltas)
    [call] = finish.reply.tool_calls
    assert call.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    streamed = [p for d in deltas if d.message for p in d.message.tool_calls]
    assert streamed[0].name == "get_weather" and streamed[0].id
    assert json.loads("".join(p.arguments for p in streamed)) == json.loads(call.arguments)
    assert not "".join(d.message.content for d in deltas if d.message)


def test_a_continuation_is_parsed_not_sent_again() -> None:
    """After a failover the new worker continues the text so far: its parser reads that
    text first, so the streamed pieces go on where the old worker's stopped and the reply
    holds the whole call (hermes, on the tokenizer alone)."""
    _require_vllm()
    from transformers import AutoTokenizer

    from daemon.engines.vllm import tools

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    cut = text.index("Par")
    submit = Submit(request_id="r", program_id="p", messages=ASK, continuation=text[:cut],
                    tools=Tools(functions=TOOLS, choice="auto"))
    parser = tools.ToolParsing(tok, "hermes").for_request(submit, [1, 2, 3])
    assert parser is not None
    parser.prime(text[:cut], tok.encode(text[:cut]))
    rest = text[cut:]
    pieces = parser.delta(rest, tok.encode(rest), finished=True).tool_calls
    assert pieces and all(p.id is None and p.name is None for p in pieces)
    assert "Paris" in "".join(p.arguments for p in pieces)
    [call] = parser.reply().tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}


@in_engine_loop
async def test_logprobs(engine: VllmEngine) -> None:
    submit = Submit(request_id="lp", program_id="p-tools", messages=ASK,
                    sampling=SamplingParams(temperature=0.0, max_tokens=4, logprobs=2))
    deltas, _ = await collect(engine, submit)
    tokens = [t for d in deltas for t in d.logprobs or ()]
    assert len(tokens) == 4
    assert "".join(t.token for t in tokens) == "".join(d.text for d in deltas)
    for token in tokens:
        assert token.logprob <= 0 and len(token.top) == 2
        assert token.top[0].token == token.token  # greedy: the likeliest was taken
        assert token.top[0].logprob >= token.top[1].logprob
