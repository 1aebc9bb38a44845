"""Soak test: mixed gateway and workflow load on sim workers, a worker killed every few
minutes, for N minutes. Not part of CI (`make soak`).

A real daemon (default heartbeat settings, so a killed worker is noticed after ~3 s)
with three sim workers. Load:
- gateway clients: programs of 1-4 turns, half of the requests streamed, 8-48 tokens
  each, every program released at its end;
- workflow runs: one every few seconds, each in a session of its own, two agents making
  LLM calls and a managed list the run appends its number to.
Every `--kill-every` seconds one healthy worker is SIGKILLed; the supervisor restarts it.

What is counted (the target for lost and duplicated is zero):
- lost: a request that got no complete answer (error status, broken stream, timeout);
- duplicated: the daemon holds more request records for a program than the client sent,
  or an answer's words are not exactly `sim0 ... sim{n-1}` (a failover that re-emitted or
  dropped tokens shows there);
- runs that failed, and sessions whose managed list is not exactly [their run number];
- processes the runs' jails killed when they ended: these runs leave none, so any is a
  process that was not theirs (a jail that once took the next run's sandbox for its own);
- the daemon's RSS over time (growth, slope), p50/p99 latency per window.

Run: python -m bench.soak [--minutes 30] [--kill-every 180] [--out soak]
Writes bench/results/<out>.json and <out>.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import RESULTS, log, save
from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"
REQUEST_TIMEOUT_S = 120.0
WORKFLOW = '''import agentd


@agentd.agent
class Writer:
    def write(self, topic: str) -> str:
        return agentd.llm([{"role": "user", "content": f"write about {topic}"}], max_tokens=12)


@agentd.agent
class Critic:
    def review(self, text: str) -> str:
        return agentd.llm([{"role": "user", "content": f"review: {text}"}], max_tokens=6)


def main(n: int) -> dict:
    done = agentd.ManagedList("done")
    review = Critic().review(Writer().write(f"topic {n}"))
    done.append(n)
    return {"n": n, "review": str(review)}
'''


@dataclass
class Call:
    t: float  # seconds since the soak started
    latency_s: float
    program: str
    ok: bool
    stream: bool
    error: str = ""
    garbled: bool = False


@dataclass
class Tally:
    started: float = field(default_factory=time.time)
    calls: list[Call] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # program -> requests sent
    runs: list[dict[str, Any]] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (t, MiB)
    kills: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return time.time() - self.started


def _words_ok(text: str, n: int) -> bool:
    return text.split() == [f"sim{i}" for i in range(n)]


async def _chat(http: httpx.AsyncClient, program: str, session: str, stream: bool,
                n: int) -> tuple[bool, bool, str]:
    """(ok, garbled, error) of one chat completion with n output tokens."""
    body = {"model": MODEL, "max_tokens": n, "stream": stream, "program_id": program,
            "session_id": session, "messages": [{"role": "user", "content": f"turn of {program}"}]}
    if not stream:
        r = await http.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            return False, False, f"{r.status_code}: {r.text[:120]}"
        text = r.json()["choices"][0]["message"]["content"]
        return True, not _words_ok(text, n), ""
    pieces, done = [], False
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return False, False, f"{r.status_code}: {(await r.aread())[:120]!r}"
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return False, False, str(chunk["error"])[:120]
                for choice in chunk.get("choices", []):
                    pieces.append(choice.get("delta", {}).get("content") or "")
    if not done:
        return False, False, "stream ended without [DONE]"
    return True, not _words_ok("".join(pieces), n), ""


async def _gateway_client(http: httpx.AsyncClient, tally: Tally, cid: int, until: float,
                          rng: random.Random) -> None:
    k = 0
    while time.time() < until:
        program, session = f"soak-p{cid}-{k}", f"soak-s{cid}"
        k += 1
        for _ in range(rng.randint(1, 4)):
            stream, n = rng.random() < 0.5, rng.randint(8, 48)
            tally.sent[program] = tally.sent.get(program, 0) + 1
            t0 = time.time()
            try:
                ok, garbled, error = await asyncio.wait_for(
                    _chat(http, program, session, stream, n), REQUEST_TIMEOUT_S)
            except (httpx.HTTPError, TimeoutError, ValueError) as exc:
                ok, garbled, error = False, False, f"{type(exc).__name__}: {exc}"[:160]
            tally.calls.append(Call(t0 - tally.started, time.time() - t0, program, ok, stream,
                                    error, garbled))
        await http.post(f"/v1/programs/{program}/release")


async def _workflow_runs(http: httpx.AsyncClient, tally: Tally, until: float,
                         every_s: float) -> None:
    r = await http.post("/v1/workflows", json={"name": "soak", "files": {"main.py": WORKFLOW},
                                               "entry": "main:main"})
    r.raise_for_status()
    n, pending = 0, []
    while time.time() < until:
        pending.append(asyncio.create_task(_one_run(http, tally, n)))
        n += 1
        await asyncio.sleep(every_s)
    await asyncio.gather(*pending)


async def _one_run(http: httpx.AsyncClient, tally: Tally, n: int) -> None:
    t0 = time.time()
    r = await http.post("/v1/runs", json={"workflow": "soak", "args": {"n": n},
                                          "session_id": f"soak-wf-{n}"})
    if r.status_code != 201:
        tally.runs.append({"n": n, "status": f"refused {r.status_code}", "t": t0 - tally.started})
        return
    run_id = r.json()["id"]
    view: dict[str, Any] = {}
    while time.time() - t0 < REQUEST_TIMEOUT_S * 2:
        await asyncio.sleep(0.5)
        view = (await http.get(f"/v1/runs/{run_id}")).json()
        if view.get("status") in ("finished", "failed", "cancelled"):
            break
    error = view.get("error") or {}
    tally.runs.append({"n": n, "id": run_id, "status": view.get("status"),
                       "reason": error.get("reason"), "t": t0 - tally.started,
                       "duration_s": time.time() - t0,
                       **({"message": str(error.get("message"))[:2000],
                           "log_tail": str(view.get("log_tail"))[-1500:]}
                          if view.get("status") != "finished" else {})})


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _sample_rss(tally: Tally, pid: int, until: float) -> None:
    while time.time() < until:
        tally.rss.append((tally.now(), _rss_mib(pid)))
        await asyncio.sleep(5)


async def _killer(http: httpx.AsyncClient, tally: Tally, until: float, every_s: float,
                  rng: random.Random) -> None:
    while time.time() + every_s < until:
        await asyncio.sleep(every_s)
        workers = [w for w in (await http.get("/v1/workers")).json()["data"]
                   if w["status"] == "healthy" and w.get("pid")]
        if not workers:
            continue
        victim = rng.choice(workers)
        os.kill(victim["pid"], signal.SIGKILL)
        tally.kills.append({"t": tally.now(), "worker": victim["id"], "pid": victim["pid"]})
        log(f"[{tally.now():6.0f}s] killed {victim['id']} (pid {victim['pid']})")


async def _progress(tally: Tally, until: float) -> None:
    while time.time() < until:
        await asyncio.sleep(30)
        ok = sum(c.ok for c in tally.calls)
        log(f"[{tally.now():6.0f}s] {len(tally.calls)} requests ({ok} ok), "
            f"{len(tally.runs)} runs done, rss {tally.rss[-1][1] if tally.rss else 0:.0f} MiB")


async def _soak(d: DaemonProcess, args: argparse.Namespace) -> Tally:
    tally = Tally()
    until = time.time() + args.minutes * 60
    rng = random.Random(args.seed)
    assert d.proc is not None
    limits = httpx.Limits(max_connections=args.clients * 2 + 16)
    async with httpx.AsyncClient(base_url=d.url, headers=d.auth_headers(), limits=limits,
                                 timeout=REQUEST_TIMEOUT_S) as http:
        await asyncio.gather(
            *(_gateway_client(http, tally, c, until, random.Random(rng.random()))
              for c in range(args.clients)),
            _workflow_runs(http, tally, until, args.run_every),
            _sample_rss(tally, d.proc.pid, until),
            _killer(http, tally, until, args.kill_every, rng),
            _progress(tally, until))
        tally.rss.append((tally.now(), _rss_mib(d.proc.pid)))
    return tally


def _daemon_records(db: Path) -> dict[str, dict[str, int]]:
    """Per program: request records the daemon stored, and how many failed over."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select program_id, count(*), sum(failovers) from requests "
                            "where program_id like 'soak-p%' group by program_id")
        return {p: {"records": n, "failovers": f or 0} for p, n, f in rows}


