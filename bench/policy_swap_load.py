"""Steady gateway traffic for the swap benchmark, in its own process so that the load
generator's CPU and event loop never sit between the benchmark's timer and the daemon.

`concurrency` `openai` async clients loop closed: each is one program (`program_id`) and
sends its next chat completion as soon as the last one answered. Every exception or
unfinished answer is a failed request. Each request's send time (`sent_at`, time.time()
as httpx hands it to the transport) is kept per program, in order, so the benchmark can
tell the daemon's part of a dispatch (from the send to `dispatched_at`) from the
client's (from an answer to the next send).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from typing import Any

import openai

MODEL = "sim-llama3-8b"
# The running client's send times: each client is its own task, so its own context.
_SENT: ContextVar[list[float]] = ContextVar("sent")


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    programs: list[str] = field(default_factory=list)
    sent_at: dict[str, list[float]] = field(default_factory=dict)


def program_ids(concurrency: int) -> list[str]:
    return [f"swapload-{k}" for k in range(concurrency)]


async def _stamp(_request: Any) -> None:
    _SENT.get().append(time.time())


async def _client(client: openai.AsyncOpenAI, program: str, stop: Event,
                  result: LoadResult) -> None:
    _SENT.set(result.sent_at.setdefault(program, []))
    n = 0
    while not stop.is_set():
        n += 1
        result.sent += 1
        try:
            answer = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"{program} step {n}"}],
                max_tokens=4, extra_body={"program_id": program})
        except Exception as exc:  # every failure is a dropped request
            result.errors.append(f"{program} #{n}: {exc!r}"[:300])
            continue
        if answer.choices and answer.choices[0].finish_reason in ("stop", "length"):
            result.ok += 1
        else:
            result.errors.append(f"{program} #{n}: unfinished answer {answer!r}"[:300])


async def _run(url: str, token: str, concurrency: int, stop: Event) -> LoadResult:
    result = LoadResult(programs=program_ids(concurrency))
    http = openai.DefaultAsyncHttpxClient(timeout=30, event_hooks={"request": [_stamp]})
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0,
                                timeout=30, http_client=http)
    async with client:
        await asyncio.gather(*(_client(client, p, stop, result) for p in result.programs))
    return result


def _main(url: str, token: str, concurrency: int, stop: Event, out: Any) -> None:
    result = asyncio.run(_run(url, token, concurrency, stop))
    out.send(result)
    out.close()


class Load:
    """`with Load(...) as load:` runs the traffic; `load.result` once the block ends."""

    def __init__(self, url: str, token: str, concurrency: int) -> None:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_main, args=(url, token, concurrency, self.stop, send),
                                daemon=True)
        self.result = LoadResult()

    def __enter__(self) -> Load:
        self.proc.start()
        return self

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None, "the load process has not started"
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        try:
            if self._recv.poll(60):
                self.result = self._recv.recv()
        except EOFError:
            self.result.errors.append("the load generator died without a result")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
            self.result.errors.append("load generator did not stop; killed")
