"""agentd on the real engine: closed-loop agent programs through a real daemon on a real vLLM
CPU worker, KV policies side by side in alternating rounds, and the same workload replayed in
virtual time on the calibrated SmolLM2 cost model beside it (issue 23 item 5).

The workload is shaped like the mini-swe-agent dev trace (/work/shared/traces, its first
sessions): each agent is one session's first steps, with its prompt growth, output lengths and
tool times scaled to SmolLM2's context and this machine (`--context-scale`, `--output-scale`,
`--tool-scale`). Every agent is a loop of the `openai` client against the daemon's chat
endpoint with a `program_id`, as a framework would run it: its system prompt, then per step
the model's reply and an observation of the step's new tokens, then its tool time.

One daemon, one vLLM worker whose KV cache (`--kv-tokens`) is small enough that the agents'
contexts together overflow it. Each round runs every policy once, in a rotated order, with the
policy swapped live (`POST /v1/policies/{name}/activate`); each phase's agents carry prompts of
their own, so no phase hits another's blocks. Per phase: steps/min, program and step latency
p50/p99, prefix hits and recomputed prompt tokens from vLLM's own counters (the worker's
reported prefix-cache queries and hits). Ratios are taken per round (same machine state) and
then averaged: the machine is shared and noisy, so its absolute times mean little.

The simulator column replays each phase's own realised steps (the prompt and output tokens
vLLM counted, the same tool times) through `agentd replay`'s virtual daemon with the same
policy, KV size and block size; its error is (simulated - measured) / measured.

    python -m bench.agentic_real [--rounds 3] [--agents 12] [--steps 6] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.common import TRACES, Stopwatch, log, save, words
from daemon import config as config_mod
from daemon.models.smollm2 import DEFAULT_SMOLLM2_DIR, DTYPE_BYTES, kv_bytes_per_token
from daemon.replay.traces import load_miniswe
from daemon.replay.virtual import Hardware, Workload, replay
from daemon.replay.workload import ProgramSpec, StepSpec
from tests.daemon_process import DaemonProcess

TRACE = TRACES / "miniswe_gemini3pro_swebv_steps_dev.csv"
POLICIES = ("vllm-default", "continuum-ttl", "agentd")
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class Step:
    observation_tokens: int  # new prompt tokens before this step (beyond the last reply)
    output_tokens: int
    tool_s: float  # the tool's time before this step


@dataclass(frozen=True)
class Agent:
    session: str
    system_tokens: int
    steps: tuple[Step, ...]


def agents_from_trace(specs: list[ProgramSpec], n: int, steps: int, context_scale: float,
                      output_scale: float, tool_scale: float) -> list[Agent]:
    """The first `n` sessions with at least `steps` steps, scaled."""
    out = []
    for spec in specs:
        if len(spec.steps) < steps:
            continue
        chosen = spec.steps[:steps]
        first = chosen[0]
        out.append(Agent(spec.meta.get("session", spec.program_id),
                         max(32, round(first.prompt_tokens * context_scale)),
                         tuple(_scaled(s, i, context_scale, output_scale, tool_scale)
                               for i, s in enumerate(chosen))))
        if len(out) == n:
            break
    if len(out) < n:
        raise SystemExit(f"the trace has only {len(out)} sessions with {steps} steps")
    return out


def _scaled(s: StepSpec, index: int, context_scale: float, output_scale: float,
            tool_scale: float) -> Step:
    new = 0 if index == 0 else max(8, round(max(0, s.new_tokens - s.output_tokens)
                                            * context_scale))
    return Step(new, min(96, max(4, round(s.output_tokens * output_scale))),
                min(5.0, s.tool_s * tool_scale))


@dataclass
class Phase:
    policy: str
    round: int
    wall_s: float = 0.0
    steps: int = 0
    step_latency_s: list[float] = field(default_factory=list)
    program_latency_s: list[float] = field(default_factory=list)
    prompt_queries: int = 0
    prompt_hits: int = 0
    failed: int = 0
    # What vLLM counted per agent and step: (prompt, output, tool_s), for the simulator.
    realised: list[list[tuple[int, int, float]]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        def pct(xs: list[float], q: int) -> float | None:
            return round(statistics.quantiles(xs, n=100)[q - 1], 3) if len(xs) > 1 else None

        return {
            "policy": self.policy, "round": self.round, "wall_s": round(self.wall_s, 2),
            "steps": self.steps, "failed": self.failed,
            "steps_per_min": round(60 * self.steps / self.wall_s, 2) if self.wall_s else 0.0,
            "step_latency_s": {"p50": pct(self.step_latency_s, 50),
                               "p99": pct(self.step_latency_s, 99)},
            "program_latency_s": {"p50": pct(self.program_latency_s, 50),
                                  "p99": pct(self.program_latency_s, 99)},
            "prefix_hit_rate": round(self.prompt_hits / self.prompt_queries, 4)
            if self.prompt_queries else 0.0,
            "recomputed_prompt_tokens": self.prompt_queries - self.prompt_hits,
        }


async def run_agent(client: openai.AsyncOpenAI, model: str, agent: Agent, tag: str,
                    phase: Phase) -> None:
    rng = random.Random(tag)
    pid = f"{tag}-{agent.session}"[:120]
    history: list[dict[str, str]] = [
        {"role": "system", "content": f"You are agent {tag}. " + words(rng, agent.system_tokens)},
        {"role": "user", "content": "Fix the failing test."}]
    realised: list[tuple[int, int, float]] = []
    started = time.perf_counter()
    for i, step in enumerate(agent.steps):
        if i:
            await asyncio.sleep(step.tool_s)  # the tool's own time: load, not a wait
            history.append({"role": "user", "content": words(rng, step.observation_tokens)})
        sent = time.perf_counter()
        try:
            resp = await client.chat.completions.create(
                model=model, messages=history, max_tokens=step.output_tokens,  # type: ignore[arg-type]
                temperature=0.7, seed=rng.randrange(1 << 30),
                extra_body={"program_id": pid, "session_id": pid})
        except openai.APIError as exc:
            log(f"  {pid} step {i}: {exc}")
            phase.failed += 1
            return
        phase.step_latency_s.append(time.perf_counter() - sent)
        phase.steps += 1
        usage = resp.usage
        realised.append((usage.prompt_tokens if usage else 0,
                         usage.completion_tokens if usage else 0, step.tool_s if i else 0.0))
        history.append({"role": "assistant", "content": resp.choices[0].message.content or ""})
    phase.program_latency_s.append(time.perf_counter() - started)
    phase.realised.append(realised)
    await client.post(f"/programs/{pid}/release", cast_to=httpx.Response)


def worker_counters(d: DaemonProcess) -> tuple[int, int, int]:
    """(queries, hits, steps) of the worker's prefix cache once it is idle and its counters
    stopped moving (they are cumulative)."""
    last: tuple[int, int, int] | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        [w] = [w for w in d.get("/v1/workers").json()["data"] if w["status"] == "healthy"]
        st = w["stats"]
        now = (int(st["prefix_cache_queries"]), int(st["prefix_cache_hits"]), int(st["steps"]))
        if now == last and st["running"] == 0 and st["waiting"] == 0:
            return now
        last = now
        time.sleep(1.0)
    raise RuntimeError(f"the worker's counters did not settle: {last}")


def run_phase(d: DaemonProcess, agents: list[Agent], policy: str, rnd: int) -> Phase:
    r = d.post(f"/v1/policies/{policy}/activate")
    if r.status_code != 200:
        raise RuntimeError(f"activating {policy}: {r.status_code} {r.text}")
    phase = Phase(policy, rnd)
    q0, h0, _ = worker_counters(d)

    async def go() -> None:
        client = openai.AsyncOpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                                    timeout=900)
        model = (await client.models.list()).data[0].id
        tag = f"r{rnd}-{policy}"
        await asyncio.gather(*(run_agent(client, model, a, f"{tag}-{n}", phase)
                               for n, a in enumerate(agents)))
        await client.close()

    started = time.perf_counter()
    asyncio.run(go())
    phase.wall_s = time.perf_counter() - started
    q1, h1, _ = worker_counters(d)
    phase.prompt_queries, phase.prompt_hits = q1 - q0, h1 - h0
    return phase


def simulate(phase: Phase, kv_tokens: int) -> dict[str, Any]:
    """The phase's realised steps through the virtual daemon with the same policy."""
    specs = []
    for n, steps in enumerate(phase.realised):
        out: list[StepSpec] = []
        context = 0
        for prompt, output, tool_s in steps:
            new = prompt if not out else max(1, prompt - context)
            out.append(StepSpec(prompt, max(1, output), min(new, prompt), tool_s))
            context = prompt + output
        specs.append(ProgramSpec(f"a{n}", 0.0, tuple(out)))
    cfg = config_mod.load(flags={"kv_policy": phase.policy}, env={})
    hw = Hardware(workers=1, kv_tokens=kv_tokens, cost_model="smollm2-135m-cpu",
                  max_num_seqs=32, max_batched_tokens=MAX_MODEL_LEN, block_size=BLOCK_SIZE)
    return replay(specs, cfg, hw, Workload(concurrency=len(specs)))


