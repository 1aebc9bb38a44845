"""Tool calling on a vLLM worker, with vLLM's own pieces, as its OpenAI server uses them.

- The prompt: the tokenizer's chat template gets the tools and the history's calls and
  results (`render`), in the shape Hugging Face templates read (a call's arguments as an
  object, which is how vLLM hands them over too). A model whose own template has no tools
  (SmolLM2's drops them, and fails on an assistant turn without content) is served with
  another template: setting `vllm_chat_template`, e.g. the bundled `chatml-tools`, ChatML
  with calls in the Hermes format that vLLM's `hermes` parser reads.
- The output: a request with tools gets one of vLLM's `Parser`s (`ToolParsing.for_request`),
  which also adjusts the request: where a call is forced ("required", a named function)
  and for a parser with a structural tag (hermes), the output is constrained by structured
  output, with argument schemas enforced (`TOOL_STRICT_LEVEL`), so even a 135M model's
  calls parse and validate. The parser turns each delta into content and call pieces, and
  the whole reply into content and calls.
- Without a parser setting, "required" and a named choice still work (vLLM's JSON forms,
  parsed by `_ForcedCallsOnly`); the gateway refuses "auto" for such a model.

vLLM calls its parser interfaces unstable; this module is the only one that touches them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon.workers.protocol import (
    ChatMessage,
    MessageDelta,
    Reply,
    Submit,
    ToolCall,
    ToolCallDelta,
    Tools,
)

TEMPLATES = Path(__file__).parent / "templates"
BUNDLED_TEMPLATES = {"chatml-tools": TEMPLATES / "chatml_tools.jinja"}
# Arguments follow each function's schema as if every tool were `strict` (vLLM's
# --tool-strict-level parameter): a small model's arguments otherwise often do not.
TOOL_STRICT_LEVEL = "parameter"
_PROBE = ("agentd_probe_tool", "agentd_probe_call", "agentd_probe_result")


def chat_template(setting: str) -> str | None:
    """The template text a `vllm_chat_template` setting names: a bundled name or a file
    (None: the tokenizer's own)."""
    if not setting:
        return None
    path = BUNDLED_TEMPLATES.get(setting, Path(setting))
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"vllm_chat_template {setting!r}: {exc.strerror or exc} (a file, or "
                         f"one of {', '.join(BUNDLED_TEMPLATES)})") from exc


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates read them (Hugging Face's convention)."""
    return [_template_message(m) for m in messages]


def _template_message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": _arguments_object(c.arguments)}}
            for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments_object(arguments: str) -> Any:
    # As vLLM does: templates expect an object; a malformed one from the history becomes
    # {} rather than failing every later turn of the conversation.
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}


def render(tokenizer: Any, messages: Sequence[ChatMessage], tools: Tools | None,
           template: str | None) -> str:
    return str(tokenizer.apply_chat_template(
        template_messages(messages), tools=json.loads(tools.functions) if tools else None,
        chat_template=template, tokenize=False, add_generation_prompt=True))


def renders_tools(tokenizer: Any, template: str | None) -> bool:
    """Whether the template puts tools, a call and its result in the prompt: rendered with
    marked names, each must show up (SmolLM2's own template drops all three)."""
    tool, call, result = _PROBE
    tools = Tools(functions=json.dumps([{"type": "function", "function": {
        "name": tool, "description": "", "parameters": {"type": "object", "properties": {}}}}]))
    messages = [
        ChatMessage("user", "hi"),
        ChatMessage("assistant", "", tool_calls=[ToolCall(id="c1", name=call, arguments="{}")]),
        ChatMessage("tool", result, tool_call_id="c1", name=call),
    ]
    try:
        prompt = render(tokenizer, messages, tools, template)
    except Exception:  # a template that cannot take them (SmolLM2's: None + str)
        return False
    return all(marker in prompt for marker in _PROBE)


def check_parser(name: str) -> None:
    """Fail on a parser name vLLM does not have, before a model is loaded for nothing."""
    from vllm.tool_parsers import ToolParserManager

    known = ToolParserManager.list_registered()
    if name and name not in known:
        raise ValueError(f"vllm_tool_call_parser {name!r} is not one of vLLM's tool parsers: "
                         f"{', '.join(known)}")


