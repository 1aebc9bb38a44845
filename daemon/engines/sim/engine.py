"""``SimEngine``: the simulated engine in wall-clock time, behind the worker's ``Engine`` interface.

One asyncio task runs the scheduler: it takes a step, sleeps the step's modelled duration
(times ``time_scale``) on an absolute schedule so loop overhead does not accumulate, then
delivers the step's tokens to each request's stream. Requests and aborts arriving during the
sleep take effect at the next step, as on a real engine where a forward pass is not interrupted.

Prompts: ``Submit.prompt_token_ids`` are used as given; ``messages`` go through the sim chat
template; ``prompt`` is tokenized as is. ``continuation`` (text generated before a failover) is
tokenized after the prompt and output numbering continues after it (``sim<k>`` onwards, with
``k`` its token count), so the resumed stream reads on from where it stopped. ``max_tokens``
counts the tokens of this submit only.

Simulated EOS: with ``eos_mean_tokens`` set, each request's output length is drawn from an
exponential distribution with that mean, from ``random.Random(seed)`` where the seed is
``sampling.seed`` or else a BLAKE2b digest of the request id, so the same request ends at the
same place in every run and process; it finishes with reason "stop" there unless ``max_tokens``
comes first ("length"). Default (None): every request runs to ``max_tokens``.

Structure: a request with tools, or a JSON schema, gets a scripted answer instead of filler
(a tool call, a JSON value; daemon/engines/sim/tools.py), then EOS; with tools the deltas
and the finish carry the parsed view (content and calls) as a real engine's parser would.
Log probabilities, when asked, are simulated too (``token_logprob``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from daemon.engines.sim import tokenizer
from daemon.engines.sim.cost import CostModel, load_cost_model
from daemon.engines.sim.scheduler import (
    RequestRejected,
    SchedulerConfig,
    SimRequest,
    SimScheduler,
    StepResult,
)
from daemon.engines.sim.tools import Script, scripted_reply
from daemon.workers.protocol import (
    Finish,
    MessageDelta,
    ProgramResidency,
    Reply,
    Submit,
    TokenDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSupport,
    TopLogprob,
    WorkerStats,
)

log = logging.getLogger("agentd.engines.sim")


def request_seed(submit: Submit) -> int:
    if submit.sampling.seed is not None:
        return submit.sampling.seed
    digest = hashlib.blake2b(submit.request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def request_from_submit(submit: Submit, eos_mean_tokens: float | None = None,
                        script: Script | None = None) -> SimRequest:
    """The scheduler's view of a submit: prompt token ids, output budget, simulated EOS.
    A ``script`` (a tool call, a JSON value) is the output, and EOS comes right after it."""
    if submit.prompt_token_ids is not None:
        ids = list(submit.prompt_token_ids)
        ids.extend(tokenizer.segment_ids(submit.segments, context_empty=not ids))
    elif submit.messages is not None:
        ids = tokenizer.encode(tokenizer.render_chat(submit.messages, submit.tools))
    else:
        ids = tokenizer.encode(submit.prompt or "")
    offset = 0
    if submit.continuation:
        cont = tokenizer.encode(submit.continuation)
        ids.extend(cont)
        offset = len(cont)
    eos_after = None
    if script is not None:
        eos_after = max(1, len(script.pieces) - offset)
    elif eos_mean_tokens is not None:
        rng = random.Random(request_seed(submit))
        eos_after = 1 + int(rng.expovariate(1.0 / eos_mean_tokens))
    return SimRequest(
        request_id=submit.request_id,
        prompt_token_ids=ids,
        max_tokens=submit.sampling.max_tokens,
        eos_after=eos_after,
        output_offset=offset,
        priority=submit.priority,
        script_token_ids=[tokenizer.piece_id(p.strip()) for p in script.pieces] if script
        else [],
        program_id=submit.program_id,
    )


def token_logprob(seed: int, index: int, text: str, alternatives: int,
                  token_id: int | None = None) -> TokenLogprob:
    """Simulated log probabilities of output token ``index`` (id ``token_id``): the token is
    the likeliest, the ``alternatives`` below it share what is left, halving; the same in
    every run. Alternative ``j`` is the sim vocabulary's piece ``sim<index>_<j>``."""
    rng = random.Random(seed * 65_537 + index)
    chosen = rng.uniform(0.5, 0.99)
    top = [TopLogprob(text, math.log(chosen), token_id)]
    left = 1.0 - chosen
    for j in range(1, alternatives):
        left /= 2
        top.append(TopLogprob(f" sim{index}_{j}", math.log(left),
                              tokenizer.piece_id(f"sim{index}_{j}")))
    return TokenLogprob(token=text, logprob=top[0].logprob, top=top[:alternatives],
                        token_id=token_id)


