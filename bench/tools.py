"""Tool benchmark: containers reclaimed at program end, and setup hidden by preparing ahead.

Real daemons (`agentd start`, sim workers) on a real Docker engine, driven only through
the public API.

(a) reclamation: N short programs, each one LLM step, one busybox container and a few MB
    written into it, then the program ends. Two daemons run side by side on one engine:
    "gc" is told each program ended (`POST /v1/programs/{id}/release`) and reclaims what it
    held; "no-gc" is never told, as with an orchestrator that does not know programs, so
    nothing is reclaimed. Containers and disk (from the engine's `df`, via
    `GET /v1/tools`) are sampled over time. Afterwards the no-gc programs are released
    too, and the time until the engine holds nothing of them is measured.
(b) preparation: one sim worker with 4096 KV tokens. Per round, WAITERS programs run a
    step, a ~3.6k-token blocker arrives and the KV policy pauses them all; their next
    request waits while the blocker generates. Their first tool call (an environment whose
    setup sleeps SETUP_S) follows as soon as the request returns. "declared" waiters
    declared the tool up front (prepared while they wait); "cold" ones did not.
(c) partial hiding: the hidden share of setup as the queue wait grows from 0 to past
    the setup time (bench/tools_sweep.py).

Run: python -m bench.tools [--programs N] [--rounds R] [--waits 0,0.5,1,2,4] [--parts ...]
Writes bench/results/tools.json and tools.png (tools_PARTS.* for a subset of the parts).
Needs a Docker engine (DOCKER_HOST, or `scripts/start-dockerd.sh` as root); builds the
busybox image if missing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import tools_sweep
from bench.common import RESULTS, log, save
from tests.daemon_process import DaemonProcess

REPO = Path(__file__).resolve().parents[1]
IMAGE = "agentd-busybox:latest"
MODEL = "sim-llama3-8b"
WRITE_MB = 4
SETUP_S = 2.0
WAITERS = 3
SAMPLE_S = 2.0
PARTS = ("gc", "prepare", "sweep")
CONFIG = f"""
[tools.box]
image = "{IMAGE}"
memory_mb = 64

