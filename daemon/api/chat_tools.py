"""OpenAI function calling at the gateway: tools and tool turns in, parsed calls out.

The gateway checks what a request says about tools and hands the engines one
`protocol.Tools`; the worker's engine renders the tools through the model's chat template,
constrains the output where a call is forced, and parses the reply into content and calls
(daemon/engines/vllm/tools.py, daemon/engines/sim/tools.py). Here are the pieces both
OpenAI APIs share: the chat completions handler and the Responses API map their own
spellings of a function tool onto `FunctionSpec` and call `engine_tools`, check that the
model's workers can serve them (`check_support`), and turn the engine's parsed reply and
streamed call pieces back into OpenAI's shapes.

As in vLLM: `tool_choice` "auto" (the default when there are tools) needs a tool-call
parser on the model's workers, "required" and a named function do not (the engine forces
a call with structured output); a named choice finishes with "stop", "auto" and
"required" with "tool_calls" when the reply holds calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from daemon.core.core import Core
from daemon.errors import ApiError
from daemon.workers import protocol
from daemon.workers.protocol import Finish, MessageDelta, ToolCall, ToolCallDelta, Tools

# OpenAI's rule for function names; the engines' parsers and templates rely on it too.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")
_json = msgspec.json.Encoder()


class FunctionSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A function tool: chat completions nest it under `function`, Responses do not."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: FunctionSpec


class ChosenFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: ChosenFunction


class CalledFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str


class InToolCall(msgspec.Struct, forbid_unknown_fields=True):
    """A call of an earlier assistant turn, sent back in the history."""

    id: str
    function: CalledFunction
    type: str = "function"


def chat_functions(tools: Sequence[ChatTool] | None) -> list[FunctionSpec]:
    """The functions of a chat request's `tools`; other tool types are refused."""
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise ApiError(400, f"tools[{i}].type '{tool.type}' is not supported; only "
                           "'function' tools are", param=f"tools[{i}].type")
    return [tool.function for tool in tools or ()]


def chat_choice(choice: str | NamedChoice | None) -> tuple[str | None, str | None]:
    """(choice, function) from a chat request's `tool_choice`."""
    if isinstance(choice, NamedChoice):
        if choice.type != "function":
            raise ApiError(400, f"tool_choice.type '{choice.type}' is not supported; name a "
                           "function as {\"type\": \"function\", \"function\": {\"name\": ...}}",
                           param="tool_choice.type")
        return "function", choice.function.name
    return choice, None


def engine_tools(functions: Sequence[FunctionSpec], choice: str | None, function: str | None,
                 parallel: bool | None, param: str = "tools") -> Tools | None:
    """What the engines get for a request's function tools (None: it has none), after the
    checks OpenAI makes: valid unique names, object schemas, a choice that can be met."""
    if choice is not None and choice not in (*CHOICES, "function"):
        raise ApiError(400, f"tool_choice '{choice}' is not one of {', '.join(CHOICES)} or a "
                       "named function", param="tool_choice")
    if not functions:
        if choice in ("required", "function"):
            raise ApiError(400, "tool_choice requires tools; the request has none",
                           param="tool_choice")
        return None
    names = [_checked_function(f, f"{param}[{i}]") for i, f in enumerate(functions)]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ApiError(400, f"tools name a function twice: {', '.join(twice)}", param=param)
    if choice == "function" and function not in names:
        raise ApiError(400, f"tool_choice names function '{function}', which is not among the "
                       "tools", param="tool_choice")
    specs = [{"type": "function", "function": msgspec.to_builtins(f)} for f in functions]
    return Tools(functions=_json.encode(specs).decode(), choice=choice or "auto",
                 function=function, parallel=parallel is not False)


