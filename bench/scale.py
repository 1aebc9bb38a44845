"""Control-plane scaling (issue 27 item 6): one daemon driving 8 to 64 sim workers.

For each worker count N: a real `agentd start` (SQLite store on, trace events written,
no local workers, the worker socket on TCP) and N separate `agentd worker --engine sim
--connect tcp://...` processes. Each worker runs one request at a time (`--max-batch 1`)
and models a fixed step (the `llama3-8b-h100` cost model at `--time-scale`), so a worker
is a resource of known capacity and N workers can serve N times one's rate: what the
benchmark measures is whether the daemon keeps up. The load generator is the gateway
benchmark's minimal keep-alive client (bench/gateway.py) in separate processes, closed
loop, OpenAI chat requests with `max_tokens` 1 through /v1/chat/completions.

Per N, one phase: `--per-worker` requests in flight per worker (2: one running, one
waiting), so the offered load grows with N; linearity = (req/s at N / N) / (req/s at the
first N / that N). Then a capacity run: `--capacity-workers` zero-cost workers (time scale
0, the engine's default batch) at each `--capacity-concurrency`: the most the daemon serves,
with py-spy sampling it in an extra phase at the highest concurrency (the top functions
by own and by inclusive share of the samples go into the JSON).

For each phase: requests/s, the daemon process's CPU time per request (utime + stime of
/proc/PID/stat over the phase, all its threads, divided by the requests completed in it),
its scheduling latency p50/p99 (the daemon's own `agentd_queue_time_seconds` histogram:
arrival at the core to dispatch, interpolated within its buckets, the delta over the
phase), the client's latency p50/p99, the load average; and the core count.

Run: python -m bench.scale [--workers 8,16,32,64] [--seconds 15] [--quick]
Writes bench/results/scale.json and scale.png.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import RESULTS, log
from bench.gateway import BODY, _read_response, _request_bytes
from console.client import metric_samples
from daemon.engines.sim.cost import load_cost_model
from tests.daemon_process import DaemonProcess, free_port

COST_MODEL = "llama3-8b-h100"
QUEUE_HISTOGRAM = "agentd_queue_time_seconds"
LIVE = ("QUEUED", "REASONING", "ACTING", "PAUSED")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the load generator (runs in its own processes) -------------------------------------


async def _client(port: int, token: str, start: float, end: float,
                  latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = _request_bytes(port, token)
    await asyncio.sleep(max(0.0, start - time.time()))
    while time.time() < end:
        t0 = time.perf_counter()
        writer.write(payload)
        status = await _read_response(reader)
        # Only answers that arrive inside the window count: the daemon's CPU is read
        # over the same window.
        if time.time() <= end:
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(status)
    writer.close()


def _load_process(port: int, token: str, connections: int, start: float, end: float,
                  out: Any) -> None:
    latencies: list[float] = []
    errors: list[int] = []

    async def run() -> None:
        await asyncio.gather(*(_client(port, token, start, end, latencies, errors)
                               for _ in range(connections)))

    asyncio.run(run())
    out.put({"latencies": latencies, "errors": errors, "cpu_s": time.process_time()})


def drive(port: int, token: str, concurrency: int, processes: int, seconds: float,
          on_window: Any = None) -> dict[str, Any]:
    """`concurrency` keep-alive connections over `processes` load processes for `seconds`
    of closed loop; `on_window(start, end)` runs in this process across the window (it
    reads the daemon's counters at both ends) and its result is returned with the load's."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    processes = max(1, min(processes, concurrency))
    start = time.time() + 1.0 + 0.2 * processes  # room for the processes to connect
    end = start + seconds
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    procs = [ctx.Process(target=_load_process, args=(port, token, n, start, end, queue))
             for n in shares]
    for p in procs:
        p.start()
    window = on_window(start, end) if on_window else None
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    latencies = sorted(x for r in results for x in r["latencies"])
    errors = [x for r in results for x in r["errors"]]
    n = len(latencies)
    return {
        "concurrency": concurrency, "load_processes": processes, "seconds": seconds,
        # the load generator's own CPU (its processes' whole lives, connecting included)
        "load_cpu_s": sum(r["cpu_s"] for r in results),
        "requests": n, "errors": len(errors), "requests_per_s": n / seconds,
        "client_p50_ms": 1000 * latencies[n // 2] if n else None,
        "client_p99_ms": 1000 * latencies[max(0, int(n * 0.99) - 1)] if n else None,
        "window": window,
    }


# --- what the daemon says about itself ----------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (proc(5) fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def queue_buckets(metrics_text: str) -> dict[float, float]:
    """The queue-time histogram's cumulative counts by upper bound, summed over workers."""
    out: dict[float, float] = collections.defaultdict(float)
    for name, labels, value in metric_samples(metrics_text):
        if name == f"{QUEUE_HISTOGRAM}_bucket":
            out[float(labels["le"])] += value
    return dict(out)


def histogram_quantile(before: dict[float, float], after: dict[float, float],
                       q: float) -> float | None:
    """The q-quantile of what a cumulative histogram gained between two scrapes, linear
    within the bucket it falls in (Prometheus's histogram_quantile); None when empty."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            share = (rank - prev_count) / (count - prev_count) if count > prev_count else 1.0
            return prev_bound + (bound - prev_bound) * share
        prev_bound, prev_count = bound, count
    return prev_bound


class Window:
    """Reads the daemon's CPU time and queue histogram at the start and end of a phase."""

    def __init__(self, d: DaemonProcess, worker_pids: list[int]) -> None:
        self.d = d
        self.worker_pids = worker_pids
        self.client = httpx.Client(base_url=d.url, headers=d.auth_headers(), timeout=30)

    def scrape(self) -> tuple[dict[float, float], float]:
        """The queue-time buckets, and the live programs (every status but stopped and
        failed): what the KV policy walks for each request it routes."""
        text = self.client.get("/metrics").text
        live = sum(v for name, labels, v in metric_samples(text)
                   if name == "agentd_programs" and labels.get("status") in LIVE)
        return queue_buckets(text), live

    def __call__(self, start: float, end: float) -> dict[str, Any]:
        assert self.d.proc is not None
        pid = self.d.proc.pid
        time.sleep(max(0.0, start - time.time()))
        cpu0, (hist0, live0), load0 = cpu_seconds(pid), self.scrape(), os.getloadavg()
        workers0 = sum(cpu_seconds(w) for w in self.worker_pids)
        time.sleep(max(0.0, end - time.time()))
        cpu1, (hist1, live1), load1 = cpu_seconds(pid), self.scrape(), os.getloadavg()
        workers1 = sum(cpu_seconds(w) for w in self.worker_pids)
        return {
            "daemon_cpu_s": cpu1 - cpu0, "workers_cpu_s": workers1 - workers0,
            "dispatched": hist1.get(float("inf"), 0.0) - hist0.get(float("inf"), 0.0),
            "sched_p50_ms": _ms(histogram_quantile(hist0, hist1, 0.5)),
            "sched_p99_ms": _ms(histogram_quantile(hist0, hist1, 0.99)),
            "loadavg_1m_start": load0[0], "loadavg_1m_end": load1[0],
            "live_programs_start": live0, "live_programs_end": live1,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


# --- workers and the daemon -----------------------------------------------------------------


class Fleet:
    """A daemon with no local workers and N `agentd worker --connect tcp://` processes."""

    def __init__(self, root: Path, workers: int, time_scale: float,
                 max_batch: int | None, env: dict[str, str] | None = None) -> None:
        self.workers = workers
        self.time_scale = time_scale
        self.max_batch = max_batch
        self.worker_port = free_port()
        self.d = DaemonProcess(
            data_dir=root / "data", workers=0,
            env={"AGENTD_LOG_LEVEL": "warning",
                 "AGENTD_WORKER_BIND": f"tcp://127.0.0.1:{self.worker_port}",
                 # 64 workers starting on 2 busy cores miss the tests' 1.5 s heartbeat
                 # timeout; the daemon's defaults, as a deployment runs them.
                 "AGENTD_HEARTBEAT_INTERVAL_S": "0.5", "AGENTD_HEARTBEAT_TIMEOUT_S": "3",
                 **(env or {})})
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_dir = root / "workers"

    def start(self) -> None:
        self.d.start(wait_workers=0, timeout=120)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        assert self.d.config_dir is not None
        env = {**self.d.process_env(), "PYTHONUNBUFFERED": "1"}
        for i in range(self.workers):
            cmd = [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim",
                   "--connect", f"tcp://127.0.0.1:{self.worker_port}",
                   "--worker-id", f"scale-{i}", "--key-file",
                   str(self.d.config_dir / "worker.key"),
                   "--time-scale", str(self.time_scale), "--cost-model", COST_MODEL,
                   "--log-level", "warning"]
            if self.max_batch is not None:
                cmd += ["--max-batch", str(self.max_batch)]
            with open(self.log_dir / f"worker-{i}.log", "wb") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                   env=env, start_new_session=True))
        self.d.wait_ready(self.workers, timeout=60 + 4 * self.workers)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.d.stop()


def modelled_step_s(time_scale: float) -> float:
    """One worker's step for one `ping` chat request (a few prompt tokens, one output
    token), as its sim engine sleeps it: the cost model's fixed part dominates."""
    cost = load_cost_model(COST_MODEL)
    return cost.step_time(prefill_tokens=16, decode_seqs=0, context_tokens=16) * time_scale


# --- py-spy ---------------------------------------------------------------------------------


def profile(pid: int, seconds: float, out: Path, top: int) -> dict[str, Any]:
    """py-spy samples of the daemon for `seconds`; the top functions by own and by
    inclusive share of the samples (idle frames are left in: they say how busy it is)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = out.with_suffix(".txt")
    subprocess.run([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                    "--rate", "250", "--format", "raw", "--output", str(raw), "--nonblocking"],
                   check=True, capture_output=True, timeout=seconds + 60)
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    return {
        "samples": total, "rate_hz": 250, "seconds": seconds, "raw": raw.name,
        "top_own": [{"function": f, "share": n / total} for f, n in own.most_common(top)],
        "top_inclusive": [{"function": f, "share": n / total}
                          for f, n in inclusive.most_common(top)],
    }


def _frame(frame: str) -> str:
    """`func (path/to/module.py:123)` -> `func (module/path.py)`: one row per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})"


