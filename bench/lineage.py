"""Lineage inference benchmark: one agent workload through the gateway three ways, on a
real daemon with two sim workers whose KV is small enough that scheduling matters.

    python -m bench.lineage [--seeds 100-109] [--duration S]
        ->  bench/results/lineage.json, bench/results/lineage.png

- ``explicit ids``: each agent names its program (``program_id``) and releases it at its
  end, as a client that adopted agentd does;
- ``stripped, inference``: the same requests with no id (an unmodified framework) and
  lineage inference on, as shipped (daemon/core/lineage.py): programs end when idle;
- ``stripped, no inference``: no id, ``lineage_inference = false``: every request is a
  program of its own, as before inference.

The workload is closed loop: ``AGENTS`` agents run at once; each runs programs of
``Shape.steps`` LLM calls, sending the whole conversation each time (system prompt shared
by all agents, a task, then per step the reply and a tool's output as a user turn) and
sleeping the tool's time between calls; an agent that finishes a program starts the next.
Contents are words drawn from a seeded generator, so a seed is the same workload in every
variant. Steps/min counts calls answered within ``--duration`` seconds of the start;
prefix hit rate is cached / prompt tokens over those calls (the engines' own counts, from
``usage``). Each variant has its own daemon for the whole run, and the three run each seed
at the same time, so load from elsewhere on the machine (its two cores are shared) falls
on all three alike; between seeds every program left is released. A call answered 5xx,
or a dropped connection, is retried once, as a framework's client would, and counted in
``errors``.

The sim engine runs the SmolLM2-on-CPU cost model (prefill 0.75 ms a token: a miss of a
2k-token context costs about 1.5 s), with time scaled by ``TIME_SCALE`` and tool times
with it; two workers of ``KV_TOKENS`` hold about half of the agents' live contexts. Every
number is simulated.

What it shows (bench/results/lineage.json): inference keeps each conversation one program
(its prefix hits match or pass explicit ids'), but its steps/min stay some 10% under
explicit ids': a client that names its programs releases each at its end, while an
inferred one holds its room until it has been quiet for a while (daemon/core/lineage.py).
Explicit ids that are never released measured within a few points of inference. Requests
without any program (no inference) reach more steps/min than both at half the hit rate:
on this workload the KV policy's holds and pauses cost more than the recompute they save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import RESULTS, Stopwatch, log
from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"
WORKERS = 2
KV_TOKENS = 8192  # per worker
AGENTS = 12
TIME_SCALE = 0.25
SEEDS = tuple(range(100, 110))
VARIANTS: dict[str, tuple[bool, dict[str, str]]] = {
    "explicit ids": (True, {}),
    "stripped, inference": (False, {}),
    "stripped, no inference": (False, {"AGENTD_LINEAGE_INFERENCE": "false"}),
}
TARGET = 0.95  # inference's throughput as a share of explicit ids'


@dataclass(frozen=True)
class Shape:
    """Sizes in words (the sim tokenizer makes one token of each) and seconds."""

    steps: int = 8
    system_words: int = 300
    task_words: tuple[int, int] = (300, 900)
    tool_words: tuple[int, int] = (60, 240)
    output_tokens: int = 48
    tool_s: tuple[float, float] = (0.5, 4.0)  # uniform, before TIME_SCALE


@dataclass
class Tally:
    steps: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(50_000)}" for _ in range(n))


def _system(seed: int) -> dict[str, str]:
    return {"role": "system", "content": _words(random.Random(seed), Shape.system_words)}


async def _agent(client: httpx.AsyncClient, seed: int, agent: int, explicit: bool,
                 tally: Tally) -> None:
    shape, rng = Shape(), random.Random(f"{seed}-{agent}")
    for n in range(1_000_000):
        program = f"bench-{seed}-{agent}-{n}"
        messages = [_system(seed), {"role": "user",
                                    "content": _words(rng, rng.randint(*shape.task_words))}]
        for _ in range(shape.steps):
            body: dict[str, Any] = {"model": MODEL, "messages": messages,
                                    "max_tokens": shape.output_tokens, "temperature": 0}
            if explicit:
                body["program_id"] = program
            r = await _call(client, body, tally)
            if r is None or r.status_code >= 500:  # retried once, as a framework would
                r = await _call(client, body, tally)
            if r is None or r.status_code != 200:
                return
            answer = r.json()
            tally.steps += 1
            tally.prompt_tokens += answer["usage"]["prompt_tokens"]
            tally.cached_tokens += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            messages = [*messages, answer["choices"][0]["message"],
                        {"role": "user", "content": _words(rng, rng.randint(*shape.tool_words))}]
            await asyncio.sleep(rng.uniform(*shape.tool_s) * TIME_SCALE)
        if explicit:
            await client.post(f"/v1/programs/{program}/release")


async def _call(client: httpx.AsyncClient, body: dict[str, Any], tally: Tally
                ) -> httpx.Response | None:
    """One chat call; a failure (a 5xx, or a keep-alive connection the server closed
    as it was reused) is counted in the tally's errors."""
    try:
        r = await client.post("/v1/chat/completions", json=body)
    except httpx.TransportError as exc:
        tally.errors.append(f"{type(exc).__name__}: {exc}")
        return None
    if r.status_code != 200:
        tally.errors.append(f"{r.status_code} {r.text[:200]}")
    return r


