"""Load imbalance with sticky sessions (NALAR §6.1, the financial-analyst workflow).

Sessions and their follow-up turns come from the Mooncake conversation trace (FAST'25,
Apache-2.0; /work/shared/traces): a request that shares at least FOLLOW_BLOCKS leading
512-token blocks with an earlier one continues that conversation. Arrival times, context
and output lengths are the trace's; `load` compresses time as in the router workload.
Each turn runs the analyst workflow:

    plan (Analyst: the context -> PLAN_OUT tokens)
      -> Stock, Bond, Research, News (each SUB_PROMPT -> SUB_OUT tokens, in parallel,
         on their own instances)
      -> summary (Analyst: context + plan + the four results -> the turn's output)

The Analyst keeps a session's conversation (its KV cache) on the instance that served
it, so both arms route a session's Analyst calls to the instance its first call was
placed on: the sticky sessions every baseline has. There a call prefills only what is
new; on any other instance it prefills the whole context again (the recompute that a
KV transfer would avoid: migration is charged its worst case). static keeps sessions
where they started; nalar runs the same three default policies as the router
workload, and head-of-line migration moves a waiting session (its calls and state) to
an idle Analyst instance when it expects to wait longer than its recompute would take
(the session's `state_s`, which this emulation prices from the cost model as the
prefill of what the session has cached) and than one mean service time.
Latency is a turn's arrival to its summary's end. `free_moves` is not a policy but a
reference, like the router's shared pool: no session is sticky (Analyst calls are
placed like any other) and its cache hits wherever it runs, as if KV moved at no cost:
what migration could give if it never paid the recompute.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bench.common import TRACES
from bench.runtime_sim import Setup, Sim, pct, service_s, summary
from daemon.engines.sim.cost import CostModel
from scheduling.agents.policy import ControlPolicy, Route

MOONCAKE = TRACES / "mooncake_fast25_conversation_trace.jsonl"
BLOCK = 512  # tokens per hash id in the trace
FOLLOW_BLOCKS = 4
WINDOW_S = (1200.0, 2400.0)  # minutes 20-40, as for the router
PLAN_OUT, SUB_PROMPT, SUB_OUT = 64, 512, 64
SUBS = ("Stock", "Bond", "Research", "News")
ANALYST = "Analyst"
# At load 1 the window keeps about 12.3 Analyst instances busy (with every session's
# cache hit) and 1.6 of each sub-agent: 17 Analyst instances is ~72% utilisation, as
# for the router, and 3 of each sub-agent ~53%.
ALLOCATION = {ANALYST: 17, **{s: 3 for s in SUBS}}
ANALYST_SETUP = Setup(ALLOCATION)


@dataclass(frozen=True)
class Turn:
    rid: int
    arrival: float
    session: str
    context: int  # the prompt: the conversation so far plus the new question
    output: int
    shared: int  # tokens it shares with the session's previous turn (0: a first turn)


def turns(load: float, window: tuple[float, float] = WINDOW_S) -> list[Turn]:
    rows = [json.loads(line) for line in MOONCAKE.open()]
    latest: dict[tuple[int, ...], int] = {}  # block prefix -> the last request with it
    session: list[str] = []
    shared: list[int] = []
    for i, row in enumerate(rows):
        blocks = tuple(row["hash_ids"])
        parent, common = None, 0
        for k in range(len(blocks), FOLLOW_BLOCKS - 1, -1):
            parent = latest.get(blocks[:k])
            if parent is not None:
                common = k
                break
        session.append(session[parent] if parent is not None else f"c{i}")
        shared.append(common * BLOCK)
        for k in range(1, len(blocks) + 1):
            latest[blocks[:k]] = i
    out: list[Turn] = []
    first: set[str] = set()
    for i, row in enumerate(rows):
        t = row["timestamp"] / 1000
        if not window[0] <= t < window[1]:
            continue
        follow = session[i] in first  # its earlier turns before the window: a cold start
        first.add(session[i])
        out.append(Turn(i, (t - window[0]) / load, session[i], row["input_length"],
                        max(1, row["output_length"]), shared[i] if follow else 0))
    return out


class AnalystSim(Sim):
    def __init__(self, policy: ControlPolicy, cost: CostModel,
                 setup: Setup = ANALYST_SETUP, free_moves: bool = False) -> None:
        super().__init__(policy, setup)
        self.cost = cost
        self.free_moves = free_moves  # a session's cache hits wherever its call runs
        self.turns: dict[int, Turn] = {}
        self.left: dict[int, int] = {}
        self.kv: dict[str, tuple[str, int]] = {}  # session -> (instance, tokens cached)
        self.calls: dict[str, tuple[int, int, int]] = {}  # Analyst call -> (prompt, out, reuse)
        self.rebuilt_s = 0.0  # prefill paid again because a session's call ran off its cache

    def _call(self, fid: str, t: Turn, agent: str, deps: tuple[str, ...] = ()) -> str:
        return self.c.create(fid, t.session, agent, self.now, deps=deps)

    def arrive(self, t: Turn) -> None:
        self.turns[t.rid] = t
        self.calls[f"{t.rid}.plan"] = (t.context, PLAN_OUT, t.shared)
        inst = self._call(f"{t.rid}.plan", t, ANALYST)
        if not self.free_moves and (t.session, ANALYST) not in self.c.rules.routes:
            # the session's state lives where its first call runs: sticky from now on
            self.c.apply([Route(ANALYST, inst, t.session, "sticky session")], self.now)

    def duration(self, fid: str, instance: str) -> float:
        if fid not in self.calls:
            return service_s(self.cost, SUB_PROMPT, SUB_OUT)
        prompt, out, reuse = self.calls.pop(fid)
        session = self.turns[int(fid.split(".")[0])].session
        where, tokens = self.kv.get(session, ("", 0))
        cached = min(tokens, reuse) if where == instance or self.free_moves else 0
        self.kv[session] = (instance, prompt + out)
        if not self.free_moves:  # what a move would cost the session: its recompute
            self.c.set_state_cost(session, service_s(self.cost, prompt + out, 0))
        took = service_s(self.cost, prompt, out, cached)
        if where and not cached and reuse:
            self.rebuilt_s += took - service_s(self.cost, prompt, out, min(tokens, reuse))
        return took

    def finished(self, fid: str, instance: str) -> None:
        rid_s, step = fid.split(".")
        t = self.turns[int(rid_s)]
        if step == "plan":
            subs = tuple(f"{t.rid}.{s}" for s in SUBS)
            for fid_sub, agent in zip(subs, SUBS, strict=True):
                self._call(fid_sub, t, agent, deps=(fid,))
            prompt = t.context + PLAN_OUT + len(SUBS) * SUB_OUT
            self.calls[f"{t.rid}.sum"] = (prompt, t.output, t.context + PLAN_OUT)
            self._call(f"{t.rid}.sum", t, ANALYST, deps=subs)
        elif step == "sum":
            self.latency[t.rid] = self.now - t.arrival


def simulate(policy: ControlPolicy, name: str, ts: list[Turn],
             cost: CostModel, free_moves: bool = False) -> dict[str, Any]:
    sim = AnalystSim(policy, cost, free_moves=free_moves)
    sim.run(((t.arrival, t) for t in ts), len(ts))
    groups = {"follow_up": [t.rid for t in ts if t.shared],
              "first_turn": [t.rid for t in ts if not t.shared]}
    return {"policy": name, **summary(sim, groups), "rebuilt_s": sim.rebuilt_s}


def floor_s(t: Turn, cost: CostModel) -> float:
    """The turn as if nothing else ran and its session's cache always hit: no
    scheduler does better."""
    return (service_s(cost, t.context, PLAN_OUT, t.shared) + service_s(cost, SUB_PROMPT, SUB_OUT)
            + service_s(cost, t.context + PLAN_OUT + len(SUBS) * SUB_OUT, t.output,
                        t.context + PLAN_OUT))


def unqueued(ts: list[Turn], cost: CostModel) -> dict[str, Any]:
    """The floor under any scheduler's latency on this workload."""
    lat = [floor_s(t, cost) for t in ts]
    return {"policy": "no queueing (bound)", "requests": len(lat),
            "mean_s": sum(lat) / len(lat), "p50_s": pct(lat, 0.5), "p95_s": pct(lat, 0.95),
            "p99_s": pct(lat, 0.99)}