# --- the benchmark ----------------------------------------------------------------------------


def measure(d: DaemonProcess, window: Window, concurrency: int, args: argparse.Namespace,
            label: str) -> dict[str, Any]:
    r = drive(d.port, d.token, concurrency, args.load_processes, args.seconds, window)
    w = r.pop("window")
    r.update(w)
    r["cpu_ms_per_request"] = 1000 * w["daemon_cpu_s"] / r["requests"] if r["requests"] else None
    r["daemon_cores_used"] = w["daemon_cpu_s"] / args.seconds
    log(f"{label} c={concurrency:<4}: {r['requests_per_s']:7.0f} req/s  "
        f"daemon {_fmt(r['cpu_ms_per_request'], 3)} ms CPU/req "
        f"({r['daemon_cores_used']:.2f} cores; workers {w['workers_cpu_s'] / args.seconds:.2f}, "
        f"load {r['load_cpu_s'] / args.seconds:.2f})  sched p50 {_fmt(r['sched_p50_ms'])} "
        f"p99 {_fmt(r['sched_p99_ms'])} ms  client p50 {_fmt(r['client_p50_ms'])} "
        f"p99 {_fmt(r['client_p99_ms'])} ms  errors {r['errors']}  "
        f"live programs {r['live_programs_end']:.0f}  load {r['loadavg_1m_end']:.1f}")
    return r


