"""The Responses API's streaming events, as OpenAI sends them and vLLM mirrors:
`response.created` and `response.in_progress`, then per output item
`response.output_item.added`, its deltas (`response.output_text.delta` inside a
`response.content_part.added`/`.done` pair, or `response.function_call_arguments.delta`)
and `response.output_item.done`, then `response.completed` with the whole response (or
`error` and `response.failed`). Every event carries its `sequence_number`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from daemon.api.response_items import Output, call_item, message_item, output_text
from daemon.state import StreamItem
from daemon.workers.protocol import ToolCall, ToolCallDelta, Tools

_json = msgspec.json.Encoder()


@dataclass
class _Call:
    output_index: int
    call: ToolCall  # arguments: what was streamed so far


@dataclass
class Events:
    """One response's events, in order: each method returns the SSE frames to send."""

    output: Output
    tools: Tools | None
    sequence: int = 0
    next_index: int = 0
    text_index: int | None = None  # the message item's output index, once it is open
    text: str = ""
    calls: dict[int, _Call] = field(default_factory=dict)  # by the engine's call index

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"

    def started(self, response: dict[str, Any]) -> list[bytes]:
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def delta(self, item: StreamItem) -> list[bytes]:
        """The events of one engine delta: its content, then the call pieces it holds."""
        content = item.text if item.message is None else item.message.content
        frames = self._text(content) if content else []
        for piece in item.message.tool_calls if item.message is not None else ():
            if self.tools is None or self.tools.parallel or piece.index == 0:
                frames += self._call_piece(piece)
        return frames

    def _text(self, content: str) -> list[bytes]:
        frames = self._open_text() if self.text_index is None else []
        self.text += content
        return [*frames, self.event("response.output_text.delta", output_index=self.text_index,
                                    item_id=self.output.message_id, content_index=0,
                                    delta=content, logprobs=[])]

    def _open_text(self) -> list[bytes]:
        self.text_index = self._claim_index()
        item_id = self.output.message_id
        return [self.event("response.output_item.added", output_index=self.text_index,
                           item=message_item(item_id, "", "in_progress")),
                self.event("response.content_part.added", output_index=self.text_index,
                           item_id=item_id, content_index=0, part=output_text(""))]

    def _call_piece(self, piece: ToolCallDelta) -> list[bytes]:
        frames = []
        streamed = self.calls.get(piece.index)
        if streamed is None:  # the call's first piece names it
            call = ToolCall(id=piece.id or "", name=piece.name or "", arguments="")
            streamed = self.calls[piece.index] = _Call(self._claim_index(), call)
            frames.append(self.event(
                "response.output_item.added", output_index=streamed.output_index,
                item=call_item(self.output.call_item_id(call.id), call, "in_progress")))
        if piece.arguments:
            streamed.call = msgspec.structs.replace(
                streamed.call, arguments=streamed.call.arguments + piece.arguments)
            frames.append(self.event(
                "response.function_call_arguments.delta", output_index=streamed.output_index,
                item_id=self.output.call_item_id(streamed.call.id), delta=piece.arguments))
        return frames

    def _claim_index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def finished(self, items: list[dict[str, Any]]) -> list[bytes]:
        """Close every open item with its final value (`items`: the response's output),
        adding any the engine did not stream piece by piece."""
        frames = []
        for item in items:
            if item["type"] == "message":
                frames += self._text_done(item)
            else:
                frames += self._call_done(item)
        return frames

    def _text_done(self, item: dict[str, Any]) -> list[bytes]:
        text = item["content"][0]["text"]
        frames = [] if self.text_index is not None else self._open_text()
        assert self.text_index is not None
        at = {"output_index": self.text_index, "item_id": item["id"]}
        return [*frames,
                self.event("response.output_text.done", **at, content_index=0, text=text,
                           logprobs=[]),
                self.event("response.content_part.done", **at, content_index=0,
                           part=output_text(text)),
                self.event("response.output_item.done", output_index=self.text_index,
                           item=item)]

    def _call_done(self, item: dict[str, Any]) -> list[bytes]:
        streamed = next((c for c in self.calls.values() if c.call.id == item["call_id"]), None)
        frames = []
        if streamed is None:
            call = ToolCall(id=item["call_id"], name=item["name"], arguments="")
            streamed = _Call(self._claim_index(), call)
            frames.append(self.event("response.output_item.added",
                                     output_index=streamed.output_index,
                                     item={**item, "arguments": "", "status": "in_progress"}))
        at = {"output_index": streamed.output_index, "item_id": item["id"]}
        return [*frames,
                self.event("response.function_call_arguments.done", **at, name=item["name"],
                           arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=streamed.output_index,
                           item=item)]

    def completed(self, response: dict[str, Any]) -> bytes:
        return self.event("response.completed", response=response)

    def failed(self, response: dict[str, Any], code: str, message: str) -> list[bytes]:
        return [self.event("error", code=code, message=message, param=None),
                self.event("response.failed", response=response)]
