"""Hot-swapping policies under load: swap latency and dispatch stalls, per layer.

    python -m bench.policy_swap [--rounds N] [--baseline-s S] [--concurrency C]
                                [--isolation pin|nice|none] [--probe-dir DIR]
    ->  bench/results/policy_swap.json, policy_swap.png

A real daemon (SQLite store, trace on, two sim workers) serves steady traffic:
`--concurrency` closed-loop `openai` async clients in a separate process
(bench/policy_swap_load.py), one program each. The sim step time is scaled to zero by
default, so dispatches are as dense as the daemon makes them and a stall shows (at the
modelled speed a worker's batch finishes together and dispatches come in bursts one
step apart). First a phase without swaps (the baseline), then `--rounds` rounds; each
round, for each layer (kv, ordering, meta, admission), stores a new version of an
operator policy, alternating between two valid sources (bench/policy_swap_sources.py),
activates it and reads it back, sends a control request, and rolls it back.

The load generator would run on another machine; here it shares the cores, so by
default it runs at a lower priority and keeps off one core, which only the daemon uses
(`--isolation`, bench/policy_swap_isolation.py; `none` is how the benchmark ran before,
for comparison). A client at a lower priority waits longer for a CPU itself, and that
shows in send-to-dispatch (between writing a request's headers and its body, for one),
not in the daemon's wait below.

What is measured:
- store: PUT /v1/policies/NAME (validated against the live snapshot) until it answers.
- activate: from sending POST /v1/policies/NAME/activate until a read shows the version
  active: GET /v1/policies (the store) and, for the SLO layers, GET /v1/scheduling (the
  layer's guard in the daemon). `swap_us` is the daemon's own time for the swap itself.
- rollback: POST /v1/policies/NAME/rollback (the version before it runs again) until it
  answers.
- dispatch stalls: every request's `dispatched_at` (the daemon's time.time() when it
  sent the request to a worker; GET /v1/programs/ID lists them), sorted over all
  programs. For each window (the store, activate and rollback requests from sending to
  their answers, and a control request, GET /healthz, sent the same way after each swap)
  the longest gap between consecutive dispatches that overlaps it; and for windows of
  the activate windows' lengths laid at random over the phase without swaps (the
  baseline; bench/policy_swap_report.py). The control shows what any request to the
  daemon costs the dispatch cadence on this machine; the activate windows' excess over
  the baseline is what the whole activation request adds (its store transactions, the
  validation, the swap), and the loop hold below says how much of it is one stretch.
- what a dispatch gap is made of: with `--concurrency` closed-loop clients and workers
  that answer at once, a gap also holds the worker's answer, the client's turn (reading
  the answer, sending the next request) and the machine's scheduling of all three
  processes, not only the daemon. So the daemon's own part is measured too:
  send-to-dispatch latency, from the client's send of each request (time.time() as
  httpx hands it to the transport, bench/policy_swap_load.py) to its `dispatched_at`
  (same clock, same machine): the HTTP read, the gateway, queueing and the dispatch, all
  on the daemon's loop. Per phase (requests sent in the baseline, in the swap phase, in
  the activate windows) with the count over 10 ms.
- the daemon's event-loop thread: its share of wall time on a CPU and waiting for one
  (/proc/PID/task/PID/schedstat), in the baseline and the swap phase, to tell a stall
  caused by the daemon from one caused by a busy machine; and, after the load stopped
  (the SLO views still hold its last 60 s), the loop thread's CPU time while it serves
  one store, one activate, one rollback and one control request, per layer.
- loop hold: the daemon's own measure, in each store, activate and rollback answer
  (`loop_hold`, daemon/policies/loop_hold.py): the longest stretch the call ran on the
  event loop without awaiting, so that nothing else (no dispatch) could run; the stall
  the change itself causes, in wall time, and in wall and CPU time less garbage
  collection.
- the daemon's own scheduling ticks (SLO and KV), which hold the loop with or without
  swaps (bench/daemon_probe/sitecustomize.py, on the daemon's PYTHONPATH; it only
  measures).
- garbage collection: every collection of 1 ms or more in the daemon and its workers
  (the same probe), so that a dispatch gap can be told to hold a collection.
- the daemon's wait (bench/policy_swap_daemon_side.py): a dispatch stall as the daemon
  having a dispatchable request and not dispatching it. Per request, from the loop's
  read of the whole request (uvicorn parsed its body) to its dispatch, less any wait for a
  slot (no worker admitted it; then from the pump that dispatched it), by the daemon's
  clock (bench/daemon_probe/probe_intake.py); per window kind as above, the longest
  such wait that overlaps it, against the same baseline windows. With it the loop lag
  (bench/daemon_probe/probe_loop_watch.py): how late a 1 ms timer ran, which is what a
  request's bytes or a worker's answer waited before the loop read them, and where the
  loop thread was meanwhile.
- failed requests: client errors, non-finished answers and requests not `finished`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import RESULTS, log
from bench.policy_swap_analysis import (
    CALLS,
    WINDOWS,
    curves,
    gc_summary,
    loop_hold,
    per_layer,
    probe_path,
    read_probe,
    stalls,
    tick_summary,
)
from bench.policy_swap_daemon_side import daemon_side
from bench.policy_swap_isolation import MODES, default_mode, isolate
from bench.policy_swap_load import Load, LoadResult
from bench.policy_swap_report import STALL_TARGET_MS, gaps_between, pct, plot, summary
from bench.policy_swap_sources import SOURCES
from tests.daemon_process import DaemonProcess

READBACK_TIMEOUT_S = 2.0
SLO_LAYERS = ("ordering", "meta", "admission")


class SwapError(RuntimeError):
    pass


def _checked(r: httpx.Response, status: int, what: str) -> dict[str, Any]:
    if r.status_code != status:
        raise SwapError(f"{what}: HTTP {r.status_code}: {r.text[:400]}")
    body: dict[str, Any] = r.json()
    return body


def _running(c: httpx.Client, layer: str) -> tuple[tuple[str, int] | None, Any]:
    """What the store says is active on `layer`, and what the layer's guard runs (the
    SLO layers; None for kv, whose guard the API does not show)."""
    rows = _checked(c.get("/v1/policies"), 200, "list policies")["data"]
    stored = next(((p["name"], p["active_version"]) for p in rows
                   if p["layer"] == layer and p["active"]), None)
    if layer not in SLO_LAYERS:
        return stored, None
    live = _checked(c.get("/v1/scheduling"), 200, "scheduling status")["policies"][layer]
    return stored, (live["name"], live["version"])


def _wait_active(c: httpx.Client, layer: str, name: str, version: int) -> str | None:
    """None once a read shows (name, version) active; else what runs instead."""
    deadline = time.perf_counter() + READBACK_TIMEOUT_S
    while True:
        stored, live = _running(c, layer)
        if stored == (name, version) and live in (None, (name, version)):
            return None
        if time.perf_counter() > deadline:
            return f"store: {stored}, guard: {live}"
        time.sleep(0.001)


def _timed(request: Any) -> tuple[tuple[float, float], Any]:
    start = time.time()
    response = request()
    return (start, time.time()), response


def swap_once(c: httpx.Client, layer: str, variant: int, pause_s: float) -> dict[str, Any]:
    """Store, activate and read back one version; one control request; roll it back."""
    name, sources = SOURCES[layer]
    store, r = _timed(lambda: c.put(f"/v1/policies/{name}", json={
        "layer": layer, "source": sources[variant]}))
    stored = _checked(r, 201, f"store {name}")
    if not stored["validation"]["ok"]:
        raise SwapError(f"{name} failed validation: {stored['validation']['errors']}")
    version = int(stored["version"])
    time.sleep(pause_s)
    started = time.perf_counter()
    activate, r = _timed(lambda: c.post(f"/v1/policies/{name}/activate",
                                        json={"version": version}))
    answer = _checked(r, 200, f"activate {name} v{version}")
    instead = (f"when it answered, {answer['active']} was active"
               if answer["active"] != {"name": name, "version": version}
               else _wait_active(c, layer, name, version))
    activate_ms = 1000 * (time.perf_counter() - started)
    if instead is not None:
        log(f"  {name} v{version} did not stay active: {instead}")
    time.sleep(pause_s)
    control, r = _timed(lambda: c.get("/healthz"))
    _checked(r, 200, "healthz")
    time.sleep(pause_s)
    rollback, undone = _timed(lambda: _rollback(c, name))
    return {"layer": layer, "version": version, "store": store, "activate": activate,
            "control": control, "rollback": rollback, "store_ms": _ms(store),
            "activate_ms": activate_ms, "answer_ms": _ms(activate), "rollback_ms": _ms(rollback),
            "swap_us": float(answer["swap_us"]), "not_active": instead,
            "rolled_back": undone is not None,
            "hold": {"store": stored["loop_hold"], "activate": answer["loop_hold"],
                     "rollback": undone["loop_hold"] if undone is not None else None}}


def _rollback(c: httpx.Client, name: str) -> dict[str, Any] | None:
    """The rollback's answer; None when the meta loop has switched the ordering policy
    since the activation, leaving nothing to roll back."""
    r = c.post(f"/v1/policies/{name}/rollback")
    if r.status_code == 409 and r.json()["error"]["code"] == "not_active":
        return None
    return _checked(r, 200, f"rollback {name}")


def _ms(window: tuple[float, float]) -> float:
    return 1000 * (window[1] - window[0])


def dispatch_times(c: httpx.Client, programs: list[str]
                   ) -> tuple[list[float], dict[str, int], dict[str, list[float | None]]]:
    """Every dispatch time, sorted; requests by status; each program's dispatch times
    in the order it sent them (the store lists them by `queued_at`)."""
    times: list[float] = []
    statuses: dict[str, int] = {}
    per_program: dict[str, list[float | None]] = {}
    for pid in programs:
        r = c.get(f"/v1/programs/{pid}")
        if r.status_code == 404:
            continue
        mine = per_program.setdefault(pid, [])
        for req in _checked(r, 200, f"program {pid}")["requests"]:
            statuses[req["status"]] = statuses.get(req["status"], 0) + 1
            at = req["dispatched_at"]
            mine.append(None if at is None else float(at))
            if at is not None:
                times.append(float(at))
    return sorted(times), statuses, per_program


def dispatch_latencies(sent: dict[str, list[float]], dispatched: dict[str, list[float | None]]
                       ) -> tuple[list[tuple[float, float]], int]:
    """(send time, seconds from the client's send to the daemon's dispatch) per request,
    pairing each program's sends and requests in order; and how many programs could not
    be paired (a send that never reached the daemon shifts the pairs, so none count)."""
    out: list[tuple[float, float]] = []
    unpaired = 0
    for pid, sends in sent.items():
        times = dispatched.get(pid, [])
        if len(times) != len(sends):
            unpaired += 1
            continue
        out.extend((a, b - a) for a, b in zip(sends, times, strict=True) if b is not None)
    return out, unpaired


def trace_summary(c: httpx.Client) -> dict[str, Any]:
    """Daemon-level scheduling events by kind, and every rollback but the benchmark's own
    (a failing version, the meta loop's guard) with its reason."""
    counts: dict[str, int] = {}
    rollbacks: list[dict[str, Any]] = []
    after = 0
    while True:
        page = _checked(c.get("/v1/scheduling/trace", params={"after": after, "limit": 5000}),
                        200, "scheduling trace")
        for e in page["data"]:
            key = e["kind"] + (":startup" if e["data"].get("by") == "startup" else "")
            counts[key] = counts.get(key, 0) + 1
            if e["kind"] in ("policy.rolled_back", "ordering.rollback") and not str(
                    e["data"].get("reason", "")).startswith("operator rollback"):
                rollbacks.append({"ts": e["ts"], "kind": e["kind"], **e["data"]})
        if page["next_after"] is None:
            return {"events": counts, "rollbacks": rollbacks}
        after = page["next_after"]


def _schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting for one) of the daemon's event-loop thread."""
    try:
        run_ns, wait_ns, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return (0.0, 0.0)
    return (int(run_ns) / 1e9, int(wait_ns) / 1e9)