async def _load(d: DaemonProcess, seed: int, explicit: bool, duration: float) -> Tally:
    """The agents for `duration` seconds; calls still running then are cancelled (the
    daemon aborts them) and not counted."""
    tally = Tally()
    async with httpx.AsyncClient(base_url=d.url, headers=d.auth_headers(), timeout=120,
                                 limits=httpx.Limits(max_connections=AGENTS + 4)) as client:
        agents = [asyncio.create_task(_agent(client, seed, a, explicit, tally))
                  for a in range(AGENTS)]
        _, running = await asyncio.wait(agents, timeout=duration)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await _release_all(client)
    return tally


async def _release_all(client: httpx.AsyncClient) -> None:
    """End every program a run left (an agent cut off, an inferred program not yet idle),
    so the next run on this daemon starts with none."""
    for status in ("QUEUED", "REASONING", "ACTING", "PAUSED"):
        listed = await client.get("/v1/programs", params={"status": status, "limit": 1000})
        for program in listed.json()["data"]:
            await client.post(f"/v1/programs/{program['id']}/release")


def start(variant: str, data_dir: Path) -> DaemonProcess:
    return DaemonProcess(data_dir=data_dir, workers=WORKERS, env={
        "AGENTD_SIM_KV_TOKENS": str(KV_TOKENS), "AGENTD_SIM_TIME_SCALE": str(TIME_SCALE),
        "AGENTD_LOG_LEVEL": "warning",
        **VARIANTS[variant][1]}).start()


def run(daemons: dict[str, DaemonProcess], seed: int, duration: float
        ) -> list[dict[str, Any]]:
    """One seed on every variant at once: each its own daemon and agents, all in the same
    seconds, so whatever else loads the machine then loads all of them alike."""
    async def together() -> list[Tally]:
        return list(await asyncio.gather(*(_load(daemons[v], seed, VARIANTS[v][0], duration)
                                           for v in VARIANTS)))

    rows = []
    for variant, tally in zip(VARIANTS, asyncio.run(together()), strict=True):
        for error in tally.errors:
            log(f"bench.lineage: {variant} seed {seed}: {error}")
        rows.append({"variant": variant, "seed": seed, "steps": tally.steps,
                     "errors": len(tally.errors),
                     "steps_per_min": round(60 * tally.steps / duration, 1),
                     "prefix_hit_rate": round(tally.cached_tokens / max(tally.prompt_tokens, 1),
                                              3)})
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and worst per variant, and inference's share of explicit ids' throughput:
    the mean of the per-seed ratios and the worst seed's."""
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        out[variant] = {
            "steps_per_min": {"mean": round(statistics.fmean(r["steps_per_min"] for r in mine), 1),
                              "worst": min(r["steps_per_min"] for r in mine)},
            "prefix_hit_rate": {"mean": round(statistics.fmean(r["prefix_hit_rate"]
                                                               for r in mine), 3),
                                "worst": min(r["prefix_hit_rate"] for r in mine)}}
    ratios = [_ratio(rows, seed, variant) for seed in sorted({r["seed"] for r in rows})
              for variant in ("stripped, inference", "stripped, no inference")]
    inference, none = ratios[0::2], ratios[1::2]
    out["vs explicit ids"] = {
        "stripped, inference": {"mean": round(statistics.fmean(inference), 3),
                                "worst": round(min(inference), 3)},
        "stripped, no inference": {"mean": round(statistics.fmean(none), 3),
                                   "worst": round(min(none), 3)}}
    return out