def _reaper_kills(db: Path) -> int:
    """Processes the soak runs' jails killed at their end (their run.reaped events)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select data from trace_events where kind = 'run.reaped' "
                            "and session_id like 'soak-wf-%'")
        return sum(max(0, int(json.loads(data).get("processes_killed", 0))) for data, in rows)


def _state_mismatches(db: Path, runs: list[dict[str, Any]]) -> list[int]:
    """Finished runs whose session's stored managed list is not exactly [their number]
    (read from the store itself, after the daemon stopped)."""
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("select id, state from sessions where id like 'soak-wf-%'"))
    bad = []
    for run in runs:
        if run["status"] == "finished":
            state = json.loads(rows.get(f"soak-wf-{run['n']}") or "{}")
            if state.get("done") != [run["n"]]:
                bad.append(run["n"])
    return bad


def _windows(tally: Tally, width_s: float) -> list[dict[str, Any]]:
    out = []
    end = max((c.t for c in tally.calls), default=0.0)
    t = 0.0
    while t <= end:
        calls = [c for c in tally.calls if t <= c.t < t + width_s]
        lat = sorted(c.latency_s for c in calls if c.ok)
        rss = [m for s, m in tally.rss if t <= s < t + width_s]
        out.append({
            "t_s": t, "requests": len(calls), "failed": sum(not c.ok for c in calls),
            "p50_s": lat[len(lat) // 2] if lat else None,
            "p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
            "max_s": lat[-1] if lat else None,
            "rss_mib": statistics.fmean(rss) if rss else None})
        t += width_s
    return out


def _summary(db: Path, tally: Tally) -> dict[str, Any]:
    records = _daemon_records(db)
    failed = [c for c in tally.calls if not c.ok]
    extra = {p: records.get(p, {"records": 0})["records"] - n for p, n in tally.sent.items()
             if records.get(p, {"records": 0})["records"] > n}
    rss = [m for _, m in tally.rss]
    warm = [m for t, m in tally.rss if t >= 60] or rss
    slope = _slope([(t, m) for t, m in tally.rss if t >= 60]) * 60
    runs = tally.runs
    bad_runs = [r for r in runs if r["status"] != "finished"]
    return {
        "requests": len(tally.calls), "ok": len(tally.calls) - len(failed),
        "lost": len(failed), "lost_errors": _histogram(c.error for c in failed),
        "duplicated_records": sum(extra.values()), "programs_with_extra_records": extra,
        "garbled_answers": sum(c.garbled for c in tally.calls),
        "failovers": sum(r["failovers"] for r in records.values()),
        "workers_killed": len(tally.kills),
        "runs": len(runs), "runs_finished": len(runs) - len(bad_runs),
        "runs_failed": _histogram(str(r.get("reason") or r["status"]) for r in bad_runs),
        "runs_failed_examples": bad_runs[:5],
        "state_mismatches": _state_mismatches(db, runs),
        "reaper_kills": _reaper_kills(db),
        "rss_start_mib": rss[0] if rss else None, "rss_end_mib": rss[-1] if rss else None,
        "rss_growth_after_warmup_mib": (warm[-1] - warm[0]) if warm else None,
        "rss_slope_mib_per_min": slope,
        "p50_s": _pct([c.latency_s for c in tally.calls if c.ok], 0.5),
        "p99_s": _pct([c.latency_s for c in tally.calls if c.ok], 0.99),
        "max_s": max((c.latency_s for c in tally.calls if c.ok), default=None),
        "run_p50_s": _pct([r["duration_s"] for r in runs if "duration_s" in r], 0.5),
    }


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else None


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def _histogram(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key = str(item)[:100]
        out[key] = out.get(key, 0) + 1
    return out


def _plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    windows, kills = result["windows"], result["kills"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ts = [w["t_s"] / 60 for w in windows]
    axes[0].plot([t / 60 for t, _ in result["rss"]], [m for _, m in result["rss"]], "-")
    axes[0].set_ylabel("daemon RSS (MiB)")
    for key, style in (("p50_s", "o-"), ("p99_s", "s-"), ("max_s", "x:")):
        axes[1].plot(ts, [w[key] for w in windows], style, label=key.removesuffix("_s"))
    axes[1].set_ylabel("latency (s)")
    axes[1].legend()
    axes[2].bar(ts, [w["requests"] for w in windows], width=ts[1] - ts[0] if len(ts) > 1 else 0.5,
                align="edge", label="requests")
    axes[2].bar(ts, [w["failed"] for w in windows], width=ts[1] - ts[0] if len(ts) > 1 else 0.5,
                align="edge", color="red", label="failed")
    axes[2].set_ylabel("requests / window")
    axes[2].set_xlabel("minutes")
    axes[2].legend()
    for ax in axes:
        for k in kills:
            ax.axvline(k["t"] / 60, color="grey", linestyle=":", linewidth=1)
    s = result["summary"]
    axes[0].set_title(f"soak (sim workers, a worker killed every {result['params']['kill_every']:g}"
                      f" s): lost {s['lost']}, duplicated {s['duplicated_records']}, "
                      f"garbled {s['garbled_answers']}, runs failed "
                      f"{s['runs'] - s['runs_finished']}/{s['runs']}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=180.0, help="seconds")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8, help="concurrent gateway clients")
    parser.add_argument("--run-every", type=float, default=3.0, help="seconds between runs")
    parser.add_argument("--window", type=float, default=30.0, help="seconds per latency window")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="soak")
    args = parser.parse_args()
    env = {"AGENTD_HEARTBEAT_INTERVAL_S": "0.5", "AGENTD_HEARTBEAT_TIMEOUT_S": "3.0"}
    d = DaemonProcess(Path(tempfile.mkdtemp(prefix="agentd-soak-")) / "data",
                      workers=args.workers, env=env)
    d.start()
    try:
        log(f"soak: {args.minutes:g} min, {args.workers} sim workers, {args.clients} clients, "
            f"a run every {args.run_every:g} s, a worker killed every {args.kill_every:g} s")
        tally = asyncio.run(_soak(d, args))
    finally:
        d.stop()  # flushes the store; the accounting reads it directly
    summary = _summary(d.data_dir / "agentd.db", tally)
    result = {"params": vars(args), "summary": summary, "windows": _windows(tally, args.window),
              "rss": tally.rss, "kills": tally.kills, "simulated": True}
    path = save(args.out, vars(args), [result])
    _plot(result, RESULTS / f"{args.out}.png")
    log(json.dumps(summary, indent=2))
    log(f"wrote {path} and {RESULTS / (args.out + '.png')}")


if __name__ == "__main__":
    main()