def _cpu_shares(a: tuple[float, float, float], b: tuple[float, float, float]) -> dict[str, float]:
    wall = max(1e-9, b[0] - a[0])
    return {"on_cpu": round((b[1] - a[1]) / wall, 3),
            "waiting_for_cpu": round((b[2] - a[2]) / wall, 3)}


def loop_cost(c: httpx.Client, pid: int, repeats: int, first_variant: int) -> dict[str, Any]:
    """CPU ms of the daemon's event-loop thread while it serves each request, with no
    traffic: store, activate (without the read back), rollback and the control, per
    layer."""
    out: dict[str, Any] = {}
    for layer, (name, sources) in SOURCES.items():
        spent: dict[str, list[float]] = {"store": [], "activate": [], "rollback": [],
                                         "control": []}
        for k in range(repeats):
            marks = [_schedstat(pid)[0]]
            r = c.put(f"/v1/policies/{name}", json={
                "layer": layer, "source": sources[(first_variant + k) % 2]})
            version = _checked(r, 201, f"store {name}")["version"]
            marks.append(_schedstat(pid)[0])
            _checked(c.post(f"/v1/policies/{name}/activate", json={"version": version}),
                     200, f"activate {name}")
            marks.append(_schedstat(pid)[0])
            _rollback(c, name)
            marks.append(_schedstat(pid)[0])
            _checked(c.get("/healthz"), 200, "healthz")
            marks.append(_schedstat(pid)[0])
            for key, a, b in zip(spent, marks, marks[1:], strict=False):
                spent[key].append(1000 * (b - a))
            time.sleep(0.05)
        out[layer] = {key: {"min": round(min(v), 2), "p50": round(pct(v, 50), 2)}
                      for key, v in spent.items()}
    return out