def _ratio(rows: list[dict[str, Any]], seed: int, variant: str) -> float:
    def steps(v: str) -> float:
        return float(next(r["steps_per_min"] for r in rows
                          if r["seed"] == seed and r["variant"] == v))

    return steps(variant) / max(steps("explicit ids"), 1e-9)


def table(rows: list[dict[str, Any]], summed: dict[str, Any]) -> str:
    out = ["| variant | steps/min mean | worst | prefix hit mean | worst | vs explicit ids "
           "mean / worst seed |", "|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        s = summed[variant]
        vs = summed["vs explicit ids"].get(variant, {"mean": 1.0, "worst": 1.0})
        out.append(f"| {variant} | {s['steps_per_min']['mean']} | {s['steps_per_min']['worst']} "
                   f"| {s['prefix_hit_rate']['mean']} | {s['prefix_hit_rate']['worst']} "
                   f"| {vs['mean']} / {vs['worst']} |")
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    seeds = sorted({r["seed"] for r in rows})
    width = 0.8 / len(VARIANTS)
    for i, variant in enumerate(VARIANTS):
        mine = {r["seed"]: r for r in rows if r["variant"] == variant}
        xs = [k + i * width for k in range(len(seeds))]
        axes[0].bar(xs, [mine[s]["steps_per_min"] for s in seeds], width, label=variant)
        axes[1].bar(xs, [mine[s]["prefix_hit_rate"] for s in seeds], width, label=variant)
    for ax, label in ((axes[0], "steps / min"), (axes[1], "prefix hit rate")):
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(seeds))], [str(s) for s in seeds])
        ax.set(xlabel="seed", ylabel=label)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"one agent workload through the gateway: {AGENTS} agents, {WORKERS} sim "
                 f"workers x {KV_TOKENS} KV tokens (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _seeds(text: str) -> tuple[int, ...]:
    if "-" in text:
        lo, hi = text.split("-")
        return tuple(range(int(lo), int(hi) + 1))
    return tuple(int(s) for s in text.split(","))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default=f"{SEEDS[0]}-{SEEDS[-1]}", help="e.g. 100-109 or 1,2")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per seed")
    args = p.parse_args(argv)
    clock = Stopwatch()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(VARIANTS)) as pool:
        starts = {v: pool.submit(start, v, Path(tmp) / str(i)) for i, v in enumerate(VARIANTS)}
        try:
            daemons = {v: f.result() for v, f in starts.items()}
            for seed in _seeds(args.seeds):
                rows += run(daemons, seed, args.duration)
                log(f"[bench-lineage {clock.elapsed():4.0f}s] seed {seed}: " + ", ".join(
                    f"{r['variant']} {r['steps_per_min']} steps/min hit {r['prefix_hit_rate']}"
                    for r in rows[-len(VARIANTS):]))
        finally:
            for f in starts.values():
                if f.exception() is None:
                    f.result().stop()
    summed = summary(rows)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "lineage.json"
    params = {"workers": WORKERS, "kv_tokens_per_worker": KV_TOKENS, "agents": AGENTS,
              "shape": asdict(Shape()), "time_scale": TIME_SCALE,
              "duration_s": args.duration, "cost_model": "smollm2-135m-cpu (sim default)",
              "kv_policy": "agentd (default)", "target": f"inference >= {TARGET:.0%} of "
              "explicit ids' steps/min", "simulated": True, "wall_s": round(clock.elapsed(), 1)}
    path.write_text(json.dumps({"params": params, "summary": summed, "results": rows},
                               indent=2) + "\n")
    plot(rows, path.with_suffix(".png"))
    print(table(rows, summed))
    share = summed["vs explicit ids"]["stripped, inference"]
    log(f"inference / explicit ids steps/min: mean {share['mean']}, worst seed "
        f"{share['worst']} (target >= {TARGET}); wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