@contextlib.contextmanager
def fleet_up(root: Path, n: int, time_scale: float, max_batch: int | None,
             env: dict[str, str] | None = None) -> Any:
    fleet = Fleet(root, n, time_scale, max_batch, env)
    t0 = time.perf_counter()
    try:
        fleet.start()
        log(f"{n} workers: ready in {time.perf_counter() - t0:.0f} s")
        warm = fleet.d.post("/v1/chat/completions", content=BODY)
        if warm.status_code != 200:
            raise SystemExit(f"bench.scale: warm-up request failed: {warm.text}")
        drive(fleet.d.port, fleet.d.token, 2 * n, 1, 2.0)  # warm-up
        yield fleet
    finally:
        fleet.stop()


def paced_point(root: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    with fleet_up(root / f"n{n}", n, args.time_scale, 1) as fleet:
        window = Window(fleet.d, [p.pid for p in fleet.procs])
        point = {"workers": n, **measure(fleet.d, window, n * args.per_worker, args,
                                         f"{n:>3} workers paced")}
        point.update(idle(fleet, args.idle_seconds))
        if point["requests"]:
            busy = point["daemon_cpu_s"] - point["daemon_idle_cores"] * args.seconds
            point["cpu_ms_per_request_net_of_idle"] = 1000 * busy / point["requests"]
        log(f"{n:>3} workers idle: daemon {point['daemon_idle_cores']:.3f} cores, workers "
            f"{point['workers_idle_cores']:.3f} cores (heartbeats, KV and SLO ticks)")
        if n in args.profile_paced:
            point["profile"] = profiled_phase(fleet.d, n * args.per_worker, args,
                                              f"scale-profile-paced-{n}")
        return point


def idle(fleet: Fleet, seconds: float) -> dict[str, float]:
    """What the daemon and the workers burn with no request (heartbeats, the KV and SLO
    loops over the programs left live): the part of a phase's CPU that is not per request."""
    assert fleet.d.proc is not None
    pids = [p.pid for p in fleet.procs]
    d0, w0 = cpu_seconds(fleet.d.proc.pid), sum(cpu_seconds(p) for p in pids)
    time.sleep(seconds)
    d1, w1 = cpu_seconds(fleet.d.proc.pid), sum(cpu_seconds(p) for p in pids)
    return {"daemon_idle_cores": (d1 - d0) / seconds, "workers_idle_cores": (w1 - w0) / seconds}


def profiled_phase(d: DaemonProcess, concurrency: int, args: argparse.Namespace,
                   name: str) -> dict[str, Any]:
    """One more phase like the last, with py-spy sampling the daemon (its ptrace stops
    slow the daemon down, so the measured phases are never the sampled ones)."""
    assert d.proc is not None
    pid = d.proc.pid
    holder: dict[str, Any] = {}

    def sample(start: float, end: float) -> None:
        time.sleep(max(0.0, start - time.time()))
        holder.update(profile(pid, end - start - 0.5, RESULTS / name, args.top))

    r = drive(d.port, d.token, concurrency, args.load_processes, args.seconds, sample)
    log(f"profiled {holder['samples']} samples at c={concurrency}")
    return {"concurrency": concurrency, "requests_per_s_while_sampled": r["requests_per_s"],
            **holder}


def capacity(root: Path, args: argparse.Namespace, lineage: bool) -> dict[str, Any]:
    """`lineage` False: the daemon with lineage_inference off, so a request without a
    program_id ends its program at once instead of holding it for lineage_idle_s: what a
    request costs without the live programs the KV policy walks for each one."""
    n = args.capacity_workers
    env = {} if lineage else {"AGENTD_LINEAGE_INFERENCE": "false"}
    label = f"capacity, {n} zero-cost workers, lineage {'on' if lineage else 'off'}"
    with fleet_up(root / f"capacity-{lineage}", n, 0.0, None, env) as fleet:
        d = fleet.d
        window = Window(d, [p.pid for p in fleet.procs])
        runs = [measure(d, window, c, args, label)
                for c in (int(x) for x in args.capacity_concurrency.split(","))]
        out: dict[str, Any] = {"workers": n, "engine": "sim, time scale 0",
                               "lineage_inference": lineage, "runs": runs}
        if lineage and not args.no_profile:
            out["profile"] = profiled_phase(d, runs[-1]["concurrency"], args, "scale-profile")
        return out


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="8,16,32,64")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    ap.add_argument("--time-scale", type=float, default=8.0,
                    help="paced workers' sim time scale (a step of the cost model times this)")
    ap.add_argument("--per-worker", type=int, default=2,
                    help="paced phase: requests in flight per worker")
    ap.add_argument("--capacity-workers", type=int, default=8)
    ap.add_argument("--capacity-concurrency", default="16,64")
    ap.add_argument("--load-processes", type=int, default=2)
    ap.add_argument("--idle-seconds", type=float, default=5.0,
                    help="after each paced phase: the daemon's and workers' CPU with no load")
    ap.add_argument("--no-profile", action="store_true", help="no py-spy in the capacity run")
    ap.add_argument("--profile-paced", default="",
                    help="worker counts whose paced point gets a py-spy phase too (e.g. 64)")
    ap.add_argument("--no-capacity", action="store_true")
    ap.add_argument("--no-paced", action="store_true", help="the capacity run only")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--quick", action="store_true", help="8 and 16 workers, 5 s phases")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.seconds = "8,16", 5.0
    counts = [int(x) for x in args.workers.split(",")]
    args.profile_paced = {int(x) for x in args.profile_paced.split(",") if x}
    RESULTS.mkdir(parents=True, exist_ok=True)
    step = modelled_step_s(args.time_scale)
    log(f"bench.scale: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
        f"a paced worker's modelled step {1000 * step:.1f} ms, so it serves at most "
        f"{1 / step:.0f} req/s")
    points = []
    cap = cap_off = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in [] if args.no_paced else counts:
            points.append(paced_point(Path(tmp), n, args))
        if not args.no_capacity:
            cap = capacity(Path(tmp), args, lineage=True)
            cap_off = capacity(Path(tmp), args, lineage=False)
    base = points[0]["requests_per_s"] / points[0]["workers"] if points else 0.0
    for p in points:
        p["linearity"] = p["requests_per_s"] / p["workers"] / base
        p["worker_bound_req_s"] = p["workers"] / step
    out = {
        "benchmark": "scale",
        "command": "python -m bench.scale " + " ".join(sys.argv[1:] if argv is None else argv),
        "paced_engine": f"sim ({COST_MODEL} x {args.time_scale}, max_batch 1 per worker)",
        "persistence": "sqlite (WAL), batched writer",
        "worker_transport": "tcp (CurveZMQ)",
        "machine_cores": os.cpu_count(), "modelled_step_ms": 1000 * step,
        "params": {k: getattr(args, k) for k in
                   ("workers", "seconds", "time_scale", "per_worker", "capacity_workers",
                    "capacity_concurrency", "load_processes", "idle_seconds")},
        "note": "one machine: the daemon, every worker process and the load generator share "
                f"its {os.cpu_count()} cores (and other people's work: see each phase's load "
                "average). Linearity is each count's req/s per worker over the first count's; "
                "scheduling latency is the daemon's agentd_queue_time_seconds (arrival at the "
                "core to dispatch) interpolated in its buckets.",
        "targets": {"linearity_to_32": 0.9, "requests_per_s": 2000},
        "points": points, "capacity": cap, "capacity_lineage_off": cap_off,
    }
    # A partial run (--no-paced, --no-capacity) keeps the full run's files.
    name = "scale" if points and cap else "scale-partial"
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    if points:
        _plot(points, cap, RESULTS / f"{name}.png", step)
    for p in points:
        log(f"{p['workers']:>3} workers: {p['requests_per_s']:7.0f} req/s (bound "
            f"{p['worker_bound_req_s']:.0f}), linearity {p['linearity']:.2f}, "
            f"{_fmt(p['cpu_ms_per_request'], 3)} ms CPU/req "
            f"({_fmt(p.get('cpu_ms_per_request_net_of_idle'), 3)} net of idle), sched p50/p99 "
            f"{_fmt(p['sched_p50_ms'])}/{_fmt(p['sched_p99_ms'])} ms")
    log(f"wrote {path}")
    return 0