def drive(d: DaemonProcess, args: argparse.Namespace) -> dict[str, Any]:
    c = httpx.Client(base_url=d.url, headers=d.auth_headers(), timeout=30)
    assert d.proc is not None
    pid = d.proc.pid

    def mark() -> tuple[float, float, float]:
        return (time.time(), *_schedstat(pid))

    swaps: list[dict[str, Any]] = []
    windows: list[int] = []  # completions in the SLO long window after each round
    with Load(d.url, d.token, args.concurrency) as load:
        isolation = isolate(args.isolation, pid, load.pid)
        log(f"isolation: {isolation}")
        time.sleep(args.warmup_s)
        m0 = mark()
        log(f"baseline: {args.baseline_s:.0f} s of load without swaps")
        time.sleep(args.baseline_s)
        m1 = mark()
        for n in range(args.rounds):
            for layer in SOURCES:
                swaps.append(swap_once(c, layer, n % 2, args.pause_s))
                time.sleep(args.pause_s)
            last = swaps[-len(SOURCES):]
            windows.append(int(_checked(c.get("/v1/scheduling"), 200, "scheduling status")[
                "window"]["completions"]))
            log(f"round {n + 1}/{args.rounds}: " + "  ".join(
                f"{s['layer']} v{s['version']} {s['activate_ms']:.1f} ms" for s in last)
                + f"; {windows[-1]} completions in the long window")
        m2 = mark()
        time.sleep(1.0)
    log(f"load: {load.result.sent} sent, {load.result.ok} ok, "
        f"{len(load.result.errors)} failed; the loop thread's CPU per request, no traffic")
    cost = loop_cost(c, pid, args.cost_repeats, args.rounds % 2)
    dispatches, statuses, per_program = dispatch_times(c, load.result.programs)
    latencies, unpaired = dispatch_latencies(load.result.sent_at, per_program)
    return {"swaps": swaps, "windows": windows, "base": (m0[0], m1[0]),
            "swap_phase": (m1[0], m2[0]), "latencies": latencies, "unpaired": unpaired,
            "load": load.result, "dispatches": dispatches, "statuses": statuses,
            "trace": trace_summary(c), "loop_cpu_ms_per_request": cost, "isolation": isolation,
            "loop_thread": {"baseline": _cpu_shares(m0, m1), "swap_phase": _cpu_shares(m1, m2)}}


