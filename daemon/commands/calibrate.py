"""`agentd calibrate`: fit the simulated engine's step-time model to a real vLLM worker.

Measures the real engine over a grid and fits the ``CostModel`` constants

    t_step = c0 + c_prefill·prefill_tokens + c_decode·decode_seqs + c_attn·context_tokens
           + c_pf·prefill_pairs

by non-negative least squares on relative error (every point counts the same, whether it took
20 ms or 2 s). The grid:

- prefill: one prompt of L random tokens, ``max_tokens=1``, prefix cache reset: the time to the
  first token is one step with L prefill tokens, L context tokens and L²/2 query-key pairs;
- cached prefill: a prompt of P tokens, then the same P tokens followed by n new ones: one step
  with n prefill tokens after P cached ones (separates ``c_attn`` from ``c_pf``);
- decode: N concurrent requests of C prompt tokens each (``ignore_eos``); once every prompt is
  prefilled, the gaps between one request's consecutive tokens are steps of N decodes over the
  batch's summed context. The median gap of a run is one point.

Times are measured from the worker process's side of vLLM's ``AsyncLLM`` (the same place the
worker reads them), so per-step engine-core IPC is part of the constants.

Estimators: on a shared machine the same step takes anything from 1x to 30x its own cost,
depending on what else holds the core vLLM pins. A prefill point is the fastest of its repeats
and a decode point a low quantile (``DECODE_QUANTILE``) of its steady gaps, so the constants
describe the engine when it has its core, not the load at the moment of calibration.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from daemon.engines.sim.cost import CostModel, prefill_pairs

Progress = Callable[[str], None]
COLUMNS = ("c0", "c_prefill", "c_decode", "c_attn", "c_pf")
# Token ids drawn for random prompts: clear of SmolLM2's special tokens at the low end.
_TOKEN_RANGE = (1000, 40000)
# Decode points: this quantile of a run's steady gaps (the median would measure the load).
DECODE_QUANTILE = 0.25


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step (or the median of several alike) and what it computed."""

    kind: str  # "prefill" | "cached_prefill" | "decode"
    prefill_tokens: int
    decode_seqs: int
    context_tokens: int
    prefill_pairs: float
    seconds: float

    def features(self) -> list[float]:
        return [1.0, float(self.prefill_tokens), float(self.decode_seqs),
                float(self.context_tokens), self.prefill_pairs]


@dataclass(frozen=True, slots=True)
class Grid:
    prefill_lengths: tuple[int, ...]
    cached_prefill: tuple[tuple[int, int], ...]  # (cached prefix P, new tokens n)
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int
    repeats: int

    @classmethod
    def full(cls) -> Grid:
        return cls(prefill_lengths=(32, 128, 256, 512, 1024),
                   cached_prefill=((512, 128), (1024, 256)),
                   decode_batches=(1, 2, 4, 8), decode_contexts=(32, 256, 640),
                   decode_steps=20, repeats=3)

    @classmethod
    def quick(cls) -> Grid:
        return cls(prefill_lengths=(32, 256, 768), cached_prefill=((512, 128),),
                   decode_batches=(1, 4), decode_contexts=(32, 384),
                   decode_steps=12, repeats=1)