class ToolParsing:
    """The parser class of one engine; one parser per request with tools."""

    def __init__(self, tokenizer: Any, parser: str) -> None:
        self.name = parser
        self._tokenizer = tokenizer
        self._parser_cls = _parser_class(tokenizer, parser)

    def for_request(self, submit: Submit, prompt_token_ids: list[int]
                    ) -> RequestParser | None:
        """The request's parser (None: no tools, or tool_choice "none": the reply is text)."""
        if submit.tools is None or submit.tools.choice == "none":
            return None
        return RequestParser(self._parser_cls, self._tokenizer, submit, prompt_token_ids,
                             bool(self.name))


def _parser_class(tokenizer: Any, name: str) -> Any:
    from vllm.parser import ParserManager
    from vllm.parser.abstract_parser import DelegatingParser

    if not name:
        return type("ForcedCallsParser", (DelegatingParser,),
                    {"tool_parser_cls": _forced_calls_only()})
    try:
        return ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True,
                                        tool_strict_level=TOOL_STRICT_LEVEL, tokenizer=tokenizer)
    except (TypeError, KeyError) as exc:
        raise ValueError(f"vllm_tool_call_parser {name!r}: {exc}") from exc


def _forced_calls_only() -> type:
    """A tool parser that finds no calls in free text: with it vLLM parses only the JSON
    that structured output forces for "required" and a named function."""
    from vllm.entrypoints.generate.base.protocol import (
        DeltaMessage,
        ExtractedToolCallInformation,
    )
    from vllm.tool_parsers.abstract_tool_parser import ToolParser

    class ForcedCallsOnly(ToolParser):
        def extract_tool_calls(self, model_output: str, request: Any
                               ) -> ExtractedToolCallInformation:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[],
                                                content=model_output)

        def extract_tool_calls_streaming(self, previous_text: str, current_text: str,
                                         delta_text: str, *args: Any) -> DeltaMessage:
            return DeltaMessage(content=delta_text)

    return ForcedCallsOnly


class RequestParser:
    """vLLM's parser for one request: the request as vLLM's server would have adjusted it
    (its structured output), each delta's content and call pieces, the whole reply."""

    def __init__(self, parser_cls: Any, tokenizer: Any, submit: Submit,
                 prompt_token_ids: list[int], auto: bool) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        assert submit.tools is not None
        self._auto = auto
        # The parser reads the prompt once, at the first delta: whether the model starts
        # inside a reasoning block; until then it passes all text through as content.
        self._prompt: list[int] | None = prompt_token_ids
        request = ChatCompletionRequest.model_validate({
            "model": "agentd", "messages": _openai_messages(submit.messages or []),
            "tools": json.loads(submit.tools.functions),
            "tool_choice": _openai_choice(submit.tools),
            "parallel_tool_calls": submit.tools.parallel})
        self._stream = parser_cls(tokenizer, request.tools)
        self._request = self._stream.adjust_request(request)
        self._whole = parser_cls(tokenizer, self._request.tools)
        self._text = ""

    @property
    def structured_outputs(self) -> Any:
        return self._request.structured_outputs

    @property
    def skip_special_tokens(self) -> bool:
        # Parsers that read special tokens as call markers turn skipping off.
        return bool(self._request.skip_special_tokens)

    def prime(self, text: str, token_ids: list[int]) -> None:
        """Text generated before a failover: parsed, its pieces already sent."""
        if text:
            self.delta(text, token_ids, finished=False)

    def delta(self, text: str, token_ids: list[int], finished: bool) -> MessageDelta:
        self._text += text
        prompt, self._prompt = self._prompt, None
        parsed = self._stream.parse_delta(text, token_ids, self._request,
                                          prompt_token_ids=prompt, finished=finished)
        if parsed is None:
            return MessageDelta()
        return MessageDelta(content=parsed.content or "",
                            tool_calls=[_call_piece(c) for c in parsed.tool_calls])

    def reply(self) -> Reply:
        """The whole reply (continuation included) parsed into content and calls."""
        from vllm.renderers.chat_utils import make_tool_call_id

        _, content, calls = self._whole.parse(self._text, self._request,
                                              enable_auto_tools=self._auto)
        return Reply(content=content, tool_calls=[
            ToolCall(id=c.id or make_tool_call_id(), name=c.name, arguments=c.arguments)
            for c in calls or ()])


def _call_piece(call: Any) -> ToolCallDelta:
    function = call.function
    return ToolCallDelta(index=call.index, id=call.id,
                         name=function.name if function is not None else None,
                         arguments=(function.arguments or "") if function is not None else "")


def _openai_choice(tools: Tools) -> Any:
    if tools.choice == "function":
        return {"type": "function", "function": {"name": tools.function}}
    return tools.choice


def _openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The history as an OpenAI request spells it (what vLLM's request type validates)."""
    out = []
    for m in messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out