[tools.slowenv]
image = "{IMAGE}"
setup = ["sleep {SETUP_S:g}", "echo ready > ready"]
"""


class Api:
    """The public REST API of one daemon, as a client uses it."""

    def __init__(self, d: DaemonProcess) -> None:
        self.http = httpx.AsyncClient(base_url=d.url, timeout=120,
                                      headers={"Authorization": f"Bearer {d.token}"})

    async def call(self, method: str, path: str, **kw: Any) -> Any:
        r = await self.http.request(method, path, **kw)
        if r.status_code != 200:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    async def chat(self, program: str, words: int, max_tokens: int) -> None:
        await self.call("POST", "/v1/chat/completions", json={
            "model": MODEL, "max_tokens": max_tokens, "program_id": program,
            "messages": [{"role": "user", "content": "word " * words}]})

    async def exec(self, program: str, tool: str, command: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.call(
            "POST", f"/v1/programs/{program}/tools/{tool}/exec", json={"command": command})
        return out

    async def release(self, program: str) -> None:
        await self.call("POST", f"/v1/programs/{program}/release")

    async def held(self) -> dict[str, float]:
        rows = (await self.call("GET", "/v1/tools"))["data"]
        errors = [r for r in rows if r["resource"] == "error"]
        if errors:
            raise RuntimeError(f"tool backend error: {errors[0]['error']}")
        docker = [r for r in rows if r["backend"] == "docker"]
        return {"containers": sum(r["resource"] == "container" for r in docker),
                "disk_mb": sum(r["disk_bytes"] or 0 for r in docker) / 2**20}


def start_daemon(tmp: Path, name: str, env: dict[str, str]) -> DaemonProcess:
    cfg = tmp / f"{name}.toml"
    cfg.write_text(CONFIG)
    d = DaemonProcess(data_dir=tmp / name, workers=1, extra_args=["--config", str(cfg)],
                      env={"AGENTD_LOG_LEVEL": "warning", **env})
    return d.start()


# -- (a) reclamation ---------------------------------------------------------------------

async def one_program(api: Api, program: str, release: bool) -> None:
    await api.chat(program, 20, 4)
    result = await api.exec(program, "box", f"dd if=/dev/zero of=blob bs=1M count={WRITE_MB}")
    if result["exit_code"] != 0:
        raise RuntimeError(f"{program}: write failed: {result}")
    if release:
        await api.release(program)


async def run_arm(api: Api, arm: str, n: int, concurrency: int, done: dict[str, int]) -> None:
    ids = iter(range(n))

    async def worker() -> None:
        for i in ids:
            await one_program(api, f"{arm}-{i:04d}", release=arm == "gc")
            done[arm] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def sample(apis: dict[str, Api], t0: float, done: dict[str, int],
                 timeline: list[dict[str, Any]]) -> None:
    for arm, api in apis.items():  # one `df` at a time: the engine serialises them
        held = await api.held()
        timeline.append({"t_s": time.monotonic() - t0, "arm": arm, "programs_done": done[arm],
                         **held})
    last = timeline[-len(apis):]
    log("  " + "   ".join(f"{r['arm']:>5}: {r['programs_done']:3d} done, "
                          f"{r['containers']:3d} containers, {r['disk_mb']:6.1f} MB"
                          for r in last))


async def wait_empty(api: Api, timeout: float = 300.0) -> float:
    t0 = time.monotonic()
    # the daemon's state, read over HTTP: polled, there is no event to wait on
    while (await api.held())["containers"] and time.monotonic() - t0 < timeout:  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    return time.monotonic() - t0


async def bench_gc(apis: dict[str, Api], n: int, concurrency: int) -> dict[str, Any]:
    done = dict.fromkeys(apis, 0)
    timeline: list[dict[str, Any]] = []
    t0 = time.monotonic()
    runs = asyncio.gather(*(run_arm(api, arm, n, concurrency, done)
                            for arm, api in apis.items()))
    while not runs.done():
        await sample(apis, t0, done, timeline)
        await asyncio.wait([runs], timeout=SAMPLE_S)
    await runs
    wall = time.monotonic() - t0
    await sample(apis, t0, done, timeline)
    after_run = {r["arm"]: r for r in timeline[-len(apis):]}
    drain_gc = await wait_empty(apis["gc"])
    log(f"  released no-gc's {n} programs at the end; waiting for the engine to empty")
    t_release = time.monotonic()
    await sample(apis, t0, done, timeline)
    await asyncio.gather(*(apis["no-gc"].release(f"no-gc-{i:04d}") for i in range(n)))
    drain_nogc = time.monotonic() - t_release + await wait_empty(apis["no-gc"])
    await sample(apis, t0, done, timeline)
    return {"wall_s": wall, "timeline": timeline, "after_run": after_run,
            "gc_empty_after_s": drain_gc, "nogc_released_at_s": t_release - t0,
            "nogc_release_all_to_empty_s": drain_nogc,
            "peak": {arm: max(r["containers"] for r in timeline if r["arm"] == arm)
                     for arm in apis}}


# -- (b) preparation ---------------------------------------------------------------------

async def wait_status(api: Api, programs: list[str], status: str, timeout: float = 10.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        states = [(await api.call("GET", f"/v1/programs/{p}"))["status"] for p in programs]
        if all(s == status for s in states):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{programs} not all {status} after {timeout}s: {states}")


async def waiter_step(api: Api, program: str) -> dict[str, Any]:
    t_queued = time.monotonic()
    await api.chat(program, 800, 2)
    t_back = time.monotonic()
    result = await api.exec(program, "slowenv", "cat ready")
    if result["stdout"] != "ready\n":
        raise RuntimeError(f"{program}: environment not set up: {result}")
    return {"program": program, "queue_and_step_s": t_back - t_queued,
            "first_tool_call_s": time.monotonic() - t_back, "exec_s": result["duration_s"]}


async def block_then_end(api: Api, blocker: str) -> None:
    """A long step that keeps the waiters paused; its end frees their room at once."""
    await api.chat(blocker, 3600, 600)
    await api.release(blocker)


async def prepare_round(api: Api, mode: str, index: int) -> list[dict[str, Any]]:
    waiters = [f"{mode}-{index}-w{k}" for k in range(WAITERS)]
    blocker = f"{mode}-{index}-blocker"
    await asyncio.gather(*(api.chat(w, 800, 2) for w in waiters))
    if mode == "declared":
        for w in waiters:
            await api.call("POST", f"/v1/programs/{w}/tools", json={"tools": ["slowenv"]})
    await api.chat(blocker, 3600, 2)
    await wait_status(api, waiters, "PAUSED")
    blocking = asyncio.ensure_future(block_then_end(api, blocker))
    rows = await asyncio.gather(*(waiter_step(api, w) for w in waiters))
    await blocking
    for w in waiters:
        await api.release(w)
    for row in rows:
        row |= {"mode": mode, "round": index, **await trace_numbers(api, row["program"])}
    return list(rows)


async def trace_numbers(api: Api, program: str) -> dict[str, Any]:
    events = (await api.call("GET", f"/v1/sessions/{program}/trace",
                             params={"limit": 1000}))["data"]
    prep = next(e for e in events if e["kind"] == "tool.prepare.end")
    restore = next((e for e in events if e["kind"] == "kv.restore"), None)
    exec_end = next(e for e in events if e["kind"] == "tool.exec.end")
    return {"prepare_s": prep["data"]["duration_s"], "exec_waited_s": exec_end["data"]["waited_s"],
            "prepared_before_restore": bool(restore and prep["ts"] < restore["ts"])}


async def bench_prepare(api: Api, rounds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for index in range(rounds):
        for mode in ("declared", "cold"):
            got = await prepare_round(api, mode, index)
            rows += got
            log(f"  round {index} {mode:8}: first tool call "
                + ", ".join(f"{r['first_tool_call_s']:.2f}s" for r in got)
                + f" (prepare {statistics.fmean(r['prepare_s'] for r in got):.2f}s, "
                f"queue+step {statistics.fmean(r['queue_and_step_s'] for r in got):.2f}s)")
    return rows


def summarize_prepare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Hidden share of setup = 1 - (declared wait / cold wait): a cold first call waits for
    the whole preparation (container start and setup steps), a declared one for what is left.
    From the daemon's trace (`waited_s`) and, as a cross-check, from the client's clock."""
    keys = ("first_tool_call_s", "client_wait_s", "exec_waited_s", "prepare_s",
            "queue_and_step_s")
    for r in rows:
        r["client_wait_s"] = r["first_tool_call_s"] - r["exec_s"]
    out: dict[str, Any] = {
        mode: {k: statistics.fmean(r[k] for r in rows if r["mode"] == mode) for k in keys}
        for mode in ("declared", "cold")}
    declared, cold = out["declared"], out["cold"]
    out["hidden_fraction"] = 1 - declared["exec_waited_s"] / cold["exec_waited_s"]
    out["hidden_fraction_client"] = 1 - declared["client_wait_s"] / cold["client_wait_s"]
    out["prepared_before_restore"] = sum(
        r["prepared_before_restore"] for r in rows if r["mode"] == "declared")
    out["declared_programs"] = sum(r["mode"] == "declared" for r in rows)
    return out


