"""The Responses API's items, to and from the chat messages the engines take.

Input: a string is one user message; a list holds items: messages (roles user, system,
developer, assistant; text content, a string or `input_text`/`output_text` parts),
`function_call` items (a call the model made earlier: it joins the assistant turn before
it, as vLLM's Responses API does) and `function_call_output` items (a `tool` message
answering the call named by `call_id`). Any other item or content part is refused with a
400 naming it.

Output: the reply's text as one `message` item with an `output_text` part, and each call
it holds as a `function_call` item (daemon/api/chat_tools.py gives the calls).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from daemon.api import chat_tools
from daemon.api.chat_tools import FunctionSpec
from daemon.errors import ApiError
from daemon.workers.protocol import ChatMessage, Finish, ToolCall, Tools

ROLES = ("user", "system", "developer", "assistant")
S = TypeVar("S", bound=msgspec.Struct)
_AT = re.compile(r"- at `\$([^`]*)`")
TEXT_PARTS = ("input_text", "output_text")


class ContentPart(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    text: str = ""
    # What a client echoes back with an earlier response's output text.
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[dict[str, Any]]  # parts: read once their type is known (_message)
    type: str = "message"
    id: str | None = None
    status: str | None = None


class FunctionCallItem(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class FunctionTool(msgspec.Struct, forbid_unknown_fields=True):
    """A Responses function tool: a chat tool's function, not nested under `function`."""

    type: str
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    name: str


_ITEMS: dict[str, type[msgspec.Struct]] = {
    "message": MessageItem, "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
}


def input_messages(given: str | list[dict[str, Any]]) -> list[ChatMessage]:
    """The chat messages of a request's `input`."""
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    messages: list[ChatMessage] = []
    for i, raw in enumerate(given):
        item = _item(raw, f"input[{i}]")
        if isinstance(item, FunctionCallItem):
            _add_call(messages, ToolCall(id=item.call_id, name=item.name,
                                         arguments=item.arguments))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(ChatMessage(role="tool", content=item.output,
                                        tool_call_id=item.call_id))
        else:
            assert isinstance(item, MessageItem)
            messages.append(_message(item, f"input[{i}]"))
    return messages


def _item(raw: dict[str, Any], at: str) -> msgspec.Struct:
    kind = raw.get("type", "message")
    if kind not in _ITEMS:
        raise ApiError(400, f"{at}.type '{kind}' is not supported; input items are "
                       f"{', '.join(_ITEMS)}", param=f"{at}.type")
    return _convert(raw, _ITEMS[kind], at)


def _convert(raw: dict[str, Any], kind: type[S], at: str) -> S:
    """`raw` as a `kind`; a 400 naming the field that does not fit."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        inner = _AT.search(str(exc))
        param = at + (inner.group(1) if inner else "")
        raise ApiError(400, f"{param}: {exc}", "invalid_value", param=param) from exc


def _message(item: MessageItem, at: str) -> ChatMessage:
    if item.role not in ROLES:
        raise ApiError(400, f"{at}.role '{item.role}' is not one of {', '.join(ROLES)}",
                       param=f"{at}.role")
    if isinstance(item.content, str):
        return ChatMessage(role=item.role, content=item.content)
    texts = []
    for j, part in enumerate(item.content):
        kind = part.get("type")
        if kind not in TEXT_PARTS:
            raise ApiError(400, f"{at}.content[{j}].type '{kind}' is not supported; the "
                           "served models read text parts only", param=f"{at}.content[{j}].type")
        texts.append(_convert(part, ContentPart, f"{at}.content[{j}]").text)
    return ChatMessage(role=item.role, content="".join(texts))


def _add_call(messages: list[ChatMessage], call: ToolCall) -> None:
    """A call joins the assistant turn just before it; else it is an assistant turn."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        messages[-1] = msgspec.structs.replace(last, tool_calls=[*last.tool_calls, call])
    else:
        messages.append(ChatMessage(role="assistant", content="", tool_calls=[call]))


def functions(tools: Sequence[FunctionTool] | None) -> list[FunctionSpec]:
    """The function specs of a request's `tools`; other tool types are refused."""
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise ApiError(400, f"tools[{i}].type '{tool.type}' is not supported; only "
                           "'function' tools are", param=f"tools[{i}].type")
    return [FunctionSpec(name=t.name, description=t.description, parameters=t.parameters,
                         strict=t.strict) for t in tools or ()]


def choice(given: str | NamedChoice | None) -> tuple[str | None, str | None]:
    """(choice, function) of a request's `tool_choice`."""
    if isinstance(given, NamedChoice):
        if given.type != "function":
            raise ApiError(400, f"tool_choice.type '{given.type}' is not supported; name a "
                           "function as {\"type\": \"function\", \"name\": ...}",
                           param="tool_choice.type")
        return "function", given.name
    return given, None


def item_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [output_text(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = "" if status == "in_progress" else call.arguments
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": arguments, "status": status}


class Output:
    """A reply's output items, with the ids they were streamed under (or new ones)."""

    def __init__(self) -> None:
        self.message_id = item_id("msg")
        self.call_ids: dict[str, str] = {}  # call id -> item id

    def call_item_id(self, call_id: str) -> str:
        return self.call_ids.setdefault(call_id, item_id("fc"))

    def items(self, text: str, finish: Finish, tools: Tools | None) -> list[dict[str, Any]]:
        calls = chat_tools.calls_of(finish, tools)
        content = chat_tools.reply_message(text, finish, tools)["content"] or ""
        out = [message_item(self.message_id, content)] if content or not calls else []
        return out + [call_item(self.call_item_id(c.id), c) for c in calls]

    @staticmethod
    def turn(text: str, finish: Finish, tools: Tools | None) -> ChatMessage:
        """The assistant turn the reply is in the conversation a next response continues."""
        content = chat_tools.reply_message(text, finish, tools)["content"] or ""
        return ChatMessage(role="assistant", content=content,
                           tool_calls=chat_tools.calls_of(finish, tools))
