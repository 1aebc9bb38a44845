"""(c) of bench.tools: how much of an environment's setup is hidden as the queue wait grows.

One sim worker with 4096 KV tokens (the (b) daemon). Per point, a waiter program runs a
step (~800 tokens), a ~3.4k-token blocker arrives and the KV policy pauses the waiter.
The waiter declares a tool whose setup sleeps 2 s (preparation starts now) and sends
its next request, which waits in the global queue while the blocker generates; after
`wait_s` the blocker is released (its request aborted), the waiter is restored, runs its
step and calls the tool at once. At wait 0 there is no blocker: the declaration is
followed by the step and the call. The hidden share of setup is 1 - exec_waited /
prepare, from the daemon's trace; `ideal` is min(1, overlap / prepare), where overlap is
the time from the start of preparation to the tool call: what preparing ahead could hide.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any, Protocol

from bench.common import log

WAITER_WORDS = 800
BLOCKER_WORDS = 3400
# ~5.6 s of decoding on the sim at time scale 1 (measured 8 ms a token with this context),
# so the blocker still runs when it is released at a 4 s wait; its context stays < 4096.
BLOCKER_TOKENS = 680


class Api(Protocol):
    async def call(self, method: str, path: str, **kw: Any) -> Any: ...
    async def chat(self, program: str, words: int, max_tokens: int) -> None: ...
    async def exec(self, program: str, tool: str, command: str) -> dict[str, Any]: ...
    async def release(self, program: str) -> None: ...


async def wait_status(api: Api, program: str, status: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := (await api.call("GET", f"/v1/programs/{program}"))["status"]) != status:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{program} is {now}, not {status}, after {timeout}s")
        await asyncio.sleep(0.05)


async def _hold_queue(api: Api, waiter: str, blocker: str) -> asyncio.Future[None]:
    """Pause the waiter behind a blocker that keeps generating until it is released."""
    await api.chat(blocker, BLOCKER_WORDS, 2)
    # At once: a running request weighs fully, while two ACTING programs' weights decay
    # below the capacity within a KV check interval or two, and nobody would be paused.
    blocking = asyncio.ensure_future(api.chat(blocker, BLOCKER_WORDS, BLOCKER_TOKENS))
    await wait_status(api, waiter, "PAUSED")
    return blocking


async def point(api: Api, tool: str, wait_s: float, rep: int) -> dict[str, Any]:
    waiter, blocker = f"sweep-{wait_s:g}-{rep}-w", f"sweep-{wait_s:g}-{rep}-b"
    await api.chat(waiter, WAITER_WORDS, 2)
    blocking = await _hold_queue(api, waiter, blocker) if wait_s > 0 else None
    t0 = time.monotonic()
    await api.call("POST", f"/v1/programs/{waiter}/tools", json={"tools": [tool]})
    step = asyncio.ensure_future(api.chat(waiter, WAITER_WORDS, 2))
    blocker_ended_early = False
    if blocking is not None:
        await asyncio.sleep(max(wait_s - (time.monotonic() - t0), 0.0))
        blocker_ended_early = blocking.done()
        await api.release(blocker)  # aborts its request: the waiter's room opens now
        with contextlib.suppress(RuntimeError):
            await blocking
    await step
    result = await api.exec(waiter, tool, "cat ready")
    if result["stdout"] != "ready\n":
        raise RuntimeError(f"{waiter}: environment not set up: {result}")
    await api.release(waiter)
    return {"wait_s": wait_s, "rep": rep, "blocker_ended_early": blocker_ended_early,
            **await _trace_numbers(api, waiter)}


async def _trace_numbers(api: Api, program: str) -> dict[str, Any]:
    events = (await api.call("GET", f"/v1/sessions/{program}/trace",
                             params={"limit": 1000}))["data"]

    def first(kind: str, after: float = 0.0) -> dict[str, Any]:
        return next(e for e in events if e["kind"] == kind and e["ts"] >= after)

    queued = [e for e in events if e["kind"] == "request.queued"][1]
    dispatched = first("request.dispatched", queued["ts"])
    prep_start, prep_end = first("tool.prepare.start"), first("tool.prepare.end")
    exec_start, exec_end = first("tool.exec.start"), first("tool.exec.end")
    prepare_s = prep_end["data"]["duration_s"]
    overlap_s = exec_start["ts"] - prep_start["ts"]
    waited = exec_end["data"]["waited_s"]
    return {"queue_wait_s": dispatched["ts"] - queued["ts"], "prepare_s": prepare_s,
            "overlap_s": overlap_s, "exec_waited_s": waited,
            "hidden_fraction": 1 - waited / prepare_s,
            "ideal_hidden_fraction": min(1.0, overlap_s / prepare_s)}


async def run_sweep(api: Api, tool: str, waits: list[float], reps: int) -> list[dict[str, Any]]:
    rows = []
    for wait_s in waits:
        for rep in range(reps):
            row = await point(api, tool, wait_s, rep)
            rows.append(row)
            log(f"  wait {wait_s:g}s rep {rep}: queue wait {row['queue_wait_s']:.2f}s, "
                f"prepare {row['prepare_s']:.2f}s, call waited {row['exec_waited_s']:.2f}s, "
                f"hidden {100 * row['hidden_fraction']:.0f}% "
                f"(ideal {100 * row['ideal_hidden_fraction']:.0f}%)")
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("queue_wait_s", "overlap_s", "prepare_s", "exec_waited_s", "hidden_fraction",
            "ideal_hidden_fraction")
    out = []
    for wait_s in sorted({r["wait_s"] for r in rows}):
        mine = [r for r in rows if r["wait_s"] == wait_s]
        out.append({"wait_s": wait_s, "n": len(mine),
                    "blocker_ended_early": sum(r["blocker_ended_early"] for r in mine),
                    **{k: statistics.fmean(r[k] for r in mine) for k in keys}})
    return out


def report(summary: list[dict[str, Any]]) -> None:
    log("queue wait (target / measured) | prepare | call waited | hidden | ideal")
    for s in summary:
        log(f"  {s['wait_s']:4.1f}s / {s['queue_wait_s']:5.2f}s | {s['prepare_s']:5.2f}s | "
            f"{s['exec_waited_s']:5.2f}s | {100 * s['hidden_fraction']:4.0f}% | "
            f"{100 * s['ideal_hidden_fraction']:4.0f}%")


def plot(ax: Any, rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    ax.plot([r["queue_wait_s"] for r in rows], [100 * r["hidden_fraction"] for r in rows],
            "o", ms=4, alpha=0.5, label="programs")
    ax.plot([s["queue_wait_s"] for s in summary], [100 * s["hidden_fraction"] for s in summary],
            "-", label="hidden (mean)")
    ax.plot([s["queue_wait_s"] for s in summary],
            [100 * s["ideal_hidden_fraction"] for s in summary], "--",
            label="ideal: min(1, overlap / prepare)")
    ax.set(title="setup hidden vs queue wait", xlabel="queue wait (s)",
           ylabel="% of setup hidden", ylim=(-5, 105))
    ax.legend()