def _plot(points: list[dict[str, Any]], cap: dict[str, Any] | None, path: Path,
          step: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [p["workers"] for p in points]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.8))
    base = points[0]["requests_per_s"] / ns[0]
    a.plot(ns, [p["requests_per_s"] for p in points], "o-", label="measured")
    a.plot(ns, [base * n for n in ns], "k:", label=f"linear from {ns[0]}")
    a.plot(ns, [n / step for n in ns], "g--", label="workers' bound")
    if cap:
        best = max(r["requests_per_s"] for r in cap["runs"])
        a.axhline(best, color="orange", label=f"capacity ({cap['workers']} zero-cost)")
    a.axhline(2000, color="red", linestyle="--", label="target 2000")
    b.plot(ns, [p["cpu_ms_per_request"] for p in points], "o-")
    c.plot(ns, [p["sched_p50_ms"] for p in points], "o-", label="p50")
    c.plot(ns, [p["sched_p99_ms"] for p in points], "o--", label="p99")
    a.set(title="throughput", ylabel="requests/s")
    b.set(title="daemon CPU per request", ylabel="ms")
    c.set(title="scheduling latency (arrival→dispatch)", ylabel="ms", yscale="log")
    for ax in (a, b, c):
        ax.set(xlabel="workers", xscale="log", xticks=ns)
        ax.set_xticklabels([str(n) for n in ns])
    a.legend(fontsize=7)
    c.legend(fontsize=8)
    fig.suptitle(f"agentd control plane: one daemon, N sim workers "
                 f"({1000 * step:.0f} ms/request each), SQLite on, {os.cpu_count()} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
