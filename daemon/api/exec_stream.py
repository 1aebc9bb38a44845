"""A streamed exec: a tool command's output as server-sent events while it runs.

Events: `output` ({"stream": "stdout" | "stderr", "text": ...}) for each piece as it
arrives, then one `result` (the exec's result, as the plain exec answers it) or one `error`
(a failed environment: the error body the plain exec would answer with its status). A
client that goes away cancels the command, as for a plain exec.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar.response import ServerSentEventMessage

from tools import ToolError
from tools.base import ExecResult, OutputListener

Run = Callable[[OutputListener], Awaitable[ExecResult]]


async def exec_events(run: Run, on_error: Callable[[ToolError], dict[str, Any]]
                      ) -> AsyncIterator[ServerSentEventMessage]:
    pieces: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    # A piece may end inside a UTF-8 character: each stream decodes across pieces.
    decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                for name in ("stdout", "stderr")}

    def heard(name: str, data: bytes) -> None:
        if text := decoders[name].decode(data):
            pieces.put_nowait((name, text))

    task = asyncio.ensure_future(run(heard))
    try:
        while not task.done() or not pieces.empty():
            if pieces.empty():
                waiting = asyncio.ensure_future(pieces.get())
                await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    waiting.cancel()
                    continue
                name, text = waiting.result()
            else:
                name, text = pieces.get_nowait()
            yield _event("output", {"stream": name, "text": text})
        try:
            result = task.result()
        except ToolError as exc:
            yield _event("error", on_error(exc))
            return
        yield _event("result", result.to_dict())
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ToolError):
                await task


def _event(kind: str, data: dict[str, Any]) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=json.dumps(data), event=kind)
