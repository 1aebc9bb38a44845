"""Where the daemon's memory goes under the soak's load: tracemalloc growth by the
innermost agentd source line, against RSS growth, between two marks.

The daemon runs with bench/memprobe_site on its PYTHONPATH (its sitecustomize starts
tracemalloc and dumps on SIGUSR2; see there) under bench/soak.py's load: gateway programs,
workflow runs, a worker killed every few minutes. At each mark the probe signals the
daemon; the report compares the first and the last mark:
- traced growth (what Python objects account for) against RSS growth and glibc's
  in-use bytes: when the traced growth explains little of RSS, look at the allocator;
- growth by allocation site, attributed to the innermost frame in this repository (a
  library's line when no agentd frame is on the stack);
- object counts by type and summed sizes of agentd objects' container attributes.
tracemalloc slows the daemon and more than doubles its RSS: read slopes from bench/soak.py.

Run: python -m bench.memprobe [--minutes 10] [--marks 120,600] [--out memprobe]
Writes bench/results/<out>.json and <out>.png; the snapshots stay in a temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench import soak
from bench.common import RESULTS, log, save
from tests.daemon_process import DaemonProcess

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent / "memprobe_site"


async def _marked(d: DaemonProcess, args: argparse.Namespace, marks: list[float],
                  probe: Path) -> soak.Tally:
    assert d.proc is not None
    load = asyncio.create_task(soak._soak(d, args))
    t0 = time.time()
    for n, at in enumerate(marks, 1):
        await asyncio.sleep(max(0.0, t0 + at - time.time()))
        os.kill(d.proc.pid, signal.SIGUSR2)
        # the daemon writes the mark's file: another process, nothing here to wait on
        while not (probe / f"{n}.json").exists() and not load.done():  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        log(f"[{time.time() - t0:6.0f}s] mark {n}: rss {soak._rss_mib(d.proc.pid):.0f} MiB")
    return await load


def _site(frames: tracemalloc.Traceback) -> str:
    ours = [f for f in frames if f.filename.startswith(str(ROOT))
            and "/.venv/" not in f.filename and not f.filename.endswith("daemon/commands/cli.py")]
    frame = ours[-1] if ours else frames[-1]  # frames run oldest first
    name = frame.filename.removeprefix(str(ROOT) + "/").split("site-packages/")[-1]
    return f"{name}:{frame.lineno}"


def _by_site(snapshot: tracemalloc.Snapshot) -> tuple[collections.Counter[str],
                                                      collections.Counter[str]]:
    size: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for trace in snapshot.traces:
        key = _site(trace.traceback)
        size[key] += trace.size
        count[key] += 1
    return size, count


def _diff(before: dict[str, int], after: dict[str, int], top: int) -> list[dict[str, Any]]:
    keys = sorted(set(before) | set(after), key=lambda k: before.get(k, 0) - after.get(k, 0))
    return [{"key": k, "before": before.get(k, 0), "after": after.get(k, 0),
             "growth": after.get(k, 0) - before.get(k, 0)} for k in keys[:top]]


def report(probe: Path, first: int, last: int, top: int = 25) -> dict[str, Any]:
    a, b = (json.loads((probe / f"{n}.json").read_text()) for n in (first, last))
    minutes = (b["t"] - a["t"]) / 60
    sa, sb = (tracemalloc.Snapshot.load(str(probe / f"{n}.snap")) for n in (first, last))
    (size_a, count_a), (size_b, count_b) = _by_site(sa), _by_site(sb)
    sites = _diff(dict(size_a), dict(size_b), top)
    for row in sites:
        row["allocations"] = count_b.get(row["key"], 0) - count_a.get(row["key"], 0)
    mib = 2.0 ** -20
    return {
        "minutes": minutes,
        "traced_growth_mib": (b["traced_bytes"] - a["traced_bytes"]) * mib,
        "rss_growth_mib": (b["rss_kib"] - a["rss_kib"]) / 1024,
        "malloc_in_use_growth_mib": (b["mallinfo"].get("uordblks", 0)
                                     - a["mallinfo"].get("uordblks", 0)) * mib,
        "malloc_arena_growth_mib": (b["mallinfo"].get("arena", 0)
                                    - a["mallinfo"].get("arena", 0)) * mib,
        "sites": sites,
        "types": _diff(a["counts"], b["counts"], top),
        "containers": _diff(a["sizes"], b["sizes"], top),
    }


def _plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    sites = result["report"]["sites"][:15][::-1]
    fig, ax = plt.subplots(figsize=(11, 6))
    ax.barh([s["key"][-60:] for s in sites], [s["growth"] / 1024 for s in sites])
    r = result["report"]
    ax.set_xlabel(f"traced growth over {r['minutes']:.1f} min (KiB)")
    ax.set_title(f"daemon memory growth by allocation site (traced "
                 f"{r['traced_growth_mib']:.2f} MiB, RSS {r['rss_growth_mib']:.2f} MiB)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--marks", default="120,570", help="seconds into the load")
    parser.add_argument("--kill-every", type=float, default=180.0, help="seconds")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8, help="concurrent gateway clients")
    parser.add_argument("--run-every", type=float, default=3.0, help="seconds between runs")
    parser.add_argument("--frames", type=int, default=15, help="traceback depth")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="memprobe")
    args = parser.parse_args()
    marks = sorted(float(m) for m in args.marks.split(","))
    if len(marks) < 2 or marks[-1] >= args.minutes * 60:
        parser.error("--marks: two or more, all before the end of --minutes")
    work = Path(tempfile.mkdtemp(prefix="agentd-memprobe-"))
    probe = work / "probe"
    probe.mkdir()
    env = {"AGENTD_HEARTBEAT_INTERVAL_S": "0.5", "AGENTD_HEARTBEAT_TIMEOUT_S": "3.0",
           "AGENTD_MEMPROBE_DIR": str(probe), "AGENTD_MEMPROBE_FRAMES": str(args.frames),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    d = DaemonProcess(work / "data", workers=args.workers, env=env)
    d.start(timeout=180)  # tracemalloc slows the imports
    try:
        tally = asyncio.run(_marked(d, args, marks, probe))
    finally:
        d.stop()
    done = sorted(int(p.stem) for p in probe.glob("*.json"))
    if len(done) < 2:
        raise SystemExit(f"memprobe: {len(done)} mark(s) written; see {d.log_path}")
    r = report(probe, done[0], done[-1], args.top)
    result = {"params": vars(args), "report": r,
              "requests": len(tally.calls), "ok": sum(c.ok for c in tally.calls),
              "runs": len(tally.runs), "snapshots": str(probe), "simulated": True}
    path = save(args.out, vars(args), [result])
    _plot(result, RESULTS / f"{args.out}.png")
    log(f"over {r['minutes']:.1f} min: traced +{r['traced_growth_mib']:.2f} MiB, RSS "
        f"+{r['rss_growth_mib']:.2f} MiB, malloc in use +{r['malloc_in_use_growth_mib']:.2f} MiB")
    for row in r["sites"][:15]:
        log(f"  {row['growth'] / 1024:9.1f} KiB {row['allocations']:+7d}  {row['key']}")
    log(f"wrote {path} and {RESULTS / (args.out + '.png')}")


if __name__ == "__main__":
    main()
