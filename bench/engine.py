"""Engine benchmark on the real vLLM worker (wall clock; CPU, or a GPU with `--dtype bfloat16
--cuda-graphs` as bench/gpu.sh runs it).

(a) Gateway overhead: one stream of short streamed chat requests sent to vLLM's own OpenAI
    server and then through agentd to its vLLM worker (same model, dtype, KV cache, block size,
    eager or CUDA graphs): throughput ratio, added p50/p99 latency and time to first token per
    request, and the ratio of time per output token.
(b) Simulator fidelity: a slice of the Azure 2023 conversation trace (lengths scaled down,
    arrivals stretched, a few shared system prefixes so the prefix cache matters) replayed on
    the real worker through agentd and on the simulated engine with the calibrated cost model
    in virtual time; relative error of mean TTFT, mean TPOT, throughput and prefix-hit rate.
    The sim gets the same prompt token ids, arrival times and the output lengths the real
    model produced (it cannot know where SmolLM2 samples EOS).

`python -m bench.engine [--quick]` writes `results/engine.json` and `results/engine.png`.
The two servers are up together and take the gateway stream in alternating rounds; another
load on the machine still shows up as noise in every number here.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import RESULTS, TRACES, log, save
from daemon.engines.sim import (
    SchedulerConfig,
    SimRequest,
    SimScheduler,
    VirtualClock,
    VirtualDriver,
    load_cost_model,
)
from tests.daemon_process import DaemonProcess, free_port

MODEL_DIR = Path.home() / ".cache/agentd/models/SmolLM2-135M-Instruct"
KV_CACHE_BYTES = 256 * 1024 * 1024
MAX_MODEL_LEN = 2048
BLOCK_SIZE = 128
TRACE = TRACES / "azure2023_AzureLLMInferenceTrace_conv.csv"
_WORDS = ["river", "stone", "cloud", "garden", "paper", "window", "engine", "silver",
          "market", "forest", "letter", "bridge", "candle", "planet", "harbor", "winter",
          "violet", "number", "orange", "pocket"]


# --- (a) gateway overhead ------------------------------------------------------------


@dataclass
class StreamResult:
    target: str
    requests: int
    wall_s: float
    output_tokens: int
    latencies_s: list[float] = field(repr=False)
    ttfts_s: list[float] = field(default_factory=list, repr=False)
    tpots_s: list[float] = field(default_factory=list, repr=False)  # one per request, >1 token

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.wall_s

    def pct(self, q: float, xs: list[float] | None = None) -> float:
        xs = sorted(self.latencies_s if xs is None else xs)
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else 0.0

    def extend(self, other: StreamResult) -> None:
        self.requests += other.requests
        self.wall_s += other.wall_s
        self.output_tokens += other.output_tokens
        self.latencies_s.extend(other.latencies_s)
        self.ttfts_s.extend(other.ttfts_s)
        self.tpots_s.extend(other.tpots_s)

    def summary(self) -> dict[str, Any]:
        return {"target": self.target, "requests": self.requests, "wall_s": self.wall_s,
                "throughput_rps": self.throughput_rps, "output_tokens": self.output_tokens,
                "p50_s": self.pct(0.5), "p99_s": self.pct(0.99),
                "mean_s": statistics.fmean(self.latencies_s),
                "ttft_p50_s": self.pct(0.5, self.ttfts_s),
                "tpot_mean_s": statistics.fmean(self.tpots_s) if self.tpots_s else 0.0,
                "tpot_p50_s": self.pct(0.5, self.tpots_s)}


def chat_prompts(n: int) -> list[str]:
    return [f"Question {i}: what is {i % 7 + 2} times {i % 5 + 3}? Answer briefly."
            for i in range(n)]


async def run_stream(target: str, url: str, headers: dict[str, str], model: str,
                     prompts: list[str], concurrency: int, max_tokens: int) -> StreamResult:
    """Streamed chat requests, so each one also gives its time to first token and its time
    per output token after that (TPOT: from the first to the last content chunk)."""
    queue = list(reversed(prompts))
    result = StreamResult(target, len(prompts), 0.0, 0, [])

    async def one(client: httpx.AsyncClient, prompt: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        first = last = 0.0
        tokens = 0
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                 headers=headers) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    last = time.perf_counter()
                    first = first or last
        result.latencies_s.append(time.perf_counter() - t0)
        result.output_tokens += tokens
        if first:
            result.ttfts_s.append(first - t0)
            if tokens > 1:
                result.tpots_s.append((last - first) / (tokens - 1))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await one(client, queue.pop())

    async with httpx.AsyncClient(timeout=300) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


Target = tuple[str, str, dict[str, str], str]  # name, base url, headers, model


async def interleaved(targets: list[Target], prompts: list[str], args: argparse.Namespace
                      ) -> list[StreamResult]:
    """The same stream on each target, in alternating rounds, so that a load that changes
    over the run lands on both alike (both servers are up; the idle one does not compute)."""
    for name, url, headers, model in targets:
        await run_stream("warmup", url, headers, model, prompts[:4], 4, 4)
        log(f"  warmed up {name}")
    per_round = max(1, len(prompts) // args.rounds)
    chunks = [prompts[i:i + per_round] for i in range(0, len(prompts), per_round)]
    merged = [StreamResult(t[0], 0, 0.0, 0, []) for t in targets]
    for chunk in chunks:
        for acc, (name, url, headers, model) in zip(merged, targets, strict=True):
            acc.extend(await run_stream(name, url, headers, model, chunk, args.concurrency,
                                        args.max_tokens))
    return merged


class VllmServer:
    """vLLM's own OpenAI server on the same model and engine settings as agentd's worker."""

    def __init__(self, model_dir: Path, log_path: Path, dtype: str, cuda_graphs: bool) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model_dir.name
        self._cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                     "--model", str(model_dir), "--served-model-name", self.model,
                     "--dtype", dtype, "--block-size", str(BLOCK_SIZE),
                     "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
                     "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "64",
                     "--port", str(self.port), "--disable-log-stats"]
        if not cuda_graphs:
            self._cmd.append("--enforce-eager")
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 240.0) -> None:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        with open(self._log_path, "wb") as out:
            self._proc = subprocess.Popen(self._cmd, stdout=out, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited: {self._log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM server not ready after {timeout}s")

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(5)


def overhead_summary(direct: StreamResult, gateway: StreamResult) -> dict[str, Any]:
    d, g = direct.summary(), gateway.summary()
    return {
        "direct": d, "agentd": g,
        "throughput_ratio": gateway.throughput_rps / direct.throughput_rps,
        "added_p50_ms": (gateway.pct(0.5) - direct.pct(0.5)) * 1e3,
        "added_p99_ms": (gateway.pct(0.99) - direct.pct(0.99)) * 1e3,
        "added_ttft_p50_ms": (g["ttft_p50_s"] - d["ttft_p50_s"]) * 1e3,
        "tpot_ratio": g["tpot_mean_s"] / d["tpot_mean_s"] if d["tpot_mean_s"] else 0.0,
        "targets": {"throughput_ratio": ">= 0.97", "added_p50_ms": "<= 2 (CPU)",
                    "tpot_ratio": "<= 1.01 (GPU)"},
    }


# --- (b) simulator fidelity ----------------------------------------------------------


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt: str
    prompt_token_ids: list[int]
    max_tokens: int


def trace_slice(path: Path, start: int, n: int) -> list[tuple[float, int, int]]:
    """(arrival offset s, context tokens, generated tokens) of ``n`` rows from ``start``."""
    rows: list[tuple[float, int, int]] = []
    with path.open() as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i < start:
                continue
            if len(rows) == n:
                break
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            rows.append((ts, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def text_of(tok: Any, rng: random.Random, n_tokens: int) -> str:
    words = " ".join(rng.choice(_WORDS) + str(rng.randrange(100)) for _ in range(n_tokens))
    return str(tok.decode(tok.encode(words, add_special_tokens=False)[:n_tokens]))


def build_workload(tok: Any, rows: list[tuple[float, int, int]], args: argparse.Namespace
                   ) -> list[TraceRequest]:
    rng = random.Random(11)
    prefixes = [f"System {k}: " + text_of(tok, rng, args.prefix_tokens) + "\n"
                for k in range(args.prefixes)]
    span = max(rows[-1][0], 1e-9)
    out = []
    for i, (t, ctx, gen) in enumerate(rows):
        tail_len = max(16, min(args.max_tail, round(ctx * args.length_scale)))
        prompt = prefixes[i % args.prefixes] + f"User {i}: " + text_of(tok, rng, tail_len)
        ids = list(tok.encode(prompt))  # as the worker tokenizes a completion prompt
        out_len = max(4, min(args.max_out, round(gen * args.length_scale)))
        out.append(TraceRequest(t / span * args.span_s, prompt, ids, out_len))
    return out


@dataclass
class Timing:
    arrival: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    first: float | None = None
    last: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.last is None or self.output_tokens < 2:
            return None
        return (self.last - self.first) / (self.output_tokens - 1)


async def replay_real(d: DaemonProcess, model: str, work: list[TraceRequest]) -> list[Timing]:
    timings = [Timing(arrival=w.arrival_s) for w in work]

    async def one(client: httpx.AsyncClient, w: TraceRequest, t: Timing, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + w.arrival_s - time.perf_counter()))
        body = {"model": model, "prompt": w.prompt, "max_tokens": w.max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", f"{d.url}/v1/completions", json=body,
                                 headers=d.auth_headers()) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter() - t0
                if chunk.get("usage"):
                    u = chunk["usage"]
                    t.prompt_tokens, t.output_tokens = u["prompt_tokens"], u["completion_tokens"]
                    t.cached_tokens = (u.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0)
                elif chunk["choices"] and chunk["choices"][0].get("text"):
                    t.first = now if t.first is None else t.first
                    t.last = now

    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, w, t, t0) for w, t in zip(work, timings,
                                                                       strict=True)))
    return timings


def replay_sim(work: list[TraceRequest], real: list[Timing], worker: dict[str, Any],
               cost_model: str) -> list[Timing]:
    cfg = SchedulerConfig.from_capacity(
        int(worker["kv_capacity_tokens"]), block_size=int(worker["block_size"]),
        max_num_seqs=int(worker["max_batch"]), max_num_batched_tokens=2048,
        max_model_len=MAX_MODEL_LEN)
    drv = VirtualDriver(SimScheduler(cfg, load_cost_model(cost_model)), VirtualClock())
    for i, (w, r) in enumerate(zip(work, real, strict=True)):
        drv.run_until(w.arrival_s)
        drv.submit(SimRequest(request_id=f"r{i}", prompt_token_ids=w.prompt_token_ids,
                              max_tokens=max(1, r.output_tokens)))
    drv.run_until_idle()
    out = []
    for i, w in enumerate(work):
        s = drv.timings[f"r{i}"]
        out.append(Timing(arrival=w.arrival_s, prompt_tokens=s.prompt_tokens,
                          cached_tokens=s.cached_tokens, output_tokens=s.output_tokens,
                          first=s.first_token, last=s.finish))
    return out


def metrics(ts: list[Timing]) -> dict[str, float]:
    ttfts = [t.ttft for t in ts if t.ttft is not None]
    tpots = [t.tpot for t in ts if t.tpot is not None]
    end = max(t.last for t in ts if t.last is not None)
    start = min(t.arrival for t in ts)
    return {
        "mean_ttft_s": statistics.fmean(ttfts), "mean_tpot_s": statistics.fmean(tpots),
        "throughput_tok_s": sum(t.output_tokens for t in ts) / (end - start),
        "prefix_hit_rate": sum(t.cached_tokens for t in ts) / sum(t.prompt_tokens for t in ts),
        "makespan_s": end - start,
    }


def fidelity_summary(real: list[Timing], sim: list[Timing]) -> dict[str, Any]:
    mr, ms = metrics(real), metrics(sim)
    err = {k: ms[k] / mr[k] - 1.0 if mr[k] else (0.0 if ms[k] == 0 else float("inf"))
           for k in ("mean_ttft_s", "mean_tpot_s", "throughput_tok_s", "prefix_hit_rate")}
    return {"real": mr, "sim": ms, "relative_error": err, "target": "|error| <= 0.10",
            "within_target": {k: abs(v) <= 0.10 for k, v in err.items()},
            "per_request": [{"real": asdict(a), "sim": asdict(b)}
                            for a, b in zip(real, sim, strict=True)]}


# --- main ----------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", type=Path, default=MODEL_DIR)
    p.add_argument("--cost-model", default="smollm2-135m-cpu")
    p.add_argument("--dtype", default="float32", help="both servers (bfloat16 on a GPU)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="GPU: both servers capture CUDA graphs instead of running eagerly")
    p.add_argument("--gateway-requests", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5, help="gateway stream split into rounds")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--trace-start", type=int, default=0)
    p.add_argument("--trace-requests", type=int, default=30)
    p.add_argument("--span-s", type=float, default=90.0, help="arrivals stretched to this")
    p.add_argument("--length-scale", type=float, default=0.125)
    p.add_argument("--max-tail", type=int, default=256)
    p.add_argument("--max-out", type=int, default=24)
    p.add_argument("--prefixes", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=256)
    a = p.parse_args(argv)
    if a.quick:
        a.gateway_requests, a.trace_requests, a.span_s = 12, 12, 30.0
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.model))
    work = build_workload(tok, trace_slice(TRACE, args.trace_start, args.trace_requests), args)
    prompts = chat_prompts(args.gateway_requests)
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    started = time.perf_counter()

    log("(a) starting vLLM's own OpenAI server and agentd -> vLLM worker")
    server = VllmServer(args.model, tmp / "vllm-server.log", args.dtype, args.cuda_graphs)
    env = {"AGENTD_VLLM_KV_CACHE_BYTES": str(KV_CACHE_BYTES),
           "AGENTD_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN), "AGENTD_VLLM_DTYPE": args.dtype,
           "AGENTD_VLLM_CUDA_GRAPHS": "1" if args.cuda_graphs else "0"}
    d = DaemonProcess(tmp / "agentd", engine="vllm", extra_args=["--model", str(args.model)],
                      env=env)
    try:
        server.start()
        d.start(timeout=240)
        worker = d.get("/v1/workers").json()["data"][0]
        model = worker["model"]
        targets = [("vllm", server.url, {}, server.model),
                   ("agentd", d.url, d.auth_headers(), model)]
        direct, gateway = asyncio.run(interleaved(targets, prompts, args))
        server.stop()
        log(f"  {direct.summary()}\n  {gateway.summary()}")
        log(f"(b) trace replay on the real worker: {len(work)} requests over {args.span_s}s")
        real = asyncio.run(replay_real(d, model, work))
    finally:
        server.stop()
        d.stop()
    sim = replay_sim(work, real, worker, args.cost_model)
    mismatched = sum(1 for w, r in zip(work, real, strict=True)
                     if len(w.prompt_token_ids) != r.prompt_tokens)
    result = {"gateway_overhead": overhead_summary(direct, gateway),
              "sim_fidelity": fidelity_summary(real, sim)}
    result["sim_fidelity"]["prompt_token_mismatches"] = mismatched
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    params.update(simulated=False, machine=os.uname().nodename, cpus=os.cpu_count(),
                  kv_cache_bytes=KV_CACHE_BYTES, block_size=BLOCK_SIZE,
                  worker=worker, wall_s=time.perf_counter() - started)
    path = save("engine", params, [result])
    plot(result, RESULTS / "engine.png")
    report(result)
    log(f"wrote {path} and {RESULTS / 'engine.png'} in {params['wall_s']:.0f}s")
    return 0


def report(result: dict[str, Any]) -> None:
    g, f = result["gateway_overhead"], result["sim_fidelity"]
    log(f"gateway: throughput ratio {g['throughput_ratio']:.3f}, added p50 "
        f"{g['added_p50_ms']:+.1f} ms, added p99 {g['added_p99_ms']:+.1f} ms, added TTFT p50 "
        f"{g['added_ttft_p50_ms']:+.1f} ms, TPOT ratio {g['tpot_ratio']:.3f} "
        f"({g['agentd']['tpot_mean_s'] * 1e3:.2f} vs {g['direct']['tpot_mean_s'] * 1e3:.2f} ms)")
    for k, e in f["relative_error"].items():
        log(f"fidelity {k:18s} real {f['real'][k]:9.4f} sim {f['sim'][k]:9.4f} error {e:+.1%}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g, f = result["gateway_overhead"], result["sim_fidelity"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["p50", "p99", "mean"]
    for off, key in ((-0.2, "direct"), (0.2, "agentd")):
        vals = [g[key]["p50_s"], g[key]["p99_s"], g[key]["mean_s"]]
        ax1.bar([i + off for i in range(3)], vals, width=0.4, label=key)
    ax1.set_xticks(range(3), names)
    ax1.set_ylabel("request latency (s)")
    ax1.set_title(f"gateway overhead (throughput ratio {g['throughput_ratio']:.3f})")
    ax1.legend()
    keys = list(f["relative_error"])
    for off, side in ((-0.2, "real"), (0.2, "sim")):
        vals = [f[side][k] / f["real"][k] if f["real"][k] else 0.0 for k in keys]
        ax2.bar([i + off for i in range(len(keys))], vals, width=0.4, label=side)
    ax2.axhspan(0.9, 1.1, color="green", alpha=0.1)
    ax2.set_xticks(range(len(keys)), [k.replace("_", "\n") for k in keys], fontsize=8)
    ax2.set_ylabel("relative to real")
    ax2.set_title("simulator fidelity (real worker = 1)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
