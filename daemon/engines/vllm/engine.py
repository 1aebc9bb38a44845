"""A vLLM engine inside an agentd worker process.

Wraps vLLM's `AsyncLLM` (v1). Settings default to what works on a CPU-only
machine (shared/notes/vllm-cpu.md): an explicit KV cache size, 128-token
blocks, eager mode, one process for the model executor. Prompts are always
tokenized here and handed to vLLM as token ids, so the prompt size reported on
the first delta is exactly what the engine scheduled, and chat templates are
applied in this one place.

vLLM publishes its KV cache events (`KVEventsConfig`) on an ipc socket this engine
subscribes to; they give each program's residency (daemon/engines/kv_events.py), which
the heartbeats carry to the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from daemon.engines.kv_events import Residency, decode_batch
from daemon.engines.vllm import tools
from daemon.engines.vllm.adapter import (
    StatsCollector,
    kv_capacity_tokens,
    make_stat_logger_factory,
)
from daemon.engines.vllm.segments import SegmentTokenizer
from daemon.workers.protocol import (
    Finish,
    ProgramResidency,
    Submit,
    TokenDelta,
    TokenLogprob,
    ToolSupport,
    TopLogprob,
    WorkerStats,
)
from daemon.workers.protocol import SamplingParams as WireSampling

log = logging.getLogger("agentd.worker")

DEFAULT_KV_CACHE_BYTES = 64 << 20
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


class VllmEngineError(RuntimeError):
    """The engine was used before `start` or after `shutdown`."""


class VllmEngine:
    engine = "vllm"
    kv_events = True

    def __init__(
        self,
        model_dir: str,
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        block_size: int = 128,
        max_model_len: int = 2048,
        dtype: str = "bfloat16",
        enforce_eager: bool = True,
        max_num_seqs: int = 32,
        model_name: str | None = None,
        load_format: str = "auto",
        tool_call_parser: str = "",
        chat_template: str = "",
        kv_offload_bytes: int = 0,
        tensor_parallel_size: int = 1,
    ) -> None:
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if tensor_parallel_size > 1 and on_cpu_build():
            raise ValueError("tensor_parallel_size > 1 needs a GPU build of vLLM")
        # Its ranks run on the GPUs this process sees (Ray placement makes them the GPUs of
        # the worker's placement group, daemon/workers/ray_actor.py).
        self._tensor_parallel_size = tensor_parallel_size
        if kv_offload_bytes < 0:
            raise ValueError(f"kv_offload_bytes must be >= 0, got {kv_offload_bytes}")
        if kv_offload_bytes and on_cpu_build():
            raise ValueError("vllm_kv_offload_bytes needs a GPU build of vLLM: on the CPU "
                             "build the KV cache already lives in host memory; set it to 0")
        self._kv_offload_bytes = kv_offload_bytes
        if block_size % 32:
            # vLLM's CPU attention backend fails at start otherwise; say so up front.
            raise ValueError(f"block_size must be a multiple of 32 on CPU, got {block_size}")
        self.model_dir = model_dir
        self.model = model_name or Path(model_dir).name
        self.block_size = block_size
        self.max_batch = max_num_seqs
        self.kv_capacity_tokens = 0  # known once the engine has allocated its cache
        self._kv_cache_bytes = kv_cache_bytes
        self._max_model_len = max_model_len
        self._dtype = dtype
        self._enforce_eager = enforce_eager
        self._load_format = load_format  # "dummy": random weights, for timing a model shape
        tools.check_parser(tool_call_parser)
        self._tool_call_parser = tool_call_parser
        self._template = tools.chat_template(chat_template)  # None: the tokenizer's own
        self.tools = ToolSupport()  # known once the tokenizer is loaded
        self._tool_parsing: tools.ToolParsing | None = None
        self._collector = StatsCollector()
        self._llm: Any = None
        self._tokenizer: Any = None
        self.residency = Residency(block_size)
        # Short: an ipc path must fit a socket address (107 bytes).
        self._events_endpoint = (
            f"ipc://{tempfile.gettempdir()}/agentd-kv-{uuid.uuid4().hex[:12]}")
        self._events: asyncio.Task[None] | None = None
        self.events_missed = 0  # batches lost between vLLM's publisher and us

    async def start(self) -> None:
        # Must be set before vLLM reads it: keeps the model executor inside the
        # engine-core process instead of a further worker process (about 3.5 s
        # start instead of 25 s, half the memory). AsyncLLM still runs the
        # engine core in its own process, so steps never block our event loop.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm.config import KVEventsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # vLLM's CPU build cannot rewind a request's own generator (a `seed`): a seeded
        # request whose prompt is prefilled in chunks kills the engine core ("CPU Generator
        # does not use offset"). So on CPU a prompt is prefilled whole, in one step.
        whole_prefill = on_cpu_build()
        args = AsyncEngineArgs(
            model=self.model_dir,
            served_model_name=[self.model],
            dtype=self._dtype,  # type: ignore[arg-type]  # validated by vLLM
            max_model_len=self._max_model_len,
            block_size=self.block_size,
            kv_cache_memory_bytes=self._kv_cache_bytes,
            enable_prefix_caching=True,
            enforce_eager=self._enforce_eager,
            load_format=self._load_format,
            max_num_seqs=self.max_batch,
            tensor_parallel_size=self._tensor_parallel_size,
            # ranks as processes on this node: the placement group keeps them on one node
            distributed_executor_backend="mp" if self._tensor_parallel_size > 1 else None,
            enable_chunked_prefill=False if whole_prefill else None,
            max_num_batched_tokens=max(self._max_model_len, 2048) if whole_prefill else None,
            # Our stat logger is the only consumer; vLLM's periodic log lines are noise.
            disable_log_stats=True,
            # Evicted blocks go to host memory and are published with medium "CPU": the
            # residency the worker reports counts them as reachable.
            kv_offloading_size=self._kv_offload_bytes / 2**30 or None,
            kv_events_config=KVEventsConfig(
                enable_kv_cache_events=True, publisher="zmq",
                endpoint=self._events_endpoint),
        )
        self._llm = AsyncLLM.from_engine_args(
            args, stat_loggers=[make_stat_logger_factory(self._collector)]
        )
        self._tokenizer = self._llm.get_tokenizer()
        self.kv_capacity_tokens = kv_capacity_tokens(self._llm.vllm_config)
        self._tool_parsing = tools.ToolParsing(self._tokenizer, self._tool_call_parser)
        self.tools = ToolSupport(parser=self._tool_call_parser,
                                 template=tools.renders_tools(self._tokenizer, self._template))
        self._events = asyncio.create_task(self._read_events(), name="vllm-kv-events")

    async def _read_events(self) -> None:
        """Apply vLLM's published KV cache events, in order, as they come."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self._events_endpoint)
        last = -1
        try:
            while True:
                _topic, seq_bytes, payload = await sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if last >= 0 and seq != last + 1:
                    # The publisher's queue overflowed: what we mirror may keep blocks
                    # that are gone (a program looks warmer than it is) until they return.
                    self.events_missed += max(0, seq - last - 1)
                    log.warning("missed %d KV event batches from vLLM", seq - last - 1)
                last = seq
                try:
                    batch = decode_batch(payload)
                except msgspec.DecodeError as exc:  # a vLLM whose events we cannot read
                    self.events_missed += 1
                    log.warning("unreadable KV event batch from vLLM: %s", exc)
                    continue
                self.residency.apply_all(batch.events)
        finally:
            sock.close(linger=0)

    @property
    def dead(self) -> bool:
        return self._llm is not None and bool(self._llm.errored)

    def residency_report(self, everything: bool
                         ) -> tuple[dict[str, ProgramResidency], list[str]]:
        return self.residency.take_report(everything)

    async def shutdown(self) -> None:
        if self._events is not None:
            self._events.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._events
            self._events = None
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        with contextlib.suppress(OSError):
            os.unlink(self._events_endpoint.removeprefix("ipc://"))

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        return bool(await self._require().reset_prefix_cache())

    def stats(self) -> WorkerStats:
        c = self._collector.snapshot()
        return WorkerStats(
            kv_capacity_tokens=self.kv_capacity_tokens,
            kv_used_tokens=round(c.kv_cache_usage * self.kv_capacity_tokens),
            running=c.running,
            waiting=c.waiting,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            preemptions=c.preemptions,
            steps=c.steps,
            generated_tokens=c.generated_tokens,
        )

    def prompt_token_ids(self, submit: Submit) -> list[int]:
        """The exact token ids this engine schedules for `submit`."""
        tok = self._require_tokenizer()
        if submit.messages is not None:
            rendered = tools.render(tok, submit.messages, submit.tools, self._template)
            # The template already emits every special token it wants.
            return list(tok.encode(rendered + submit.continuation, add_special_tokens=False))
        if submit.prompt_token_ids is not None:
            appended = self.segment_token_ids(submit)
            extra = tok.encode(submit.continuation, add_special_tokens=False)
            return [*submit.prompt_token_ids, *appended, *extra]
        if submit.prompt is not None:
            return list(tok.encode(submit.prompt + submit.continuation))
        raise ValueError("submit carries no prompt, prompt_token_ids or messages")

    def segment_token_ids(self, submit: Submit) -> list[int]:
        """The ids `submit.segments` append to its prompt_token_ids."""
        if not submit.segments:
            return []
        segments = SegmentTokenizer(self._require_tokenizer(), self._template)
        return segments.token_ids(submit.segments, context_empty=not submit.prompt_token_ids)

    async def generate(self, submit: Submit) -> AsyncIterator[TokenDelta | Finish]:
        rid = submit.request_id
        started = time.monotonic()
        try:
            llm = self._require()
            prompt_ids = self.prompt_token_ids(submit)
            parser = self._require_tool_parsing().for_request(submit, prompt_ids)
            params = self._sampling_params(submit.sampling, parser)
            if parser is not None:
                parser.prime(submit.continuation, self._continuation_ids(submit))
        except Exception as exc:  # a bad request ends that request, never the worker
            yield _error_finish(rid, exc)
            return
        state = _RequestState(prompt_tokens=len(prompt_ids), parser=parser)
        if submit.segments:
            state.segment_token_ids = self.segment_token_ids(submit)
        try:
            async for out in llm.generate(
                {"prompt_token_ids": prompt_ids}, params, request_id=rid
            ):
                delta = state.take(out, rid, started)
                if delta is not None:
                    yield delta
                if out.finished:
                    self._remember(submit, prompt_ids, state)
                    yield state.finish(rid, out.outputs[0].finish_reason)
                    return
        except Exception as exc:
            yield _error_finish(rid, exc, state)
            return
        # vLLM ended the stream without a finished output: only an abort does that.
        self._remember(submit, prompt_ids, state)
        yield state.finish(rid, "abort")

    def _remember(self, submit: Submit, prompt_ids: list[int], state: _RequestState) -> None:
        """Track the context the request left in the KV: its prompt and output, less the
        last token sampled, which the model never ran on. Before the Finish goes out, so
        the next heartbeat carries it."""
        self.residency.remember(submit.program_id, [*prompt_ids, *state.output_ids[:-1]])

    def _sampling_params(self, wire: WireSampling, parser: tools.RequestParser | None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = None
        if wire.json_schema or wire.regex or wire.grammar:
            if sum(1 for c in (wire.json_schema, wire.regex, wire.grammar) if c) > 1:
                raise ValueError("at most one of json_schema, regex and grammar may be set")
            structured = StructuredOutputsParams(json=wire.json_schema or None,
                                                 regex=wire.regex or None,
                                                 grammar=wire.grammar or None)
        if parser is not None and parser.structured_outputs is not None:
            # A forced or constrained call wins over response_format, as in vLLM's server.
            structured = parser.structured_outputs
        return SamplingParams(
            max_tokens=wire.max_tokens,
            temperature=wire.temperature,
            top_p=wire.top_p,
            # The wire uses -1 for "no top-k"; vLLM 0.32 spells that 0.
            top_k=max(wire.top_k, 0),
            stop=list(wire.stop) or None,
            seed=wire.seed,
            logprobs=wire.logprobs,
            frequency_penalty=wire.frequency_penalty,
            presence_penalty=wire.presence_penalty,
            structured_outputs=structured,
            logit_bias=dict(wire.logit_bias) or None,
            skip_special_tokens=parser is None or parser.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
        )

    def _continuation_ids(self, submit: Submit) -> list[int]:
        if not submit.continuation:
            return []
        return list(self._require_tokenizer().encode(submit.continuation,
                                                     add_special_tokens=False))

    def _require_tool_parsing(self) -> tools.ToolParsing:
        if self._tool_parsing is None:
            raise VllmEngineError("the vLLM engine is not running (start() not awaited?)")
        return self._tool_parsing

    def _require(self) -> Any:
        if self._llm is None:
            raise VllmEngineError("the vLLM engine is not running (start() not awaited?)")
        return self._llm

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise VllmEngineError("the vLLM engine is not running (start() not awaited?)")
        return self._tokenizer


def on_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class _RequestState:
    """Per-request bookkeeping across vLLM's delta outputs."""

    def __init__(self, prompt_tokens: int, parser: tools.RequestParser | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.parser = parser
        self.cached_tokens = 0
        self.output_tokens = 0
        self.ttft_s: float | None = None
        self.segment_token_ids: list[int] = []
        self.output_ids: list[int] = []
        self._sent_first = False

    def take(self, out: Any, rid: str, started: float) -> TokenDelta | None:
        if out.num_cached_tokens is not None:
            self.cached_tokens = int(out.num_cached_tokens)
        if out.prompt_token_ids is not None:
            self.prompt_tokens = len(out.prompt_token_ids)
        completion = out.outputs[0]
        n = len(completion.token_ids)
        message = None
        if self.parser is not None:
            # Also an empty last output: it lets the parser flush what it held back.
            message = self.parser.delta(completion.text, list(completion.token_ids),
                                        finished=completion.finish_reason is not None)
        if n == 0 and not completion.text and not (message and message.tool_calls):
            return None
        self.output_tokens += n
        self.output_ids.extend(completion.token_ids)
        first = not self._sent_first
        if first:
            self.ttft_s = time.monotonic() - started
            self._sent_first = True
        return TokenDelta(
            request_id=rid,
            text=completion.text,
            num_tokens=n,
            prompt_tokens=self.prompt_tokens if first else None,
            cached_tokens=self.cached_tokens if first else None,
            message=message,
            logprobs=_logprobs(completion) if completion.logprobs else None,
            token_ids=list(completion.token_ids),
        )

    def finish(self, rid: str, reason: str | None) -> Finish:
        return Finish(
            request_id=rid,
            reason=_FINISH_REASONS.get(reason or "", "stop" if reason else "abort"),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            ttft_s=self.ttft_s,
            reply=self.parser.reply() if self.parser is not None else None,
            segment_token_ids=self.segment_token_ids,
        )


def _logprobs(completion: Any) -> list[TokenLogprob]:
    """vLLM's per-position {token id: Logprob} (the sampled token and the likeliest
    alternatives) as the wire carries them."""
    out = []
    for token_id, position in zip(completion.token_ids, completion.logprobs, strict=False):
        chosen = position[token_id]
        ranked = sorted(((i, p) for i, p in position.items() if p.rank is not None),
                        key=lambda item: item[1].rank)
        out.append(TokenLogprob(
            token=chosen.decoded_token or "", logprob=_finite(chosen.logprob),
            top=[TopLogprob(p.decoded_token or "", _finite(p.logprob), i) for i, p in ranked],
            token_id=int(token_id)))
    return out


def _finite(logprob: float) -> float:
    # JSON has no -inf; OpenAI's floor for "impossible" is -9999.0, as vLLM's server uses.
    return max(logprob, -9999.0)


def _error_finish(rid: str, exc: BaseException, state: _RequestState | None = None) -> Finish:
    return Finish(
        request_id=rid,
        reason="error",
        prompt_tokens=state.prompt_tokens if state else 0,
        cached_tokens=state.cached_tokens if state else 0,
        output_tokens=state.output_tokens if state else 0,
        ttft_s=state.ttft_s if state else None,
        error=f"{type(exc).__name__}: {exc}",
    )
