"""Programmable contexts against client-driven loops (issue 26): the same ReAct-shaped agent
run three ways, side by side, on one daemon.

Each agent is a system prompt and a question, then eight tool calls (generate, the tool's
time, its observation as a user turn) and a final answer: nine generates. The tool times
are drawn (seeded) from the gaps between consecutive steps of the mini-swe-agent dev trace
(`daemon/replay/traces.py` `load_miniswe`, StepSpec.tool_s: the provider's latency is in
them too, an upper bound), scaled by `--tool-scale` and capped at `--tool-cap-s`. Every
agent's texts (filler words) and tool times are fixed before a round and shared by the
three modes; each phase's prompts carry a tag of their own, so no phase hits another's
prefix blocks.

- `program`: the agent is a workflow run (POST /v1/workflows, POST /v1/runs): a sandboxed
  program on the daemon holding one `agentd.Context`. Between tool calls it appends the
  observation as a turn and generates; nothing is re-sent, each generate carries the
  context's token ids (the engine's prefix cache serves them). Tools run inside
  `ctx.idle()`. Its latency is the run's, sandbox start included (created to finished);
  `overhead_s` is that latency less the program's own time (queueing, the sandbox's start,
  the result's way back).
- `contexts-client`: the same program's `main` called in this process (a thread per
  agent), `agentd.Context` in local mode against the daemon (`AGENTD_URL`/`AGENTD_TOKEN`)
  with a `program_id` each: the Context API without the sandbox, so the two show what the
  API and what the run's start cost.
- `chat-program-id`: the `openai` client drives the chat endpoint turn by turn, the whole
  history re-sent and re-tokenized each turn, with `program_id` / `session_id` in
  extra_body (released at the end).
- `chat-plain`: the same client without them (what frameworks do; the daemon's default
  lineage inference may still join the turns into one program).

One daemon on one sim worker with the `llama3-8b-h100` cost model (`sim_cost_model`), its
KV (`sim_kv_tokens`) and time scale (`sim_time_scale`) as options; or, `--engine vllm`, on
one real vLLM CPU worker serving SmolLM2-135M (shorter agents, to fit its 2,048 tokens).
Each round runs every concurrency, and at each concurrency the modes in a rotated order; a
phase starts `C` agents at once and ends when the last one ends. Per mode and concurrency: agents/s
(C / the phase's wall time, mean over rounds) and latency per agent (p50/p99 over all
rounds' agents); the ratio program / chat-program-id of agents/s per round at the highest
concurrency (mean and worst) against the issue's target (>= 1.3), and contexts-client /
chat-program-id beside it.

    python -m bench.contexts [--rounds 3] [--concurrency 4,16,32] [--quick] [--engine vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from agentd.runtime import LLMError
from bench.common import TRACES, Stopwatch, log, save, words
from daemon.models.smollm2 import DEFAULT_SMOLLM2_DIR, kv_bytes_per_token
from daemon.replay.traces import load_miniswe
from daemon.replay.workload import ProgramSpec
from tests.daemon_process import DaemonProcess

TRACE = TRACES / "miniswe_gemini3pro_swebv_steps_dev.csv"
MODES = ("program", "contexts-client", "chat-program-id", "chat-plain")
TARGET = 1.3  # issue 26: the in-server program >= 1.3x the client-driven loop's agents/s
TOOL_CALLS = 8
WORKFLOW = "bench-contexts-react"
# Per engine: (system words, observation words, output tokens, final tokens, KV tokens);
# SmolLM2's 2,048-token window holds the whole agent on the real worker.
SHAPES = {"sim": (400, 120, 48, 32, 65536), "vllm": (150, 60, 24, 16, 16384)}

# The in-server agent: a workflow bundle's main.py. The same loop as `run_chat_agent`.
PROGRAM = '''\
"""A ReAct-shaped agent on one agentd.Context (bench/contexts.py's program mode)."""

import random
import time

import agentd


def main(system, question, observations, tool_s, output_tokens, final_tokens, seed,
         program_id=None):
    """In a run, calls go to the run's program; run locally, `program_id` names one."""
    started = time.monotonic()
    rng = random.Random(seed)
    ctx = agentd.Context(program_id=program_id, session_id=program_id)
    ctx.system(system).user(question)
    prompt = cached = 0
    for observation, wait in zip(observations, tool_s, strict=True):
        out = ctx.generate(max_tokens=output_tokens, temperature=0.7,
                           seed=rng.randrange(1 << 30))
        prompt, cached = prompt + out.prompt_tokens, cached + out.cached_tokens
        with ctx.idle():  # the tool's time: the KV layer sees a tool span of the program
            time.sleep(wait)
        ctx.user(observation)
    out = ctx.generate(max_tokens=final_tokens, temperature=0.7, seed=rng.randrange(1 << 30))
    return {"generates": len(tool_s) + 1, "prompt_tokens": prompt + out.prompt_tokens,
            "cached_tokens": cached + out.cached_tokens, "context_tokens": len(ctx.token_ids),
            "program_s": time.monotonic() - started}
'''


@dataclass(frozen=True)
class Agent:
    """One agent's workload, the same in every mode."""

    system: str
    question: str
    observations: tuple[str, ...]
    tool_s: tuple[float, ...]
    seed: int


def tool_latency_pool(specs: Sequence[ProgramSpec]) -> list[float]:
    """Every gap between a session's consecutive steps (the first step has none)."""
    return [s.tool_s for spec in specs for s in spec.steps[1:]]


def draw_tool_latencies(pool: Sequence[float], n: int, scale: float, cap_s: float,
                        rng: random.Random) -> tuple[float, ...]:
    """`n` tool times drawn from the trace's, scaled and capped (seconds)."""
    if not pool:
        raise ValueError("the trace holds no tool latencies")
    return tuple(round(min(cap_s, rng.choice(pool) * scale), 3) for _ in range(n))


def make_agents(pool: Sequence[float], n: int, seed: int, *, system_words: int,
                observation_words: int, tool_scale: float, tool_cap_s: float) -> list[Agent]:
    rng = random.Random(seed)
    return [Agent(system=words(rng, system_words), question="Fix the failing test. "
                  + words(rng, 20),
                  observations=tuple("Observation: " + words(rng, observation_words)
                                     for _ in range(TOOL_CALLS)),
                  tool_s=draw_tool_latencies(pool, TOOL_CALLS, tool_scale, tool_cap_s, rng),
                  seed=rng.randrange(1 << 30))
            for _ in range(n)]


def percentile(xs: Sequence[float], q: int) -> float | None:
    if not xs:
        return None
    if len(xs) == 1:
        return round(xs[0], 3)
    return round(statistics.quantiles(xs, n=100, method="inclusive")[q - 1], 3)


@dataclass
class Phase:
    mode: str
    concurrency: int
    round: int
    wall_s: float = 0.0
    latency_s: list[float] = field(default_factory=list)
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    overhead_s: list[float] = field(default_factory=list)  # latency less the program's time

    def row(self) -> dict[str, Any]:
        done = len(self.latency_s)
        return {"mode": self.mode, "concurrency": self.concurrency, "round": self.round,
                "wall_s": round(self.wall_s, 3), "agents": done, "failed": self.failed,
                "agents_per_s": round(done / self.wall_s, 4) if self.wall_s else 0.0,
                "latency_s": [round(x, 3) for x in self.latency_s],
                "latency_p50_s": percentile(self.latency_s, 50),
                "latency_p99_s": percentile(self.latency_s, 99),
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "overhead_s": round(statistics.fmean(self.overhead_s), 3)
                if self.overhead_s else None}


def summarise(rows: Sequence[dict[str, Any]], modes: Sequence[str] = MODES,
              target: float = TARGET) -> dict[str, Any]:
    """Per (mode, concurrency): agents/s (mean over rounds), latency p50/p99 over every
    round's agents, failures. At the highest concurrency: program / chat-program-id and
    program / chat-plain agents/s, taken per round (same machine state), mean and worst."""
    table: dict[str, dict[str, Any]] = {}
    concurrencies = sorted({int(r["concurrency"]) for r in rows})
    for mode in modes:
        table[mode] = {}
        for c in concurrencies:
            mine = [r for r in rows if r["mode"] == mode and r["concurrency"] == c]
            if not mine:
                continue
            lat = [x for r in mine for x in r["latency_s"]]
            table[mode][str(c)] = {
                "agents_per_s": round(statistics.fmean(r["agents_per_s"] for r in mine), 4),
                "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
                "failed": sum(int(r["failed"]) for r in mine), "rounds": len(mine),
                "overhead_s": round(statistics.fmean(over), 3)
                if (over := [r["overhead_s"] for r in mine if r.get("overhead_s") is not None])
                else None}
    top = concurrencies[-1] if concurrencies else None

    def ratio(num: str, den: str) -> dict[str, float] | None:
        per = []
        for rnd in sorted({r["round"] for r in rows if r["concurrency"] == top}):
            at = {r["mode"]: r["agents_per_s"] for r in rows
                  if r["concurrency"] == top and r["round"] == rnd}
            if at.get(num) is not None and at.get(den):
                per.append(at[num] / at[den])
        return {"mean": round(statistics.fmean(per), 3), "worst": round(min(per), 3)} \
            if per else None

    vs_program_id = ratio("program", "chat-program-id")
    return {"by_mode": table, "highest_concurrency": top,
            "program_vs_chat_program_id": vs_program_id,
            "program_vs_chat_plain": ratio("program", "chat-plain"),
            "contexts_client_vs_chat_program_id": ratio("contexts-client", "chat-program-id"),
            "target": target,
            "target_met": None if vs_program_id is None else vs_program_id["mean"] >= target}


# --- the three modes ------------------------------------------------------------------


def program_args(agent: Agent, tag: str, output_tokens: int, final_tokens: int) -> dict[str, Any]:
    return {"system": f"You are agent {tag}. {agent.system}", "question": agent.question,
            "observations": list(agent.observations), "tool_s": list(agent.tool_s),
            "output_tokens": output_tokens, "final_tokens": final_tokens, "seed": agent.seed}


async def run_programs(d: DaemonProcess, agents: Sequence[Agent], tag: str, phase: Phase,
                       output_tokens: int, final_tokens: int) -> None:
    async with httpx.AsyncClient(base_url=d.url, headers=d.auth_headers(), timeout=60) as http:
        async def submit(n: int, agent: Agent) -> str:
            r = await http.post("/v1/runs", json={
                "workflow": WORKFLOW, "session_id": f"{tag}-{n}",
                "args": program_args(agent, f"{tag}-{n}", output_tokens, final_tokens)})
            if r.status_code != 201:
                raise RuntimeError(f"POST /v1/runs: {r.status_code} {r.text}")
            return str(r.json()["id"])

        # all at once, as the chat modes start their agents
        ids = await asyncio.gather(*(submit(n, a) for n, a in enumerate(agents)))
        views: dict[str, dict[str, Any]] = {}
        while len(views) < len(ids):  # the runs' own stamps give the times, not this poll
            await asyncio.sleep(0.25)
            for run_id in ids:
                if run_id in views:
                    continue
                view = (await http.get(f"/v1/runs/{run_id}")).json()
                if view["status"] in ("finished", "failed", "cancelled"):
                    views[run_id] = view
    starts, ends = [], []
    for view in views.values():
        if view["status"] != "finished":
            log(f"  run {view['id']} {view['status']}: {str(view.get('error'))[:300]}")
            phase.failed += 1
            continue
        timings = view["timings"]
        start, end = float(timings["created_at"]), float(timings["finished_at"])
        starts.append(start)
        ends.append(end)
        phase.latency_s.append(end - start)
        phase.prompt_tokens += int(view["result"]["prompt_tokens"])
        phase.cached_tokens += int(view["result"]["cached_tokens"])
        phase.overhead_s.append(end - start - float(view["result"]["program_s"]))
    if starts:
        phase.wall_s = max(ends) - min(starts)


async def run_chat_agent(client: openai.AsyncOpenAI, model: str, agent: Agent, tag: str,
                         phase: Phase, output_tokens: int, final_tokens: int,
                         program_id: bool) -> None:
    rng = random.Random(agent.seed)
    history: list[dict[str, str]] = [
        {"role": "system", "content": f"You are agent {tag}. {agent.system}"},
        {"role": "user", "content": agent.question}]
    extra = {"program_id": tag, "session_id": tag} if program_id else {}
    started = time.perf_counter()
    try:
        for i in range(TOOL_CALLS + 1):
            resp = await client.chat.completions.create(
                model=model, messages=history,  # type: ignore[arg-type]
                max_tokens=output_tokens if i < TOOL_CALLS else final_tokens,
                temperature=0.7, seed=rng.randrange(1 << 30), extra_body=extra)
            if resp.usage is not None:
                phase.prompt_tokens += resp.usage.prompt_tokens
                details = resp.usage.prompt_tokens_details
                phase.cached_tokens += (details.cached_tokens or 0) if details else 0
            history.append({"role": "assistant", "content": resp.choices[0].message.content
                            or ""})
            if i < TOOL_CALLS:
                await asyncio.sleep(agent.tool_s[i])  # the tool's own time
                history.append({"role": "user", "content": agent.observations[i]})
    except openai.APIError as exc:
        log(f"  {tag}: {exc}")
        phase.failed += 1
        return
    phase.latency_s.append(time.perf_counter() - started)
    if program_id:
        await client.post(f"/programs/{tag}/release", cast_to=httpx.Response)


async def run_chats(d: DaemonProcess, agents: Sequence[Agent], tag: str, phase: Phase,
                    output_tokens: int, final_tokens: int, program_id: bool) -> None:
    client = openai.AsyncOpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                                timeout=600)
    try:
        model = (await client.models.list()).data[0].id
        started = time.perf_counter()
        await asyncio.gather(*(run_chat_agent(client, model, a, f"{tag}-{n}", phase,
                                              output_tokens, final_tokens, program_id)
                               for n, a in enumerate(agents)))
        phase.wall_s = time.perf_counter() - started
    finally:
        await client.close()


def run_contexts_client(d: DaemonProcess, agents: Sequence[Agent], tag: str, phase: Phase,
                        output_tokens: int, final_tokens: int) -> None:
    """The program's own `main`, a thread per agent, on agentd.Context in local mode."""
    namespace: dict[str, Any] = {}
    exec(compile(PROGRAM, "bench-contexts-program", "exec"), namespace)  # the run's very code
    program = namespace["main"]
    os.environ["AGENTD_URL"], os.environ["AGENTD_TOKEN"] = d.url, d.token

    def one(n: int, agent: Agent) -> None:
        pid = f"{tag}-{n}"
        started = time.perf_counter()
        try:
            result = program(**program_args(agent, pid, output_tokens, final_tokens),
                             program_id=pid)
        except LLMError as exc:
            log(f"  {pid}: {exc}")
            phase.failed += 1
            return
        phase.latency_s.append(time.perf_counter() - started)
        phase.prompt_tokens += int(result["prompt_tokens"])
        phase.cached_tokens += int(result["cached_tokens"])
        d.post(f"/v1/programs/{pid}/release")

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(agents)) as pool:
        for future in [pool.submit(one, n, a) for n, a in enumerate(agents)]:
            future.result()
    phase.wall_s = time.perf_counter() - started


def run_phase(d: DaemonProcess, mode: str, agents: Sequence[Agent], rnd: int,
              output_tokens: int, final_tokens: int) -> Phase:
    phase = Phase(mode, len(agents), rnd)
    tag = f"{f'r{rnd}' if rnd >= 0 else 'warm'}-c{len(agents)}-{mode}"
    if mode == "program":
        asyncio.run(run_programs(d, agents, tag, phase, output_tokens, final_tokens))
    elif mode == "contexts-client":
        run_contexts_client(d, agents, tag, phase, output_tokens, final_tokens)
    else:
        asyncio.run(run_chats(d, agents, tag, phase, output_tokens, final_tokens,
                              program_id=mode == "chat-program-id"))
    return phase


# --- output ---------------------------------------------------------------------------


def start_daemon(data_dir: Path, args: argparse.Namespace) -> DaemonProcess:
    if args.engine == "sim":
        return DaemonProcess(data_dir=data_dir, env={
            "AGENTD_SIM_COST_MODEL": args.cost_model,
            "AGENTD_SIM_KV_TOKENS": str(args.kv_tokens),
            "AGENTD_SIM_TIME_SCALE": str(args.time_scale), "AGENTD_LOG_LEVEL": "warning"},
        ).start()
    return DaemonProcess(data_dir=data_dir, engine="vllm", extra_args=["--model", args.model],
                         env={"AGENTD_VLLM_KV_CACHE_BYTES": str(args.kv_tokens
                                                                * kv_bytes_per_token()),
                              "AGENTD_VLLM_DTYPE": "float32",
                              "AGENTD_VLLM_MAX_MODEL_LEN": "2048",
                              "AGENTD_LOG_LEVEL": "warning"}).start(timeout=600)


def plot(summary: dict[str, Any], path: Path, engine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("agents_per_s", "agents/s"), ("latency_p50_s", "latency per agent p50 (s)"),
              ("latency_p99_s", "latency per agent p99 (s)"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for mode, per in summary["by_mode"].items():
            xs = sorted(int(c) for c in per)
            ax.plot(xs, [per[str(c)][key] or 0 for c in xs], "o-", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent agents")
        ax.set_title(title)
        ax.legend(fontsize=8)
    ratio = summary["program_vs_chat_program_id"]
    fig.suptitle(f"ReAct agent (8 tool calls), {engine}: program with contexts vs "
                 f"client loops; program / chat-program-id at C={summary['highest_concurrency']}"
                 f": {ratio['mean'] if ratio else '-'} (target {summary['target']})")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", default="4,16,32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tool-scale", type=float, default=0.05)
    p.add_argument("--tool-cap-s", type=float, default=2.0)
    p.add_argument("--engine", choices=sorted(SHAPES), default="sim")
    p.add_argument("--system-words", type=int, help="default: 400 (sim), 150 (vllm)")
    p.add_argument("--observation-words", type=int, help="default: 120 (sim), 60 (vllm)")
    p.add_argument("--output-tokens", type=int, help="default: 48 (sim), 24 (vllm)")
    p.add_argument("--final-tokens", type=int, help="default: 32 (sim), 16 (vllm)")
    p.add_argument("--cost-model", default="llama3-8b-h100", help="the sim's")
    p.add_argument("--kv-tokens", type=int, help="default: 65536 (sim), 16384 (vllm)")
    p.add_argument("--model", default=str(DEFAULT_SMOLLM2_DIR), help="the vLLM worker's")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the unrecorded first agent of each mode")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 round, 4 and 8 agents (vllm: 2 and 4)")
    args = p.parse_args(argv)
    shape = SHAPES[args.engine]
    for name, default in zip(("system_words", "observation_words", "output_tokens",
                              "final_tokens", "kv_tokens"), shape, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.quick:
        args.rounds, args.concurrency = 1, "4,8" if args.engine == "sim" else "2,4"
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    modes = tuple(m.strip() for m in args.modes.split(","))
    if unknown := set(modes) - set(MODES):
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; known {list(MODES)}")
    pool = tool_latency_pool(load_miniswe(TRACE))
    log(f"[bench-contexts] {len(pool)} tool latencies from {TRACE.name}, x{args.tool_scale} "
        f"capped at {args.tool_cap_s} s; concurrency {concurrencies}, {args.rounds} rounds, "
        f"{'sim ' + args.cost_model if args.engine == 'sim' else 'vLLM ' + args.model}")
    # A SIGTERM (a `timeout`, a CI cancel) unwinds like Ctrl-C, so the daemon is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    clock = Stopwatch()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agentd-bench-contexts-") as tmp:
        d = start_daemon(Path(tmp) / "data", args)
        try:
            r = d.post("/v1/workflows", json={"name": WORKFLOW, "files": {"main.py": PROGRAM},
                                              "entry": "main:main"})
            if r.status_code != 201:
                raise RuntimeError(f"POST /v1/workflows: {r.status_code} {r.text}")
            if args.warmup:
                # One agent of each mode, not recorded: the first phase otherwise pays what
                # any first use does (the engine's first shapes, the sandbox fork server).
                warm = make_agents(pool, 1, args.seed * 1000 + 999,
                                   system_words=args.system_words,
                                   observation_words=args.observation_words,
                                   tool_scale=args.tool_scale, tool_cap_s=args.tool_cap_s)
                for mode in modes:
                    run_phase(d, mode, warm, -1, args.output_tokens, args.final_tokens)
                log(f"[bench-contexts {clock.elapsed():5.0f}s] warmed up: one agent a mode, "
                    "not recorded")
            for rnd in range(args.rounds):
                for c in concurrencies:
                    agents = make_agents(pool, c, args.seed * 1000 + rnd * 100 + c,
                                         system_words=args.system_words,
                                         observation_words=args.observation_words,
                                         tool_scale=args.tool_scale,
                                         tool_cap_s=args.tool_cap_s)
                    k = (rnd + concurrencies.index(c)) % len(modes)
                    for mode in modes[k:] + modes[:k]:
                        row = run_phase(d, mode, agents, rnd, args.output_tokens,
                                        args.final_tokens).row()
                        rows.append(row)
                        log(f"[bench-contexts {clock.elapsed():5.0f}s] round {rnd} C={c} "
                            f"{mode}: {row['agents_per_s']} agents/s, latency p50 "
                            f"{row['latency_p50_s']} s p99 {row['latency_p99_s']} s, "
                            f"cached {row['cached_tokens']}/{row['prompt_tokens']} prompt "
                            f"tokens, overhead {row['overhead_s']} s, failed {row['failed']}")
        finally:
            d.stop()
    summary = summarise(rows, modes)
    params = {"trace": TRACE.name, "tool_calls": TOOL_CALLS, "rounds": args.rounds,
              "concurrency": concurrencies, "seed": args.seed, "tool_scale": args.tool_scale,
              "tool_cap_s": args.tool_cap_s, "system_words": args.system_words,
              "observation_words": args.observation_words, "output_tokens": args.output_tokens,
              "final_tokens": args.final_tokens, "engine": args.engine, "warmup": args.warmup,
              "kv_tokens": args.kv_tokens, "summary": summary,
              **({"sim_cost_model": args.cost_model, "sim_time_scale": args.time_scale,
                  "simulated": True} if args.engine == "sim"
                 else {"model": Path(args.model).name, "simulated": False})}
    name = "contexts" + ("_vllm" if args.engine == "vllm" else "")
    path = save(name + ("_quick" if args.quick else ""), params, rows)
    plot(summary, path.with_suffix(".png"),
         f"sim {args.cost_model}" if args.engine == "sim" else f"vLLM CPU, {Path(args.model).name}")
    for mode, per in summary["by_mode"].items():
        for c, s in per.items():
            log(f"  {mode:16s} C={c:>3s} {s['agents_per_s']} agents/s, p50 "
                f"{s['latency_p50_s']} s, p99 {s['latency_p99_s']} s, failed {s['failed']}")
    log(f"  program / chat-program-id at C={summary['highest_concurrency']}: "
        f"{summary['program_vs_chat_program_id']} (target {TARGET}, met: "
        f"{summary['target_met']}); program / chat-plain: {summary['program_vs_chat_plain']}; "
        f"contexts-client / chat-program-id: {summary['contexts_client_vs_chat_program_id']}")
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
