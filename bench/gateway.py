"""Gateway benchmark: requests/s and added latency through agentd to sim workers.

A real daemon (SQLite persistence on, trace events written) with two sim workers
whose modelled step time is scaled to zero, so what is measured is agentd's own
cost: HTTP parsing, scheduling, the ZeroMQ round trip, the worker process and the
store. The load generator is a minimal keep-alive HTTP/1.1 client on asyncio
streams (an HTTP library would cost more CPU than the server on this machine).

Run: python -m bench.gateway [--requests N] [--concurrency C]
Writes bench/results/gateway.json and gateway.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from console.client import metric_sums
from tests.daemon_process import DaemonProcess

RESULTS = Path(__file__).parent / "results"
BODY = json.dumps({
    "model": "sim-llama3-8b", "max_tokens": 1,
    "messages": [{"role": "user", "content": "ping"}],
}).encode()


def _request_bytes(port: int, token: str) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def _client(port: int, token: str, n: int, latencies: list[float],
                  errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = _request_bytes(port, token)
    for _ in range(n):
        t0 = time.perf_counter()
        writer.write(payload)
        status = await _read_response(reader)
        latencies.append(time.perf_counter() - t0)
        if status != 200:
            errors.append(status)
    writer.close()


async def _load(port: int, token: str, requests: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[int] = []
    per_client = max(1, requests // concurrency)
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(port, token, per_client, latencies, errors)
                           for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {
        "concurrency": concurrency, "requests": len(lat), "errors": len(errors),
        "wall_s": wall, "requests_per_s": len(lat) / wall,
        "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1],
        "mean_ms": 1000 * statistics.fmean(lat),
    }


def _events_written(d: DaemonProcess) -> float:
    return metric_sums(d.get("/metrics").text).get("agentd_trace_events_written_total", 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--concurrency", default="1,16,64")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(data_dir=Path(tmp) / "data", workers=2,
                          env={"AGENTD_SIM_TIME_SCALE": "0", "AGENTD_LOG_LEVEL": "warning"})
        d.start()
        try:
            warm = d.post("/v1/chat/completions", content=BODY)
            if warm.status_code != 200:
                raise SystemExit(f"bench.gateway: warm-up request failed: {warm.text}")
            runs = []
            for c in (int(x) for x in args.concurrency.split(",")):
                n = args.requests if c > 1 else min(args.requests, 1000)
                ev0, t0 = _events_written(d), time.perf_counter()
                run = asyncio.run(_load(d.port, d.token, n, c))
                d.get("/v1/programs", params={"limit": 1})  # forces a flush of the store
                run["trace_events_per_s"] = (_events_written(d) - ev0) / (time.perf_counter() - t0)
                runs.append(run)
                print(f"concurrency {c:>3}: {run['requests_per_s']:7.0f} req/s  "
                      f"p50 {run['p50_ms']:.2f} ms  p99 {run['p99_ms']:.2f} ms  "
                      f"{run['trace_events_per_s']:.0f} trace events/s  errors {run['errors']}",
                      file=sys.stderr)
        finally:
            d.stop()
    out = {
        "benchmark": "gateway", "engine": "sim (step time scaled to 0)", "workers": 2,
        "persistence": "sqlite (WAL), batched writer", "machine_cores": _cores(),
        "note": "latency is the whole request round trip with a zero-cost engine, so it is "
                "all agentd overhead plus the load generator's own share of the 2 cores",
        "targets": {"requests_per_s": 2000, "p50_added_ms": 2.0},
        "runs": runs,
    }
    (RESULTS / "gateway.json").write_text(json.dumps(out, indent=2))
    _plot(runs, RESULTS / "gateway.png")
    print(f"wrote {RESULTS / 'gateway.json'}", file=sys.stderr)
    return 0


def _cores() -> int:
    import os

    return os.cpu_count() or 0


def _plot(runs: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [str(int(r["concurrency"])) for r in runs]
    a.bar(xs, [r["requests_per_s"] for r in runs])
    a.axhline(2000, color="red", linestyle="--", label="target 2000")
    a.set(title="throughput", xlabel="concurrency", ylabel="requests/s")
    a.legend()
    b.bar(xs, [r["p50_ms"] for r in runs], label="p50")
    b.bar(xs, [r["p99_ms"] - r["p50_ms"] for r in runs], bottom=[r["p50_ms"] for r in runs],
          label="p99")
    b.set(title="latency per request", xlabel="concurrency", ylabel="ms")
    b.legend()
    fig.suptitle("agentd gateway → 2 sim workers (zero-cost engine), SQLite on")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