# -- running -----------------------------------------------------------------------------

def ensure_image() -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "make-busybox-image.sh"), IMAGE],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit("bench.tools needs a Docker engine (DOCKER_HOST; as root "
                         f"`eval $(scripts/start-dockerd.sh)`): {proc.stderr.strip()[-300:]}")


async def run(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "gc" in args.parts:
        out["gc"] = await run_gc(tmp, args.programs, args.concurrency)
    kv = {"AGENTD_SIM_KV_TOKENS": "4096", "AGENTD_KV_POLICY": "thunderagent"}
    d = start_daemon(tmp, "prepare", kv)
    try:
        api = Api(d)
        if "prepare" in args.parts:
            log(f"(b) {args.rounds} rounds x {WAITERS} waiters per mode, setup {SETUP_S:g} s")
            out["prepare_rows"] = await bench_prepare(api, args.rounds)
            out["prepare"] = summarize_prepare(out["prepare_rows"])
        if "sweep" in args.parts:
            log(f"(c) queue waits {args.waits} s x {args.sweep_reps}, setup {SETUP_S:g} s")
            out["sweep_rows"] = await tools_sweep.run_sweep(api, "slowenv", args.waits,
                                                            args.sweep_reps)
            out["sweep"] = tools_sweep.summarize(out["sweep_rows"])
    finally:
        d.stop()
    return out


async def run_gc(tmp: Path, programs: int, concurrency: int) -> dict[str, Any]:
    fast = {"AGENTD_SIM_TIME_SCALE": "0"}
    daemons = {arm: start_daemon(tmp, arm, fast) for arm in ("gc", "no-gc")}
    try:
        apis = {arm: Api(d) for arm, d in daemons.items()}
        log(f"(a) {programs} programs per arm, {concurrency} at a time per arm, "
            f"{WRITE_MB} MB each")
        return await bench_gc(apis, programs, concurrency)
    finally:
        for d in daemons.values():
            d.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--waits", type=_floats, default=[0.0, 0.5, 1.0, 2.0, 4.0],
                    help="queue waits of the partial-hiding sweep, seconds")
    ap.add_argument("--sweep-reps", type=int, default=2)
    ap.add_argument("--parts", type=_parts, default=list(PARTS),
                    help="comma-separated subset of gc,prepare,sweep")
    args = ap.parse_args(argv)
    ensure_image()
    with tempfile.TemporaryDirectory(prefix="agentd-bench-tools-") as tmp:
        out = asyncio.run(run(Path(tmp), args))
    params = {"programs": args.programs, "concurrency_per_arm": args.concurrency,
              "write_mb": WRITE_MB, "setup_s": SETUP_S, "waiters": WAITERS,
              "rounds": args.rounds, "waits": args.waits, "sweep_reps": args.sweep_reps,
              "parts": args.parts, "engine": "sim worker; real Docker engine, busybox image"}
    report(out)
    # A partial run goes to files of its own, so it never replaces the full results.
    name = "tools" if args.parts == list(PARTS) else "tools_" + "_".join(args.parts)
    path = save(name, params, [out])
    plot(out, RESULTS / f"{name}.png")
    log(f"wrote {path} and {RESULTS / f'{name}.png'}")
    return 0


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None


