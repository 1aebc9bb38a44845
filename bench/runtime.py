"""Two-level control at scale (NALAR §6.3, Fig. 10 and Table 4), on emulated instances.

    python -m bench.runtime [--quick]  ->  bench/results/runtime.json, runtime.png
                                          and the load-imbalance part (bench/runtime_imbalance.py)

Control scale. `I` instances (64 or 128; four agent types, a quarter each) hold `F` live
calls (1,024 to 131,072): sessions of 16 parallel calls at one stage (0-3) of their
graph, one call running per instance, the rest queued. Real local controllers
(scheduling/agents/local.py) hold them; "emulated" means nothing executes: the
benchmark finishes a running call itself. Per global loop, with SRTF-by-stage
installed: collect the view from every local controller, run the policy and validate
its decisions, install them (set_priority re-keys the session's queued calls). Between
loops, ROUNDS times, each instance finishes its running call, a successor call is
created at the next stage (or a new session starts) and the instance dispatches its
next call; a session whose last call finished is forgotten, as a host does, so the
number of live calls and the heap stay level. Per call we time the creation
(metadata, placement by the router, hand-off to the executor's local controller,
enqueue under the installed priority) and the dispatch (pop the highest priority);
"decision" is their sum. The completion (push the value to consumers and creator,
free the slot) is timed too and shown apart.

Times are this thread's CPU time on one core (the JSON has wall-clock loop times too),
less the garbage collections that ran inside the timed call (daemon/policies/clock.py):
a collection is the interpreter's, run inside whichever call happens to allocate when a
threshold is crossed. The same samples with collections included are reported next to
them ("with GC"), with the number of collections and the time they took per call.
Every per-call sample is also less the clock's own cost, the median of the same clock
read around an empty call, measured at the start of each row (`clock_overhead_us`);
"event" is a call's three steps together (placement, dispatch, completion). The tail of
a few-µs sample on a shared machine is mostly the machine's: `noise_reference` times
a fixed piece of work of about a decision's size with the same clock.
After populating, the heap is frozen (gc.freeze), as a long-running host with a large
stable heap would do; --no-freeze shows the tail a full collection over ~10^6 objects
adds.

One-level comparison (Table 4). The same SRTF scheduling done by one central controller
that routes every call itself: besides the per-call work the local controllers do, it
keeps every session's deepest stage and one global priority queue per agent type
(re-keyed when a session's stage changes), and binds a call to an instance when one
frees; that upkeep is measured per event at each size (`Central`). Time to schedule one
call then comes from a single-server queue fed by every live call's events (Poisson) and
served in (per-call work + central upkeep); two-level: each local controller is its own
server fed by its own calls and served in the per-call work alone. Utilisation >= 1
means the central queue grows without bound over the window (`saturated`).
Arrivals are modelled (at each of RATES events per live call per second), service
times are measured.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import RESULTS, Stopwatch, log, save
from daemon.policies.clock import cpu_time
from scheduling.agents.cluster import Cluster
from scheduling.agents.policies import SrtfByStage
from scheduling.agents.policy import Directives, FutureStatus, GlobalController

AGENTS = ("planner", "developer", "tester", "summariser")
STAGES = len(AGENTS)
FAN_OUT = 16  # live calls per session
FUTURES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
INSTANCES = (64, 128)
LOOPS = 8
ROUNDS = 8  # churn rounds between two global loops: LOOPS * ROUNDS * I timed calls
RATES = (1.0, 4.0)  # scheduling events per live call per second
WINDOW_S = 0.5
TARGET_LOOP_MS = 150.0
TARGET_DECISION_US = 50.0
# CPU time of this thread: the machine may be shared, and time spent preempted by other
# processes is not the controller's. Wall-clock loop times are in the JSON too.
CLOCK = time.thread_time_ns


def calibrate() -> float:
    """ms of CPU for a fixed reference loop (131,072 tuples folded into a dict), so
    that numbers from different machines can be compared."""
    rows = [(f"s{i // 16}", i % 4) for i in range(131072)]
    t0 = CLOCK()
    deepest: dict[str, int] = {}
    for session, stage in rows:
        if stage > deepest.get(session, -1):
            deepest[session] = stage
    return (CLOCK() - t0) / 1e6


def clock_overhead_us() -> float:
    """Median of what `Timings` reads around an empty call: the floor under every sample."""
    t = Timings()
    for _ in range(2000):
        t.time("place", int)
    return _pct(t.us["place"], 0.5)


def _net(xs: list[float], floor: float) -> list[float]:
    return [max(0.0, x - floor) for x in xs]


def noise_reference(samples: int = 8192) -> dict[str, float]:
    """The same clock around the same amount of work every time, of about a decision's
    size (dict lookups spread over a large table): how far its p99 sits above its p50
    is the machine's doing (other processes on the cores, shared caches, interrupts),
    and the decisions' tails carry that too."""
    table = {f"k{i}": i for i in range(1 << 17)}
    keys = [f"k{(i * 7919) % (1 << 17)}" for i in range(1 << 17)]

    def work(j: int) -> int:
        return sum(table[k] for k in keys[j:j + 24])

    t = Timings()
    for n in range(samples):
        t.time("place", work, (n * 24) % (1 << 17))
    xs = t.us["place"]
    return {"p50_us": _pct(xs, 0.5), "p99_us": _pct(xs, 0.99), "p999_us": _pct(xs, 0.999)}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class Timings:
    """Per-call samples (µs) of each timed step: without the collections that ran
    inside the call, and with them."""

    def __init__(self) -> None:
        self.us: dict[str, list[float]] = {k: [] for k in STEPS}
        self.us_gc: dict[str, list[float]] = {k: [] for k in STEPS}

    def time(self, step: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        t0 = time.thread_time()
        c0 = cpu_time()
        out = fn(*args, **kw)
        c1 = cpu_time()
        t1 = time.thread_time()
        self.us[step].append((c1 - c0) * 1e6)
        self.us_gc[step].append((t1 - t0) * 1e6)
        return out


STEPS = ("place", "dispatch", "finish", "forget")


class Workload:
    """Sessions of FAN_OUT calls at one stage; the stage's agent type runs them."""

    def __init__(self, instances: int, futures: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.c = Cluster({a: Directives(max_instances=instances) for a in AGENTS},
                         record_events=False)
        for i in range(instances):
            self.c.add_instance(AGENTS[i % STAGES], node=f"node{i // 2}")
        self.sessions = 0
        self.calls = 0
        self.live: dict[str, int] = {}  # session -> its live calls
        self.running: dict[str, tuple[str, str, int]] = {}  # instance -> (call, session, stage)
        self.t: Timings | None = None  # set: the churn is timed
        for _ in range(futures // FAN_OUT):
            self._new_session(self.rng.randrange(STAGES))
        for instances_of_type in self.c.by_type.values():
            for ctl in instances_of_type:
                self._dispatch(ctl.id)

    def _run(self, step: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return fn(*args, **kw) if self.t is None else self.t.time(step, fn, *args, **kw)

    def _create(self, session: str, stage: int) -> None:
        self.calls += 1
        self.live[session] = self.live.get(session, 0) + 1
        self._run("place", self.c.create, f"c{self.calls}", session, AGENTS[stage], 0.0,
                  stage=stage)

    def _new_session(self, stage: int) -> None:
        self.sessions += 1
        for _ in range(FAN_OUT if self.t is None else 1):
            self._create(f"s{self.sessions}", stage)

    def _dispatch(self, inst: str) -> None:
        started = self._run("dispatch", self.c.start_next, inst, 0.0)
        if started is not None:
            f = started.future
            self.running[inst] = (f.future_id, f.session_id, f.stage)

    def churn(self, t: Timings) -> None:
        """Every instance finishes its call; a successor is created; it dispatches."""
        self.t = t
        for inst, (fid, session, stage) in list(self.running.items()):
            del self.running[inst]
            self._run("finish", self.c.finish, inst, fid, None, True, 0.0)
            if stage + 1 < STAGES:
                self._create(session, stage + 1)
            else:
                self._new_session(0)
            self.live[session] -= 1
            if not self.live[session]:
                del self.live[session]
                self._run("forget", self.c.forget_session, session)
            self._dispatch(inst)
        self.t = None


def global_loop(w: Workload, gc_: GlobalController) -> dict[str, float]:
    wall = time.perf_counter()
    t0 = CLOCK()
    view = w.c.view()
    t1 = CLOCK()
    step = gc_.step(view, 0.0)
    t2 = CLOCK()
    w.c.apply(step.accepted, 0.0, validate=False)
    t3 = CLOCK()
    return {"collect_ms": (t1 - t0) / 1e6, "policy_ms": (t2 - t1) / 1e6,
            "install_ms": (t3 - t2) / 1e6, "loop_ms": (t3 - t0) / 1e6,
            "loop_wall_ms": (time.perf_counter() - wall) * 1e3,
            "decisions": len(step.accepted), "live": len(view.futures)}


class Central:
    """One-level SRTF: every event goes through this one controller."""

    def __init__(self) -> None:
        self.queues: dict[str, list[tuple[float, int, str]]] = {a: [] for a in AGENTS}
        self.stages: dict[str, list[int]] = {}  # session -> live calls per stage
        self.members: dict[str, set[str]] = {}  # session -> its queued calls
        self.info: dict[str, tuple[str, int, int]] = {}  # call -> (session, stage, seq)
        self.seq = 0

    def _priority(self, session: str) -> float:
        counts = self.stages[session]
        return float(max((i for i, n in enumerate(counts) if n), default=0))

    def create(self, fid: str, session: str, stage: int) -> None:
        counts = self.stages.setdefault(session, [0] * STAGES)
        before = self._priority(session)
        counts[stage] += 1
        self.seq += 1
        self.info[fid] = (session, stage, self.seq)
        prio = self._priority(session)
        mine = self.members.setdefault(session, set())
        mine.add(fid)
        todo = mine if prio != before else (fid,)  # a new stage re-keys the session
        for other in todo:
            _, st, seq = self.info[other]
            heapq.heappush(self.queues[AGENTS[st]], (-prio, seq, other))

    def dispatch(self, agent: str) -> str | None:
        """An instance of `agent` is free: the highest-priority queued call, bound to it."""
        queue = self.queues[agent]
        while queue:
            neg, _, fid = heapq.heappop(queue)
            info = self.info.get(fid)
            if info is None or fid not in self.members[info[0]] or \
                    -neg != self._priority(info[0]):
                continue  # ran already, or a stale key (the current one is queued too)
            self.members[info[0]].discard(fid)
            return fid
        return None

    def finish(self, fid: str) -> None:
        session, stage, _ = self.info.pop(fid)
        self.stages[session][stage] -= 1


def central_service(futures: int, seed: int, samples: int) -> list[float]:
    """Measured time of one central event: a creation, or a completion with the dispatch
    of the freed instance's next call."""
    rng = random.Random(seed)
    c = Central()
    n = 0
    for s in range(futures // FAN_OUT):
        stage = rng.randrange(STAGES)
        for _ in range(FAN_OUT):
            n += 1
            c.create(f"c{n}", f"s{s}", stage)
    running = [fid for a in AGENTS for fid in [c.dispatch(a)] if fid is not None]
    out: list[float] = []
    for k in range(samples):
        t0 = cpu_time()
        if k % 2:
            session, stage, _ = c.info[running[rng.randrange(len(running))]]
            n += 1
            c.create(f"c{n}", session, min(stage + 1, STAGES - 1))
        else:
            i = rng.randrange(len(running))
            fid = running[i]
            agent = AGENTS[c.info[fid][1]]
            c.finish(fid)
            nxt = c.dispatch(agent)
            running[i] = nxt if nxt is not None else running[i - 1]
        out.append((cpu_time() - t0) * 1e6)
    return out


def queue_latency_ms(service_us: list[float], rate_per_s: float, servers: int,
                     seed: int) -> dict[str, float]:
    """Lindley recursion per server: Poisson arrivals at rate/servers each, service
    times drawn from the measured ones; time from an event to its decision."""
    rng = random.Random(seed)
    per = rate_per_s / servers
    lat: list[float] = []
    for _ in range(min(servers, 16)):  # the servers are alike: a sample of them
        t = free_at = 0.0
        while t < WINDOW_S:
            t += rng.expovariate(per)
            start = max(t, free_at)
            free_at = start + rng.choice(service_us) / 1e6
            lat.append((free_at - t) * 1e3)
    return {"mean_ms": statistics.fmean(lat), "p99_ms": _pct(lat, 0.99)}


def _collections() -> int:
    return sum(g["collections"] for g in gc.get_stats())


def scale_row(instances: int, futures: int, loops: int, seed: int,
              freeze: bool = True, rounds: int = ROUNDS) -> dict[str, Any]:
    gc.collect()
    w = Workload(instances, futures, seed)
    if freeze:
        gc.collect()
        gc.freeze()
    gc_ = GlobalController(SrtfByStage(), period_s=0.1)
    first = global_loop(w, gc_)  # installs every session's priority once
    runs = []
    t = Timings()
    churn_cpu = churn_gc = 0.0
    collections = 0
    for _ in range(loops):
        n0, t0, c0 = _collections(), time.thread_time(), cpu_time()
        for _ in range(rounds):
            w.churn(t)
        churn_cpu += time.thread_time() - t0
        churn_gc += (time.thread_time() - t0) - (cpu_time() - c0)
        collections += _collections() - n0
        runs.append(global_loop(w, gc_))
    floor = clock_overhead_us()
    net = {step: _net(xs, floor) for step, xs in t.us.items()}
    net_gc = {step: _net(xs, floor) for step, xs in t.us_gc.items()}
    decisions = [a + b for a, b in zip(net["place"], net["dispatch"], strict=False)]
    with_gc = [a + b for a, b in zip(net_gc["place"], net_gc["dispatch"], strict=False)]
    events = [a + b for a, b in zip(decisions, net["finish"], strict=False)]
    central = central_service(futures, seed, samples=2000)
    gc.unfreeze()
    live = runs[-1]["live"]
    queueing: dict[str, float] = {}
    rng = random.Random(seed)
    serial = [d + rng.choice(central) for d in decisions]  # one server does both
    for rate in RATES:
        one = queue_latency_ms(serial, live * rate, 1, seed)
        two = queue_latency_ms(decisions, live * rate, instances, seed)
        queueing |= {f"one_level_utilisation@{rate:g}":
                     live * rate * statistics.fmean(serial) / 1e6,
                     f"one_level_mean_ms@{rate:g}": one["mean_ms"],
                     f"one_level_p99_ms@{rate:g}": one["p99_ms"],
                     f"two_level_mean_ms@{rate:g}": two["mean_ms"],
                     f"two_level_p99_ms@{rate:g}": two["p99_ms"]}
    row = {"instances": instances, "futures": futures, "live": live,
           "first_loop_ms": first["loop_ms"], "first_loop_decisions": first["decisions"],
           "loop_ms_median": statistics.median(r["loop_ms"] for r in runs),
           "loop_ms_max": max(r["loop_ms"] for r in runs),
           "loop_wall_ms_median": statistics.median(r["loop_wall_ms"] for r in runs),
           **{f"{k}_median": statistics.median(r[k] for r in runs)
              for k in ("collect_ms", "policy_ms", "install_ms", "decisions")},
           "decision_samples": len(decisions), "clock_overhead_us": floor,
           **{f"{step}_us_{q}": _pct(net[step], p)
              for step in STEPS for q, p in (("p50", 0.5), ("p99", 0.99))},
           "decision_us_p50": _pct(decisions, 0.5), "decision_us_p99": _pct(decisions, 0.99),
           "decision_us_p999": _pct(decisions, 0.999),
           "decision_with_gc_us_p50": _pct(with_gc, 0.5),
           "decision_with_gc_us_p99": _pct(with_gc, 0.99),
           "event_us_p50": _pct(events, 0.5), "event_us_p99": _pct(events, 0.99),
           "finish_with_gc_us_p99": _pct(net_gc["finish"], 0.99),
           "gc_collections_per_1000_calls": 1000 * collections / len(t.us["place"]),
           "gc_us_per_call": churn_gc * 1e6 / len(t.us["place"]),
           "churn_us_per_call": churn_cpu * 1e6 / len(t.us["place"]),
           "central_service_us_p50": _pct(central, 0.5),
           "central_service_us_p99": _pct(central, 0.99),
           "one_level_capacity_events_s": 1e6 / statistics.fmean(serial), **queueing}
    _check_settled(w)
    return row


def _check_settled(w: Workload) -> None:
    """The emulation really held the calls: every instance is running one."""
    view = w.c.view()
    running = sum(1 for f in view.futures if f.status is FutureStatus.RUNNING)
    assert running == len(w.running), (running, len(w.running))


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for n in sorted({r["instances"] for r in rows}):
        mine = sorted((r for r in rows if r["instances"] == n), key=lambda r: r["futures"])
        xs = [r["futures"] for r in mine]
        axes[0].plot(xs, [r["loop_ms_median"] for r in mine], "o-", label=f"{n} instances")
        axes[1].plot(xs, [r["decision_us_p99"] for r in mine], "o-", label=f"p99, {n}")
        axes[1].plot(xs, [r["decision_us_p50"] for r in mine], "x--", label=f"p50, {n}")
        axes[1].plot(xs, [r["decision_with_gc_us_p99"] for r in mine], ".:",
                     label=f"p99 with GC, {n}")
        rate = f"{RATES[-1]:g}"
        axes[2].plot(xs, [r[f"one_level_mean_ms@{rate}"] for r in mine], "o-",
                     label=f"one-level, {n}")
        axes[2].plot(xs, [r[f"two_level_mean_ms@{rate}"] for r in mine], "x--",
                     label=f"two-level, {n}")
    axes[0].axhline(TARGET_LOOP_MS, color="grey", ls=":", label="target")
    axes[1].axhline(TARGET_DECISION_US, color="grey", ls=":", label="target")
    titles = ("global loop, SRTF (ms CPU)", "local decision per call (µs CPU, less GC)",
              f"time to schedule one call (ms; {RATES[-1]:g} events/call/s, modelled)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("live futures")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    axes[2].set_yscale("log")
    fig.suptitle("two-level control on emulated instances (one core, Python)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def table(rows: list[dict[str, Any]]) -> str:
    rate = f"{RATES[-1]:g}"
    head = ("| instances | futures | loop ms (median / max) | collect / policy / install ms "
            "| decision µs p50 / p99 | with GC p99 | completion µs p50 / p99 "
            "| event µs p50 / p99 | GC µs per call | central event µs p50 / p99 "
            f"| one-level ms mean / p99 @{rate} | two-level ms mean / p99 @{rate} |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['instances']} | {r['futures']} | {r['loop_ms_median']:.1f} / "
            f"{r['loop_ms_max']:.1f} | {r['collect_ms_median']:.1f} / "
            f"{r['policy_ms_median']:.1f} / {r['install_ms_median']:.1f} | "
            f"{r['decision_us_p50']:.1f} / {r['decision_us_p99']:.1f} | "
            f"{r['decision_with_gc_us_p99']:.1f} | "
            f"{r['finish_us_p50']:.1f} / {r['finish_us_p99']:.1f} | "
            f"{r['event_us_p50']:.1f} / {r['event_us_p99']:.1f} | "
            f"{r['gc_us_per_call']:.2f} | "
            f"{r['central_service_us_p50']:.1f} / {r['central_service_us_p99']:.1f} | "
            f"{r[f'one_level_mean_ms@{rate}']:.3f} / {r[f'one_level_p99_ms@{rate}']:.3f}"
            f"{' (saturated)' if r[f'one_level_utilisation@{rate}'] >= 1 else ''} | "
            f"{r[f'two_level_mean_ms@{rate}']:.3f} / {r[f'two_level_p99_ms@{rate}']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="three sizes, 64 instances")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loops", type=int, default=LOOPS)
    p.add_argument("--rounds", type=int, default=ROUNDS, help="churn rounds per loop")
    p.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                   help="live futures, comma-separated (default: 1,024 ... 131,072)")
    p.add_argument("--instances", type=lambda v: tuple(int(x) for x in v.split(",")),
                   help="instance counts, comma-separated (default: 64,128)")
    p.add_argument("--no-freeze", action="store_true", help="leave the GC as it is")
    p.add_argument("--skip-imbalance", action="store_true",
                   help="only the control-scale part")
    args = p.parse_args(argv)
    sizes = args.sizes or ((1024, 16384, 131072) if args.quick else FUTURES)
    counts = args.instances or ((64,) if args.quick else INSTANCES)
    clock = Stopwatch()
    rows: list[dict[str, Any]] = []
    run: Callable[[int, int], dict[str, Any]] = \
        lambda n, f: scale_row(n, f, args.loops, args.seed, not args.no_freeze,  # noqa: E731
                               args.rounds)
    for n in counts:
        for f in sizes:
            rows.append(run(n, f))
            log(f"{n} instances, {f} futures: loop {rows[-1]['loop_ms_median']:.1f} ms, "
                f"decision p99 {rows[-1]['decision_us_p99']:.1f} µs ({clock.elapsed():.0f} s)")
    params = {"emulated": True, "agents": list(AGENTS), "fan_out": FAN_OUT,
              "loops": args.loops, "rounds_per_loop": args.rounds,
              "policy": SrtfByStage.name,
              "events_per_call_s": list(RATES), "window_s": WINDOW_S,
              "gc_freeze": not args.no_freeze,
              "clock": "thread CPU time less collections (daemon/policies/clock.cpu_time); "
                       "loops: time.thread_time_ns",
              "clock_overhead_us": clock_overhead_us(),
              "noise_reference": noise_reference(),
              "calibration_ms": calibrate(),
              "python": sys.version.split()[0], "targets": {
                  "loop_ms_at_131072": TARGET_LOOP_MS, "decision_us_p99": TARGET_DECISION_US}}
    path = save("runtime", params, rows)
    plot(rows, RESULTS / "runtime.png")
    print(table(rows))
    ref = params["noise_reference"]
    log(f"fixed reference work on this machine: p50 {ref['p50_us']:.1f} µs, "
        f"p99 {ref['p99_us']:.1f} µs (clock overhead {params['clock_overhead_us']:.2f} µs)")
    log(f"wrote {path} and runtime.png in {clock.elapsed():.0f} s")
    if args.skip_imbalance:
        return 0
    from bench import runtime_imbalance

    return runtime_imbalance.main(["--quick"] if args.quick else [])


if __name__ == "__main__":
    sys.exit(main())