def summarise(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> dict[str, Any]:
    """Per policy: means over rounds; ratios against vllm-default and the best other policy,
    taken per round and then averaged (mean and worst)."""
    by = {p: [r for r in rows if r["policy"] == p] for p in policies}
    rounds = sorted({r["round"] for r in rows})
    out: dict[str, Any] = {}
    for p, rs in by.items():
        def mean(get: Any, rs: list[dict[str, Any]] = rs) -> float | None:
            xs = [v for r in rs if (v := get(r)) is not None]
            return round(statistics.fmean(xs), 3) if xs else None

        entry: dict[str, Any] = {
            "steps_per_min": mean(lambda r: r["steps_per_min"]),
            "step_p99_s": mean(lambda r: r["step_latency_s"]["p99"]),
            "program_p50_s": mean(lambda r: r["program_latency_s"]["p50"]),
            "program_p99_s": mean(lambda r: r["program_latency_s"]["p99"]),
            "prefix_hit_rate": mean(lambda r: r["prefix_hit_rate"]),
            "recomputed_prompt_tokens": mean(lambda r: r["recomputed_prompt_tokens"]),
            "sim_steps_per_min": mean(lambda r: r.get("sim", {}).get("steps_per_min")),
            "sim_error": mean(lambda r: r.get("sim", {}).get("error")),
        }
        vs_default, vs_best = [], []
        for rnd in rounds:
            per = {r["policy"]: r["steps_per_min"] for r in rows if r["round"] == rnd}
            if p not in per or not per.get("vllm-default"):
                continue
            vs_default.append(per[p] / per["vllm-default"])
            others = [v for q, v in per.items() if q != p]
            if others and max(others):
                vs_best.append(per[p] / max(others))
        entry["vs_vllm_default"] = {"mean": round(statistics.fmean(vs_default), 3),
                                    "worst": round(min(vs_default), 3)} if vs_default else None
        entry["vs_best_other"] = {"mean": round(statistics.fmean(vs_best), 3),
                                  "worst": round(min(vs_best), 3)} if vs_best else None
        out[p] = entry
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("steps_per_min", "steps/min (real)"), ("program_p99_s", "program p99 (s)"),
              ("prefix_hit_rate", "prefix hit rate (vLLM)"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.bar(names, [summary[n][key] or 0 for n in names], color="#4c72b0")
        if key == "steps_per_min":
            ax.scatter(names, [summary[n]["sim_steps_per_min"] or 0 for n in names],
                       color="#dd8452", zorder=3, label="simulated")
            ax.legend()
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle("agentd on a real vLLM CPU worker (SmolLM2-135M), mean over rounds")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--agents", type=int, default=12)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--kv-tokens", type=int, default=4352)
    p.add_argument("--context-scale", type=float, default=0.15)
    p.add_argument("--output-scale", type=float, default=0.4)
    p.add_argument("--tool-scale", type=float, default=0.25)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--model", default=str(DEFAULT_SMOLLM2_DIR))
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPE_BYTES),
                   help="the worker's dtype (float32 on CPU; bfloat16 on a GPU)")
    p.add_argument("--offload-bytes", type=int, default=0,
                   help="GPU builds: host memory for evicted KV blocks (vllm_kv_offload_bytes)")
    p.add_argument("--suffix", default="", help="appended to the results' file name")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 round, 4 agents x 3 steps")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.agents, args.steps = 1, 4, 3
    policies = tuple(x.strip() for x in args.policies.split(","))
    agents = agents_from_trace(load_miniswe(TRACE), args.agents, args.steps,
                               args.context_scale, args.output_scale, args.tool_scale)
    longest = max(a.system_tokens + sum(s.observation_tokens + s.output_tokens for s in a.steps)
                  for a in agents)
    log(f"[bench-agentic-real] {len(agents)} agents x {args.steps} steps from {TRACE.name}; "
        f"longest context ~{longest} tokens, KV {args.kv_tokens} tokens")
    clock = Stopwatch()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agentd-bench-real-") as tmp:
        d = DaemonProcess(
            data_dir=Path(tmp) / "data", engine="vllm", extra_args=["--model", args.model],
            env={"AGENTD_VLLM_KV_CACHE_BYTES": str(
                     args.kv_tokens * kv_bytes_per_token(args.dtype)),
                 "AGENTD_VLLM_DTYPE": args.dtype,
                 "AGENTD_VLLM_KV_OFFLOAD_BYTES": str(args.offload_bytes),
                 "AGENTD_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
                 "AGENTD_VLLM_BLOCK_SIZE": str(BLOCK_SIZE), "AGENTD_LOG_LEVEL": "warning"},
        ).start(timeout=600)
        try:
            [w] = [w for w in d.get("/v1/workers").json()["data"] if w["status"] == "healthy"]
            kv_tokens = int(w["kv_capacity_tokens"])
            for rnd in range(args.rounds):
                order = policies[rnd % len(policies):] + policies[:rnd % len(policies)]
                for policy in order:
                    phase = run_phase(d, agents, policy, rnd)
                    row = phase.row()
                    sim = simulate(phase, kv_tokens)
                    measured = row["steps_per_min"]
                    row["sim"] = {"steps_per_min": sim["throughput_steps_per_min"],
                                  "prefix_hit_rate": sim["prefix_hit_rate"],
                                  "error": round((sim["throughput_steps_per_min"] - measured)
                                                 / measured, 3) if measured else None}
                    rows.append(row)
                    log(f"[bench-agentic-real {clock.elapsed():5.0f}s] round {rnd} {policy}: "
                        f"{row['steps_per_min']} steps/min (sim {row['sim']['steps_per_min']}), "
                        f"hit {row['prefix_hit_rate']}, step p99 {row['step_latency_s']['p99']}"
                        f" s, program p99 {row['program_latency_s']['p99']} s, "
                        f"failed {row['failed']}")
        finally:
            d.stop()
    summary = summarise(rows, policies)
    params = {"trace": TRACE.name, "agents": args.agents, "steps": args.steps,
              "rounds": args.rounds, "kv_tokens": kv_tokens, "block_size": BLOCK_SIZE,
              "context_scale": args.context_scale, "output_scale": args.output_scale,
              "tool_scale": args.tool_scale, "dtype": args.dtype,
              "offload_bytes": args.offload_bytes, "model": "SmolLM2-135M",
              "simulated": False, "summary": summary}
    name = ("agentic_real_quick" if args.quick else "agentic_real") + args.suffix
    path = save(name, params, rows)
    plot(summary, path.with_suffix(".png"))
    for policy, s in summary.items():
        log(f"  {policy:14s} {s['steps_per_min']} steps/min, program p99 {s['program_p99_s']} s"
            f", step p99 {s['step_p99_s']} s, hit {s['prefix_hit_rate']}, "
            f"vs vllm-default {s['vs_vllm_default']}, vs best other {s['vs_best_other']}, "
            f"sim error {s['sim_error']}")
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