# --- fitting -------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """Lawson-Hanson non-negative least squares: argmin ||a·x - b|| subject to x >= 0."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-10 * max(1.0, float(np.abs(w).max(initial=0.0)))
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > tol * 1e-6
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def fit_constants(samples: Sequence[StepSample]) -> dict[str, float]:
    """Non-negative constants minimising the squared relative error of the samples."""
    if len(samples) < len(COLUMNS):
        raise ValueError(f"need at least {len(COLUMNS)} samples to fit, got {len(samples)}")
    x = np.array([s.features() for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    if (y <= 0).any():
        raise ValueError("every sample must have a positive duration")
    weighted = x / y[:, None]  # relative error: divide each row by its own time
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(weighted / scale, np.ones(len(y))) / scale
    return {k: float(v) for k, v in zip(COLUMNS, coef, strict=True)}


def relative_errors(model: CostModel, samples: Sequence[StepSample]) -> list[float]:
    return [
        model.step_time(s.prefill_tokens, s.decode_seqs, s.context_tokens, s.prefill_pairs)
        / s.seconds - 1.0
        for s in samples
    ]


def fit_cost_model(
    samples: Sequence[StepSample], name: str, source: str, defaults: dict[str, int] | None = None
) -> CostModel:
    return CostModel(name=name, source=source, defaults=dict(defaults or {}),
                     **fit_constants(samples))


# --- measuring -----------------------------------------------------------------------


class Probe:
    """Runs timed requests on a started vLLM ``AsyncLLM``."""

    def __init__(self, llm: Any, seed: int = 0) -> None:
        self._llm = llm
        self._rng = random.Random(seed)
        self._n = 0

    def tokens(self, n: int) -> list[int]:
        return [self._rng.randrange(*_TOKEN_RANGE) for _ in range(n)]

    async def run(self, prompt: list[int], max_tokens: int) -> list[float]:
        """Submit one request; the perf_counter time of each output token, after the start."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        self._n += 1
        start = time.perf_counter()
        times: list[float] = []
        async for out in self._llm.generate({"prompt_token_ids": prompt}, params,
                                            request_id=f"calib-{self._n}"):
            now = time.perf_counter() - start
            times.extend(now for _ in out.outputs[0].token_ids)
        return times

    async def reset(self) -> None:
        await self._llm.reset_prefix_cache()

    async def prefill(self, length: int, repeats: int) -> StepSample:
        ttfts = []
        for _ in range(repeats):
            await self.reset()
            ttfts.append((await self.run(self.tokens(length), 1))[0])
        return StepSample("prefill", length, 0, length, prefill_pairs(length, 0), min(ttfts))

    async def cached_prefill(self, cached: int, new: int, repeats: int) -> StepSample:
        ttfts = []
        for _ in range(repeats):
            await self.reset()
            prefix = self.tokens(cached)
            await self.run(prefix, 1)
            ttfts.append((await self.run(prefix + self.tokens(new), 1))[0])
        # vLLM caches whole blocks only; the cached prefixes used here are multiples of 128.
        return StepSample("cached_prefill", new, 0, cached + new, prefill_pairs(new, cached),
                          min(ttfts))

    async def decode(self, batch: int, context: int, steps: int) -> StepSample | None:
        await self.reset()
        runs = await asyncio.gather(*(self.run(self.tokens(context), steps)
                                      for _ in range(batch)))
        return decode_sample(runs, batch, context)


def decode_sample(
    runs: Sequence[Sequence[float]], batch: int, context: int, quantile: float = DECODE_QUANTILE
) -> StepSample | None:
    """A pure-decode step of a batch run: the ``quantile`` of the gaps after the last first
    token, before the first request finishes, of the request that started last."""
    all_started = max(r[0] for r in runs)
    first_done = min(r[-1] for r in runs)
    last = max(runs, key=lambda r: r[0])
    gaps: list[tuple[float, int]] = []
    for a, b in itertools.pairwise(last):
        if a >= all_started and b <= first_done and b > a:
            ctx = sum(context + sum(1 for t in r if t <= a) for r in runs)
            gaps.append((b - a, ctx))
    if len(gaps) < 3:
        return None
    gaps.sort()
    seconds, ctx = gaps[min(len(gaps) - 1, int(quantile * len(gaps)))]
    return StepSample("decode", 0, batch, ctx, 0.0, seconds)


async def measure(llm: Any, grid: Grid, progress: Progress) -> list[StepSample]:
    probe = Probe(llm)
    await probe.run(probe.tokens(64), 4)  # warm-up: first calls allocate and JIT
    samples: list[StepSample] = []
    for n in grid.prefill_lengths:
        s = await probe.prefill(n, grid.repeats)
        samples.append(s)
        progress(f"prefill {n:5d} tokens: {s.seconds * 1e3:8.1f} ms")
    for p, n in grid.cached_prefill:
        s = await probe.cached_prefill(p, n, grid.repeats)
        samples.append(s)
        progress(f"prefill {n:5d} tokens after {p} cached: {s.seconds * 1e3:8.1f} ms")
    for c in grid.decode_contexts:
        for b in grid.decode_batches:
            d = await probe.decode(b, c, grid.decode_steps)
            if d is None:
                progress(f"decode batch {b:3d} context {c:5d}: too few steady steps, skipped")
                continue
            samples.append(d)
            progress(f"decode batch {b:3d} context {c:5d}: {d.seconds * 1e3:8.1f} ms/step")
    return samples


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model_dir: str
    kv_cache_bytes: int = 1 << 30
    block_size: int = 128
    max_model_len: int = 2048
    dtype: str = "float32"
    max_num_seqs: int = 32
    cuda_graphs: bool = False  # GPU only; eager steps cost more per step than graphed ones
    load_format: str = "auto"  # "dummy" times a model's shape from its config.json alone


async def calibrate(
    settings: EngineSettings, grid: Grid, name: str, progress: Progress
) -> tuple[CostModel, list[StepSample]]:
    from daemon.engines.vllm.engine import VllmEngine

    engine = VllmEngine(settings.model_dir, kv_cache_bytes=settings.kv_cache_bytes,
                        block_size=settings.block_size, max_model_len=settings.max_model_len,
                        dtype=settings.dtype, max_num_seqs=settings.max_num_seqs,
                        enforce_eager=not settings.cuda_graphs,
                        load_format=settings.load_format)
    progress(f"starting vLLM on {settings.model_dir} ({settings.dtype})")
    await engine.start()
    try:
        llm = engine._require()
        samples = await measure(llm, grid, progress)
        capacity = engine.kv_capacity_tokens
        batched = int(llm.vllm_config.scheduler_config.max_num_batched_tokens)
    finally:
        await engine.shutdown()
    source = (f"agentd calibrate --engine vllm --model {settings.model_dir}"
              f"{' --quick' if grid.repeats == 1 else ''}; "
              f"{datetime.now(UTC):%Y-%m-%d}; {platform.node()} ({platform.machine()}, "
              f"{_cpu_name()}), vLLM on {_accelerator()}, {settings.dtype}, "
              f"{'CUDA graphs' if settings.cuda_graphs else 'eager'}, "
              f"{'random weights, ' if settings.load_format == 'dummy' else ''}"
              f"block {settings.block_size}; "
              f"{len(samples)} grid points")
    defaults = {"kv_capacity_tokens": capacity, "block_size": settings.block_size,
                "max_batch": settings.max_num_seqs, "max_batched_tokens": batched}
    model = fit_cost_model(samples, name, source, defaults)
    return replace(model, source=f"{source}; {fit_quality(model, samples)}"), samples


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _accelerator() -> str:
    """The GPU vLLM ran on, or "CPU"; read after the engine started, so torch is loaded."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a name for a log line; never worth failing a fit
        pass
    return "CPU"


def fit_quality(model: CostModel, samples: Sequence[StepSample]) -> str:
    errs = [abs(e) for e in relative_errors(model, samples)]
    return (f"fit: mean |relative error| {statistics.fmean(errs):.1%}, "
            f"worst {max(errs):.1%} over {len(errs)} points")


def report(model: CostModel, samples: Sequence[StepSample], progress: Progress) -> None:
    for k in COLUMNS:
        progress(f"{k:10s} = {getattr(model, k):.4g}")
    progress(fit_quality(model, samples))


# --- CLI -----------------------------------------------------------------------------


def add_calibrate_parser(subparsers: Any) -> None:
    c = subparsers.add_parser("calibrate",
                              help="fit the sim engine's cost model to a real vLLM worker")
    c.add_argument("--engine", choices=["vllm"], default="vllm")
    c.add_argument("--model", help="model dir (default: the SmolLM2 dir of `agentd model`)")
    c.add_argument("--out", help="JSON file to write (default: <model name>.json)")
    c.add_argument("--name", help="cost model name (default: from the model dir)")
    c.add_argument("--quick", action="store_true", help="a small grid (about a minute)")
    c.add_argument("--kv-cache-bytes", type=int, default=1 << 30)
    c.add_argument("--dtype", default="float32")
    c.add_argument("--cuda-graphs", action="store_true",
                   help="GPU only: capture CUDA graphs, as a worker with vllm_cuda_graphs does")
    c.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights, so a model directory needs only config.json and"
                        " tokenizer files (times a model whose weights are not here)")
    c.set_defaults(func=cmd_calibrate)


def settings_from_args(args: argparse.Namespace) -> EngineSettings:
    model_dir = args.model
    if not model_dir:
        from daemon.models.smollm2 import DEFAULT_SMOLLM2_DIR

        model_dir = str(DEFAULT_SMOLLM2_DIR)
    if not Path(model_dir).is_dir():
        raise FileNotFoundError(2, "no model directory", model_dir)
    return EngineSettings(model_dir, kv_cache_bytes=args.kv_cache_bytes, dtype=args.dtype,
                          cuda_graphs=args.cuda_graphs, load_format=args.load_format)


def cmd_calibrate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    name = args.name or Path(settings.model_dir).name.lower()
    out = Path(args.out or f"{name}.json")
    grid = Grid.quick() if args.quick else Grid.full()

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    model, samples = asyncio.run(calibrate(settings, grid, name, progress))
    report(model, samples, progress)
    model.save(out)
    progress(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentd")
    add_calibrate_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["calibrate", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