# Sampling the sim cannot honour: refused per request, never ignored.
_UNSUPPORTED = (("regex", "regex-constrained output"), ("grammar", "grammar-constrained output"),
                ("logit_bias", "logit_bias"))


def unsupported(submit: Submit) -> str | None:
    """Why the sim cannot serve ``submit`` as asked, or None."""
    for name, what in _UNSUPPORTED:
        if getattr(submit.sampling, name):
            return f"{name}: the simulated engine has no real logits, so it cannot do {what}"
    return None


@dataclass(eq=False)
class _Stream:
    started: float
    # A continuation already ends in a token, so even the first new one needs its space.
    space_first: bool
    submit: Submit
    seed: int
    script: Script | None
    queue: asyncio.Queue[TokenDelta | Finish] = field(default_factory=asyncio.Queue)
    ttft_s: float | None = None
    text: str = ""  # the continuation and all output: the reply parsed at the end

    def __post_init__(self) -> None:
        self.text = self.submit.continuation

    @property
    def parses_calls(self) -> bool:
        tools = self.submit.tools
        return tools is not None and tools.choice != "none"

    def token_text(self, index: int, first: bool) -> str:
        if self.script is not None and index < len(self.script.pieces):
            return self.script.pieces[index]
        return tokenizer.filler_text(index, first=first)

    def message(self, index: int) -> MessageDelta | None:
        """The parsed view of output token ``index``: call pieces hold no content, and
        the script's last token completes its calls."""
        if self.script is None or not self.script.calls:
            return None
        if index != len(self.script.pieces) - 1:
            return MessageDelta()
        return MessageDelta(tool_calls=[
            ToolCallDelta(index=i, id=c.id, name=c.name, arguments=c.arguments)
            for i, c in enumerate(self.script.calls)])

    def segment_ids(self) -> list[int]:
        submit = self.submit
        if not submit.segments or submit.prompt_token_ids is None:
            return []
        return tokenizer.segment_ids(submit.segments, context_empty=not submit.prompt_token_ids)

    def reply(self, reason: str) -> Reply | None:
        if not self.parses_calls:
            return None
        if self.script is not None and self.script.calls and reason == "stop":
            return Reply(content=None, tool_calls=self.script.calls)
        return Reply(content=self.text)  # no call, or one cut short: it does not parse