def report(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    load: LoadResult = run["load"]
    d, base, phase = run["dispatches"], run["base"], run["swap_phase"]
    not_finished = sum(n for s, n in run["statuses"].items() if s != "finished")
    overall = stalls(run, run["swaps"])
    hold = {call: loop_hold(run["swaps"], call) for call in CALLS}
    act, ctl = overall["stall_during_activate"], overall["stall_during_control"]
    latency = dispatch_latency(run)
    own = daemon_side(run, {kind: [s[kind] for s in run["swaps"]] for kind in WINDOWS})
    waits, lag = own["stall_by_window"], own["loop_lag_by_window"]
    return {
        "benchmark": "policy_swap", "workers": 2,
        "engine": f"sim (step time scale {args.time_scale})", "machine_cores": os.cpu_count(),
        "machine_load_1m": os.getloadavg()[0], "isolation": run["isolation"],
        "params": {k: v for k, v in vars(args).items() if k not in ("out", "probe_dir")},
        "method": (__doc__ or "").split("What is measured:", 1)[1].strip(),
        "target": {"stall_ms": STALL_TARGET_MS, "failed_requests": 0},
        "load": {"sent": load.sent, "ok": load.ok, "failed": len(load.errors),
                 "errors": load.errors[:5], "requests_by_status": run["statuses"],
                 "not_finished": not_finished,
                 "dispatches_per_s": round(len(d) / max(1e-9, d[-1] - d[0]), 1) if d else 0,
                 # what a meta policy's live snapshot walks (the long view)
                 "long_window_completions": summary(run["windows"], 0)},
        "daemon_loop_thread": run["loop_thread"],
        "loop_cpu_ms_per_request": run["loop_cpu_ms_per_request"],
        "garbage_collections": gc_summary(run), "collector_at_exit": run["exit"],
        "scheduling_ticks": tick_summary(run),
        "dispatch_gaps_ms": {
            "baseline": summary([1000 * g for g in gaps_between(d, *base)], 3),
            "swap_phase": summary([1000 * g for g in gaps_between(d, *phase)], 3)},
        "dispatch_latency_ms": latency,
        "daemon_side": own,
        "all_layers": {**overall, **{f"loop_hold_{call}": h for call, h in hold.items()}},
        "layers": per_layer(run), "trace": run["trace"],
        "verdict": {
            "failed_requests": len(load.errors) + not_finished,
            "unplanned_rollbacks": len(run["trace"]["rollbacks"]),
            "swaps_not_confirmed": sum(s["not_active"] is not None for s in run["swaps"]),
            "longest_loop_hold_ms": {call: {k: h[f"{k}_ms"]["max"] for k in (
                "wall", "wall_less_gc", "cpu_less_gc")} for call, h in hold.items()},
            "calls_holding_the_loop_over_10ms": {call: {k: h[f"over_10ms_{k}"] for k in (
                "wall_less_gc", "cpu_less_gc")} for call, h in hold.items()},
            "dispatch_latency_over_10ms": {
                phase: latency[phase]["over_10ms"] for phase in ("baseline", "swap_phase")},
            "dispatch_latency_p99_ms": {
                phase: latency[phase]["p99"] for phase in ("baseline", "swap_phase")},
            "worst_activate_stall_ms": act["stall_ms"]["max"],
            "worst_activate_stall_ms_no_gc": act["stall_ms_no_gc"]["max"],
            "activations_over_10ms": act["over_10ms"],
            "activations_over_10ms_no_gc": act["over_10ms_no_gc"],
            "control_requests_over_10ms": ctl["over_10ms"],
            "control_requests_over_10ms_no_gc": ctl["over_10ms_no_gc"],
            "baseline_windows_over_10ms_share": act["baseline_over_10ms_share"],
            "daemon_wait_over_10ms": {
                phase: v["over_10ms"] for phase, v in own["requests"].items()},
            "daemon_wait_p99_ms": {
                phase: v["daemon_wait_ms"]["p99"] for phase, v in own["requests"].items()},
            "worst_activate_daemon_stall_ms": waits["activate"]["stall_ms"]["max"],
            "activations_with_daemon_stall_over_10ms": waits["activate"]["over_10ms"],
            "baseline_windows_with_daemon_stall_over_10ms_share":
                waits["activate"]["baseline_over_10ms_share"],
            "loop_lags_over_10ms": {
                phase: v["over_10ms"] for phase, v in own["loop_lag"].items()},
            "worst_activate_loop_lag_ms": lag["activate"]["stall_ms"]["max"],
            "activate_minus_control_ms": overall["activate_minus_control_ms"]},
    }


def dispatch_latency(run: dict[str, Any]) -> dict[str, Any]:
    """Send-to-dispatch latency (ms) of the requests sent in each phase, and in the
    windows of the activate requests."""
    lat = run["latencies"]

    def within(a: float, b: float) -> list[float]:
        return [1000 * d for t, d in lat if a <= t <= b]

    out: dict[str, Any] = {"unpaired_programs": run["unpaired"]}
    for phase in ("base", "swap_phase"):
        values = within(*run[phase])
        key = "baseline" if phase == "base" else phase
        out[key] = {**summary(values, 3),
                    "over_10ms": sum(v > STALL_TARGET_MS for v in values)}
    during = [v for s in run["swaps"] for v in within(*s["activate"])]
    out["during_activate"] = {**summary(during, 3),
                              "over_10ms": sum(v > STALL_TARGET_MS for v in during)}
    return out


def _cells(stats: dict[str, float], keys: tuple[str, ...] = ("p50", "p99", "max")) -> str:
    return "/".join(f"{stats[k]:.1f}" for k in keys)


def _table(out: dict[str, Any]) -> None:
    """Per layer (ms): request latencies p50/p99 (activate: until a read shows it active);
    the longest stretch each call held the event loop, CPU less GC, p99/max; dispatch
    stalls of GC-free windows p50/p99/max: activate, control, baseline."""
    log(f"{'layer':<10} {'activate':>11} {'store':>10} {'rollback':>10} | loop hold CPU "
        f"p99/max: {'store':>10} {'activate':>10} {'rollback':>10} | stall no-GC: "
        f"{'activate':>15} {'control':>15} {'baseline':>15}")
    for layer, s in {**out["layers"], "all": out["all_layers"]}.items():
        lat = " ".join(f"{_cells(s[f'{k}_ms'], ('p50', 'p99')):>{w}}" for k, w in (
            ("activate", 11), ("store", 10), ("rollback", 10))) if "store_ms" in s else " " * 33
        holds = " ".join(f"{_cells(s[f'loop_hold_{c}']['cpu_less_gc_ms'], ('p99', 'max')):>10}"
                         for c in CALLS)
        act, ctl = s["stall_during_activate"], s["stall_during_control"]
        log(f"{layer:<10} {lat} | {'':>21}{holds} | {'':>13}"
            f"{_cells(act['stall_ms_no_gc']):>15} {_cells(ctl['stall_ms_no_gc']):>15} "
            f"{_cells(act['baseline_stall_ms_no_gc']):>15}")
    load = out["load"]
    log(f"load: {load['dispatches_per_s']} dispatches/s, {load['failed']} failed; completions "
        f"in the SLO long window (the meta snapshot) p50/max: "
        f"{load['long_window_completions']['p50']:.0f}/{load['long_window_completions']['max']:.0f}")
    log("event-loop CPU per request, no traffic, p50 ms: " + "  ".join(
        f"{layer}: " + " ".join(f"{k} {v[k]['p50']}" for k in v)
        for layer, v in out["loop_cpu_ms_per_request"].items()))
    log("the daemon's own ticks (ms, less GC, p50/p99/max): " + "  ".join(
        f"{kind} {_cells(t['wall_less_gc_ms'])} ({t['over_1ms']} over 1 ms)"
        for kind, t in out["scheduling_ticks"].items()))
    for key, title in (("dispatch_latency_ms", "send-to-dispatch latency"),
                       ("dispatch_gaps_ms", "gaps between dispatches")):
        log(f"{title} (ms) p50/p99/max: " + "  ".join(
            f"{phase} {_cells(v)}" for phase, v in out[key].items() if isinstance(v, dict)))
    _daemon_table(out["daemon_side"])
    log(f"collections of 1 ms or more: {json.dumps(out['garbage_collections'])}; "
        f"at exit: {out['collector_at_exit']}")
    log(f"verdict: {json.dumps(out['verdict'])}")


def _daemon_table(own: dict[str, Any]) -> None:
    log("daemon wait per request (ms) p50/p99/max, over 10 ms: " + "  ".join(
        f"{phase} {_cells(v['daemon_wait_ms'])}, {v['over_10ms']} "
        f"({v['dispatched_later']} waited for a slot; the client's headers-to-body "
        f"{_cells(v['headers_to_body_ms'])})" for phase, v in own["requests"].items()))
    log("loop lag (ms, lags of 4 ms or more) p50/p99/max, over 10 ms (on CPU 10 ms+ / "
        "mostly waiting for a CPU): " + "  ".join(
            f"{phase} {_cells(v['lag_ms'])}, {v['over_10ms']} ({v['over_10ms_on_cpu']}/"
            f"{v['over_10ms_mostly_waiting_for_cpu']})" for phase, v in own["loop_lag"].items()))
    for key, title in (("stall_by_window", "daemon stall"), ("loop_lag_by_window", "loop lag")):
        log(f"{title} per window (ms) p50/p99/max [baseline]: " + "  ".join(
            f"{kind} {_cells(v['stall_ms'])} [{_cells(v['baseline_stall_ms'])}]"
            for kind, v in own[key].items()))
    log("token lookups in the store (ms) p50/p99/max, daemon waits > 10 ms overlapping "
        "one: " + "  ".join(
            f"{phase} {_cells(v['token_lookup_ms'])}, {v['of_which_overlap_a_lookup']}/"
            f"{v['daemon_waits_over_10ms']}" for phase, v in own["store_waits"].items()))
    for phase, v in own["loop_lag"].items():
        for place, n in v["over_10ms_where"].items():
            log(f"  {phase} lag > 10 ms: {n:4d} samples at {place}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--baseline-s", type=float, default=25.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--pause-s", type=float, default=0.3, help="between two swaps")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--cost-repeats", type=int, default=10,
                    help="requests per layer in the no-traffic CPU measurement")
    ap.add_argument("--time-scale", type=float, default=0.0,
                    help="sim step-time scale (0: zero-cost engine, dispatches densest)")
    ap.add_argument("--isolation", choices=MODES, default=default_mode(),
                    help="how the clients keep off the daemon's CPU (pin: the daemon gets "
                         "a core of its own; nice: clients run at a lower priority)")
    ap.add_argument("--probe-dir", type=Path, default=None,
                    help="keep the daemon probe's records here (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=RESULTS / "policy_swap.json")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        probe = args.probe_dir or Path(tmp) / "probe"
        probe.mkdir(parents=True, exist_ok=True)
        d = DaemonProcess(data_dir=Path(tmp) / "data", workers=2, env={
            "AGENTD_LOG_LEVEL": "warning", "AGENTD_SIM_TIME_SCALE": str(args.time_scale),
            "AGENTD_BENCH_PROBE": str(probe), "PYTHONPATH": probe_path()})
        d.start()
        try:
            run = drive(d, args)
        finally:
            d.stop()
        run.update(read_probe(probe))
    out = report(run, args)
    plot(out["layers"], curves(run), args.out.with_suffix(".png"))
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    _table(out)
    log(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0 if out["verdict"]["failed_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