def _parts(text: str) -> list[str]:
    parts = text.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown parts {sorted(unknown)}; known: {PARTS}")
    return [p for p in PARTS if p in parts]


def report(out: dict[str, Any]) -> None:
    if "gc" in out:
        report_gc(out["gc"])
    if "prepare" in out:
        report_prepare(out["prepare"])
    if "sweep" in out:
        tools_sweep.report(out["sweep"])


def report_gc(gc: dict[str, Any]) -> None:
    for arm, row in gc["after_run"].items():
        log(f"{arm:>5}: peak {gc['peak'][arm]} containers; after the run "
            f"{row['containers']} containers, {row['disk_mb']:.1f} MB")
    log(f"gc empty {gc['gc_empty_after_s']:.1f}s after the run; no-gc release-all to empty "
        f"{gc['nogc_release_all_to_empty_s']:.1f}s")


def report_prepare(prep: dict[str, Any]) -> None:
    for mode in ("cold", "declared"):
        m = prep[mode]
        log(f"{mode:>8}: first tool call {m['first_tool_call_s']:.2f}s, waited "
            f"{m['exec_waited_s']:.2f}s, prepare {m['prepare_s']:.2f}s")
    log(f"setup hidden: {100 * prep['hidden_fraction']:.0f}% by the trace, "
        f"{100 * prep['hidden_fraction_client']:.0f}% by the client's clock (target >= 80%); "
        f"prepared before restore: {prep['prepared_before_restore']}/{prep['declared_programs']}")


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 * ("gc" in out) + ("prepare" in out) + ("sweep" in out)
    fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 4), squeeze=False)
    left = list(axes[0])
    if "gc" in out:
        plot_gc(left.pop(0), left.pop(0), out["gc"])
    if "prepare" in out:
        plot_prepare(left.pop(0), out["prepare"])
    if "sweep" in out:
        tools_sweep.plot(left.pop(0), out["sweep_rows"], out["sweep"])
    fig.suptitle("agentd tools: real Docker engine, sim workers")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gc(containers: Any, disk: Any, gc: dict[str, Any]) -> None:
    for arm in ("gc", "no-gc"):
        rows = [r for r in gc["timeline"] if r["arm"] == arm]
        containers.plot([r["t_s"] for r in rows], [r["containers"] for r in rows], "o-",
                        ms=3, label=arm)
        disk.plot([r["t_s"] for r in rows], [r["disk_mb"] for r in rows], "o-",
                  ms=3, label=arm)
    for ax in (containers, disk):
        ax.axvline(gc["nogc_released_at_s"], color="grey", ls=":",
                   label="no-gc programs released")
        ax.legend()
    containers.set(title="containers held", xlabel="s", ylabel="containers")
    disk.set(title="disk held (engine df)", xlabel="s", ylabel="MB")


def plot_prepare(ax: Any, prep: dict[str, Any]) -> None:
    modes = ["cold", "declared"]
    ax.bar(modes, [prep[m]["first_tool_call_s"] for m in modes], label="first tool call")
    ax.axhline(prep["cold"]["prepare_s"], color="red", ls="--", label="full prepare")
    ax.set(title=f"time to first tool call ({100 * prep['hidden_fraction']:.0f}% "
           f"of setup hidden)", ylabel="s")
    ax.legend()


if __name__ == "__main__":
    sys.exit(main())