class SimEngine:
    engine = "sim"
    # Its template renders tools, and it writes calls whole (engines/sim/tools.py).
    tools = ToolSupport(parser="sim", template=True)
    kv_events = True  # its block pool records them (engines/sim/blocks.py)

    def __init__(
        self,
        model: str = "sim-llama3-8b",
        kv_capacity_tokens: int = 65536,
        block_size: int = 16,
        max_batch: int = 64,
        max_batched_tokens: int = 2048,
        cost_model: CostModel | None = None,
        time_scale: float = 1.0,
        *,
        eos_mean_tokens: float | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if kv_capacity_tokens < block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        config = SchedulerConfig.from_capacity(
            kv_capacity_tokens,
            block_size=block_size,
            max_num_seqs=max_batch,
            max_num_batched_tokens=max_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
        )
        self.model = model
        self.kv_capacity_tokens = config.kv_capacity_tokens
        self.block_size = block_size
        self.max_batch = max_batch
        self.cost_model = cost_model or load_cost_model()
        self.time_scale = time_scale
        self.eos_mean_tokens = eos_mean_tokens
        self.scheduler = SimScheduler(config, self.cost_model)
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sim-engine")

    async def generate(self, submit: Submit) -> AsyncIterator[TokenDelta | Finish]:
        rid = submit.request_id
        loop = asyncio.get_running_loop()
        seed = request_seed(submit)
        script = scripted_reply(submit, seed)
        try:
            req = request_from_submit(submit, self.eos_mean_tokens, script)
        except ValueError as exc:  # a segment it cannot render
            yield Finish(request_id=rid, reason="error", prompt_tokens=0, cached_tokens=0,
                         output_tokens=0, error=str(exc))
            return
        try:
            if (why := unsupported(submit)) is not None:
                raise RequestRejected(why)
            if rid in self._streams:
                raise RequestRejected(f"request {rid!r} is already running")
            self.scheduler.add_request(req)
        except RequestRejected as exc:
            yield Finish(
                request_id=rid, reason="error", prompt_tokens=req.num_prompt_tokens,
                cached_tokens=0, output_tokens=0, error=str(exc),
            )
            return
        stream = _Stream(started=loop.time(), space_first=bool(submit.continuation),
                         submit=submit, seed=seed, script=script)
        self._streams[rid] = stream
        self._wake.set()
        try:
            while True:
                item = await stream.queue.get()
                yield item
                if isinstance(item, Finish):
                    return
        finally:
            # The consumer went away before the Finish (cancelled): drop the request.
            if self._streams.get(rid) is stream:
                del self._streams[rid]
                self.scheduler.abort(rid)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        req = self.scheduler.abort(request_id)
        if stream is None or req is None:
            return
        stream.queue.put_nowait(
            Finish(
                request_id=request_id, reason="abort", prompt_tokens=req.num_prompt_tokens,
                cached_tokens=max(req.num_cached_tokens, 0),
                output_tokens=req.num_output_tokens, ttft_s=stream.ttft_s,
            )
        )

    def stats(self) -> WorkerStats:
        return self.scheduler.stats()

    @property
    def dead(self) -> bool:
        return self._task is not None and self._task.done()  # its step loop ended

    def residency_report(self, everything: bool
                         ) -> tuple[dict[str, ProgramResidency], list[str]]:
        return self.scheduler.residency.take_report(everything)

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for rid in list(self._streams):
            await self.abort(rid)

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:
            # A bug in the model must end the requests it holds, not leave them hanging.
            log.exception("simulated engine loop failed")
            for rid, stream in list(self._streams.items()):
                del self._streams[rid]
                stream.queue.put_nowait(
                    Finish(
                        request_id=rid, reason="error", prompt_tokens=0, cached_tokens=0,
                        output_tokens=0, error=f"sim engine failed: {type(exc).__name__}: {exc}",
                    )
                )
            raise

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.scheduler.has_work():
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            result = self.scheduler.step()
            deadline = max(deadline, loop.time()) + result.duration_s * self.time_scale
            # Sleeping even for 0 s lets submits and aborts in between steps.
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self._deliver(result, loop.time())

    def _deliver(self, result: StepResult, now: float) -> None:
        for out in result.outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.new_token_ids:
                n_out = out.num_output_tokens
                first = stream.ttft_s is None
                if first:
                    stream.ttft_s = now - stream.started
                index = out.output_offset + n_out - 1
                text = stream.token_text(index, first=n_out == 1 and not stream.space_first)
                stream.text += text
                stream.queue.put_nowait(
                    TokenDelta(
                        request_id=out.request_id, text=text, num_tokens=1,
                        prompt_tokens=out.num_prompt_tokens if first else None,
                        cached_tokens=out.num_cached_tokens if first else None,
                        message=stream.message(index),
                        logprobs=self._logprobs(stream, index, text, out.new_token_ids[-1]),
                        token_ids=list(out.new_token_ids),
                    )
                )
            if out.finish_reason is not None:
                del self._streams[out.request_id]
                stream.queue.put_nowait(
                    Finish(
                        request_id=out.request_id, reason=out.finish_reason,
                        prompt_tokens=out.num_prompt_tokens,
                        cached_tokens=out.num_cached_tokens,
                        output_tokens=out.num_output_tokens, ttft_s=stream.ttft_s,
                        reply=stream.reply(out.finish_reason),
                        segment_token_ids=stream.segment_ids(),
                    )
                )

    @staticmethod
    def _logprobs(stream: _Stream, index: int, text: str,
                  token_id: int) -> list[TokenLogprob] | None:
        alternatives = stream.submit.sampling.logprobs
        if alternatives is None:
            return None
        return [token_logprob(stream.seed, index, text, alternatives, token_id)]