def _checked_function(spec: FunctionSpec, param: str) -> str:
    if _NAME.fullmatch(spec.name) is None:
        raise ApiError(400, f"{param}: function name '{spec.name}' must be 1-64 characters of "
                       "a-z, A-Z, 0-9, _ and -", param=f"{param}.name")
    schema = spec.parameters
    if schema is not None and schema.get("type", "object") != "object":
        raise ApiError(400, f"{param}: the parameters of '{spec.name}' must be a JSON schema "
                       "of type 'object'", param=f"{param}.parameters")
    return spec.name


def history_calls(calls: Sequence[InToolCall], param: str) -> list[ToolCall]:
    """An assistant turn's calls, sent back in a later request."""
    for j, call in enumerate(calls):
        if call.type != "function":
            raise ApiError(400, f"{param}[{j}].type '{call.type}' is not supported; only "
                           "'function' calls are", param=f"{param}[{j}].type")
    return [ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in calls]


def uses_tools(tools: Tools | None, messages: Iterable[protocol.ChatMessage]) -> bool:
    """Whether the prompt holds tools, calls or results, which a template must render."""
    return tools is not None or any(m.tool_calls or m.role == "tool" for m in messages)


def check_support(core: Core, model: str, tools: Tools | None, rendered: bool) -> None:
    """Refuse what the model's workers would drop or cannot parse. `rendered`: the prompt
    holds tools, calls or results (`uses_tools`). Every healthy worker of the model is
    checked: the scheduler may send the request to any of them."""
    support = [w.tools for w in core.workers.values() if w.healthy and w.model == model]
    if rendered and not all(s.template for s in support):
        raise ApiError(400, f"the chat template of model '{model}' does not render tools, tool "
                       "calls or tool results, so they would be dropped from the prompt; serve "
                       "it with a template that does (setting vllm_chat_template)",
                       "tools_unsupported", param="tools" if tools else "messages")
    if tools is not None and tools.choice == "auto" and not all(s.parser for s in support):
        raise ApiError(400, f"tool_choice 'auto' (the default with tools) needs a tool-call "
                       f"parser, and model '{model}' has none configured (setting "
                       "vllm_tool_call_parser, e.g. hermes); send tool_choice 'required' or "
                       "a named function, which need none", "tools_unsupported",
                       param="tool_choice")


def calls_of(finish: Finish, tools: Tools | None) -> list[ToolCall]:
    """The calls the reply holds, at most one when parallel calls are off."""
    if finish.reply is None or tools is None or tools.choice == "none":
        return []
    calls = finish.reply.tool_calls
    return calls if tools.parallel else calls[:1]


def reply_message(text: str, finish: Finish, tools: Tools | None) -> dict[str, Any]:
    """The assistant message of a chat completion."""
    calls = calls_of(finish, tools)
    content = text if finish.reply is None else finish.reply.content
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return message


def finish_reason(finish: Finish, tools: Tools | None) -> str:
    if calls_of(finish, tools) and tools is not None and tools.choice != "function":
        return "tool_calls"
    return "length" if finish.reason == "length" else "stop"


def stream_delta(text: str, message: MessageDelta | None, tools: Tools | None
                 ) -> dict[str, Any]:
    """A chat chunk's delta for one engine delta: its content and call pieces."""
    if message is None:
        return {"content": text} if text else {}
    delta: dict[str, Any] = {}
    if message.content:
        delta["content"] = message.content
    pieces = [_call_piece(p) for p in message.tool_calls
              if tools is None or tools.parallel or p.index == 0]
    if pieces:
        delta["tool_calls"] = pieces
    return delta


def _call_piece(piece: ToolCallDelta) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": piece.arguments}
    out: dict[str, Any] = {"index": piece.index, "function": function}
    if piece.id is not None:  # a call's first piece: OpenAI sends its id, type and name
        out.update(id=piece.id, type="function")
        function["name"] = piece.name
    return out


def prompt_chars(tools: Tools | None, messages: Iterable[protocol.ChatMessage]) -> int:
    """Characters of the prompt for the size limit: contents, calls and tool specs."""
    chars = len(tools.functions) if tools is not None else 0
    for m in messages:
        chars += len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return chars
