"""What CurveZMQ costs on the worker socket: messages/s through the real Broker, with and
without encryption, over ipc and tcp.

Two shapes, each against a worker process (a plain DEALER, so only the socket is timed):
- stream: the worker sends token deltas as fast as it can; the broker's handler counts
  them (the daemon's hottest path: one frame per generated token);
- round trip: the broker sends a Submit with a ~1 KB prompt, the worker answers a
  Finish, one at a time (per-request latency of the socket).

    .venv/bin/python -m bench.worker_curve [--deltas 50000] [--trips 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench.common import RESULTS, log, save
from daemon.workers import curve as worker_curve
from daemon.workers import protocol
from daemon.workers.broker import Broker

KEY = "agw_bench-key-not-secret"
PROMPT = "You are a careful agent. " * 40  # ~1 KB


def _worker(endpoint: str, encrypted: bool, deltas: int, trips: int) -> None:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)  # type: ignore[type-arg]
    sock.setsockopt(zmq.LINGER, 0)
    if encrypted:
        worker_curve.make_client(sock, KEY)
    sock.connect(endpoint)
    # Registered first: the broker passes on only what a registered connection sends.
    sock.send(protocol.encode(protocol.Register(
        worker_id="", engine="sim", model="bench", kv_capacity_tokens=1, block_size=16,
        max_batch=1, schema_hash=protocol.SCHEMA_HASH)))
    protocol.decode_from_daemon(sock.recv())
    delta = protocol.encode(protocol.TokenDelta(request_id="r-1", text=" tok", num_tokens=1))
    for _ in range(deltas):
        sock.send(delta)
    finish = protocol.encode(protocol.Finish(request_id="r-1", reason="stop", prompt_tokens=1,
                                             cached_tokens=0, output_tokens=1))
    sock.send(finish)  # end of the stream
    for _ in range(trips):
        protocol.decode_from_daemon(sock.recv())
        sock.send(finish)
    sock.recv()  # the broker's go-ahead to exit: nothing is still in flight


async def _one(transport: str, encrypted: bool, deltas: int, trips: int, tmp: Path
               ) -> dict[str, Any]:
    got: asyncio.Queue[tuple[bytes, protocol.WorkerMessage]] = asyncio.Queue()
    count = 0
    first = last = 0.0
    cpu = [0.0, 0.0]  # the event loop thread's CPU time over the stream
    stream_done = asyncio.Event()

    def on_message(identity: bytes, msg: protocol.WorkerMessage) -> None:
        nonlocal count, first, last
        if isinstance(msg, protocol.Register):
            broker.send(identity, protocol.RegisterAck(accepted=True))
            return
        if not stream_done.is_set():
            if isinstance(msg, protocol.Finish):
                last = time.perf_counter()
                cpu[1] = time.thread_time()
                stream_done.set()
                got.put_nowait((identity, msg))
            else:
                count += 1
                if count == 1:
                    first = time.perf_counter()
                    cpu[0] = time.thread_time()
            return
        got.put_nowait((identity, msg))

    endpoint = f"ipc://{tmp / 'w.sock'}" if transport == "ipc" else "tcp://127.0.0.1:0"
    broker = Broker(endpoint, on_message)
    if encrypted:
        broker.use_worker_key(KEY, encrypt_ipc=True)
    broker.start()
    proc = mp.get_context("spawn").Process(
        target=_worker, args=(broker.endpoint, encrypted, deltas, trips))
    proc.start()
    try:
        await asyncio.wait_for(stream_done.wait(), 300)
        identity, _ = await got.get()
        submit = protocol.Submit(request_id="r-2", program_id="p", prompt=PROMPT)
        t0 = time.perf_counter()
        for _ in range(trips):
            broker.send(identity, submit)
            await got.get()
        trip_s = time.perf_counter() - t0
        broker.send(identity, protocol.Shutdown())
    finally:
        await asyncio.to_thread(proc.join, 30)
        await broker.stop()
    return {"transport": transport, "encrypted": encrypted,
            "deltas_per_s": (count - 1) / (last - first) if last > first else 0.0,
            "round_trips_per_s": trips / trip_s,
            # Curve runs on libzmq's I/O thread: what the daemon's loop pays per delta.
            "loop_cpu_us_per_delta": 1e6 * (cpu[1] - cpu[0]) / max(1, count - 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltas", type=int, default=50_000)
    ap.add_argument("--trips", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    configs = [(t, e) for t in ("ipc", "tcp") for e in (False, True)]
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        # Interleaved, so load from other processes drifting over minutes hits all alike.
        for _ in range(args.repeats):
            for transport, encrypted in configs:
                runs[transport, encrypted].append(asyncio.run(
                    _one(transport, encrypted, args.deltas, args.trips, Path(tmp))))
    rows: list[dict[str, Any]] = []
    for (transport, encrypted), mine in runs.items():
        row = {"transport": transport, "encrypted": encrypted,
               **{k: statistics.median(r[k] for r in mine)
                  for k in ("deltas_per_s", "round_trips_per_s", "loop_cpu_us_per_delta")},
               "runs": mine}
        log(f"{transport:3} curve={encrypted!s:5}  deltas/s {row['deltas_per_s']:9.0f}"
            f"  round trips/s {row['round_trips_per_s']:7.0f}"
            f"  loop CPU/delta {row['loop_cpu_us_per_delta']:5.1f} us")
        rows.append(row)
    save("worker_curve", vars(args), rows)
    _plot(rows, RESULTS / "worker_curve.png")
    return 0


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    labels = [f"{r['transport']}\n{'curve' if r['encrypted'] else 'plain'}" for r in rows]
    for ax, key, title in ((axes[0], "deltas_per_s", "token deltas / s (stream)"),
                           (axes[1], "round_trips_per_s", "Submit→Finish round trips / s")):
        ax.bar(labels, [r[key] for r in rows],
               color=["tab:blue" if not r["encrypted"] else "tab:orange" for r in rows])
        ax.set_title(title, fontsize=9)
    fig.suptitle("worker socket through the Broker: CurveZMQ vs plain (median of runs)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
